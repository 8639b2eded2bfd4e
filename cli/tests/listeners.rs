//! The console and the relay's metrics listener, asked over raw TCP on 127.0.0.1: they answer
//! only the hosts they serve (a page that rebinds its name to 127.0.0.1 reads and does
//! nothing), refuse another site's requests, reads included, bound a request's headers, body
//! and read time, and print no password, whatever form the database URL takes.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{fresh_database, migrate, url, wait_until, BINARY};

/// An `outbox` process whose standard output and error are collected as it runs; stopped with
/// SIGTERM when dropped.
struct Serving {
    child: Child,
    said: Arc<Mutex<String>>,
}

impl Serving {
    fn start(args: &[&str]) -> Serving {
        let mut child = Command::new(BINARY).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start outbox");
        let said = Arc::new(Mutex::new(String::new()));
        for mut stream in [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())] {
            let said = said.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(read @ 1..) = stream.read(&mut chunk) {
                    said.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..read]));
                }
            });
        }
        Serving { child, said }
    }

    /// A console on a port of its own; returns it and the address it serves.
    fn console(database_url: &str, extra: &[&str]) -> (Serving, String) {
        let mut args = vec!["console", "--database-url", database_url, "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let console = Serving::start(&args);
        console.wait_for("serving http://", Duration::from_secs(20));
        let said = console.said();
        let address = said.split("serving http://").nth(1).and_then(|rest| rest.split('/').next()).expect("an address").to_string();
        (console, address)
    }

    fn said(&self) -> String {
        self.said.lock().unwrap().clone()
    }

    fn wait_for(&self, text: &str, deadline: Duration) {
        let end = Instant::now() + deadline;
        while !self.said().contains(text) {
            assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {text:?}; it said:\n{}", self.said());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory, in kB.
    fn resident_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("the process's status");
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// SIGTERM unless it has exited, then everything it said.
    fn stop(mut self) -> String {
        if self.child.try_wait().expect("wait for outbox").is_none() {
            // SAFETY: signals a child process of ours, which has not been waited for yet.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        self.child.wait().expect("wait for outbox");
        // What it said last may still be on its way through the reading threads.
        let end = Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&self.said) > 1 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.said()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on 127.0.0.1 nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sends `request` as it is and reads the answer to its end: its status (0 if the connection
/// closed without one) and its text.
fn ask(address: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    stream.write_all(request.as_bytes()).expect("send the request");
    answer_of(&mut stream)
}

fn answer_of(stream: &mut TcpStream) -> (u16, String) {
    let mut answer = Vec::new();
    // A reset after the answer leaves what was read.
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.strip_prefix("HTTP/1.1 ").and_then(|rest| rest.get(..3)).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, answer)
}

fn get(address: &str, path: &str, headers: &str) -> (u16, String) {
    ask(address, &format!("GET {path} HTTP/1.1\r\n{headers}\r\n"))
}

fn post_action(address: &str, headers: &str, body: &str) -> (u16, String) {
    ask(
        address,
        &format!("POST /api/action HTTP/1.1\r\n{headers}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
    )
}

/// The page's token, asked for as the page asks.
fn token(address: &str) -> String {
    let (status, answer) = get(address, "/api/session", &format!("host: {address}\r\n"));
    assert_eq!(status, 200, "{answer}");
    let body: serde_json::Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    body["token"].as_str().expect("a token").to_string()
}

/// A database with the SQL install and an endpoint `billing`, and a console on it.
fn console_on(database: &str, extra: &[&str]) -> (postgres::Client, Serving, String) {
    let mut db = fresh_database(database);
    migrate(database, &[]);
    db.batch_execute("SELECT outbox.outbox_endpoint_set('billing', 'http://127.0.0.1:9/hook')").unwrap();
    let (console, address) = Serving::console(&url("postgres", database), extra);
    (db, console, address)
}

fn billing_disabled(db: &mut postgres::Client) -> bool {
    db.query_one("SELECT disabled_at IS NOT NULL FROM outbox.outbox_endpoints WHERE name = 'billing'", &[]).unwrap().get(0)
}

#[test]
fn the_console_answers_only_requests_that_name_its_address_or_an_allowed_host() {
    let (mut db, console, address) = console_on("outbox_t_hosts", &["--allowed-host", "console.example"]);
    let port = address.rsplit_once(':').unwrap().1;
    let token = token(&address);
    let disable = r#"{"action":"disable","name":"billing"}"#;

    // A page whose name was rebound to 127.0.0.1: the browser sends its own name as Host.
    for host in ["attacker.example".to_string(), format!("attacker.example:{port}"), format!("127.0.0.2:{port}")] {
        for path in ["/", "/api/session", "/api/endpoints"] {
            let (status, answer) = get(&address, path, &format!("host: {host}\r\n"));
            assert_eq!(status, 421, "GET {path} as {host}: {answer}");
            assert!(!answer.contains(&token), "the token was shown to {host}");
        }
        let (status, answer) = post_action(&address, &format!("host: {host}\r\nx-outbox-console: {token}\r\n"), disable);
        assert_eq!(status, 421, "POST as {host}: {answer}");
    }
    let (status, _) = get(&address, "/api/session", "");
    assert_eq!(status, 400, "a request without Host");
    assert!(!billing_disabled(&mut db), "no refused action was run");

    for host in [address.clone(), format!("localhost:{port}"), "console.example".to_string(), "Console.Example:443".to_string()] {
        let (status, answer) = get(&address, "/api/session", &format!("host: {host}\r\n"));
        assert_eq!(status, 200, "as {host}: {answer}");
    }
    let (status, answer) = post_action(&address, &format!("host: localhost:{port}\r\nx-outbox-console: {token}\r\n"), disable);
    assert_eq!(status, 200, "{answer}");
    assert!(billing_disabled(&mut db), "the action of a host served was run");
    console.stop();
}

#[test]
fn the_console_refuses_another_sites_requests_reads_as_well_as_actions() {
    let (mut db, console, address) = console_on("outbox_t_origin", &[]);
    let token = token(&address);
    let host = format!("host: {address}\r\n");
    let disable = r#"{"action":"disable","name":"billing"}"#;

    for path in ["/api/session", "/api/count/exact"] {
        let (status, answer) = get(&address, path, &format!("{host}origin: http://evil.example\r\n"));
        assert_eq!(status, 403, "GET {path} from another origin: {answer}");
        for site in ["cross-site", "same-site"] {
            let (status, answer) = get(&address, path, &format!("{host}sec-fetch-site: {site}\r\n"));
            assert_eq!(status, 403, "GET {path}, {site}: {answer}");
        }
    }
    let other_port = format!("{host}origin: http://{}:1\r\nx-outbox-console: {token}\r\n", address.rsplit_once(':').unwrap().0);
    for headers in [format!("{host}origin: http://evil.example\r\nx-outbox-console: {token}\r\n"), other_port] {
        let (status, answer) = post_action(&address, &headers, disable);
        assert_eq!(status, 403, "{headers}: {answer}");
    }
    assert!(!billing_disabled(&mut db), "no refused action was run");

    // The console's own page: its origin, and the browser saying so.
    let (status, answer) = get(&address, "/api/session", &format!("{host}sec-fetch-site: same-origin\r\n"));
    assert_eq!(status, 200, "{answer}");
    let own = format!("{host}origin: http://{address}\r\nsec-fetch-site: same-origin\r\nx-outbox-console: {token}\r\n");
    let (status, answer) = post_action(&address, &own, disable);
    assert_eq!(status, 200, "{answer}");
    assert!(billing_disabled(&mut db));
    console.stop();
}

/// Sends one header line of 96 MB (it stops when the listener closes the connection), and
/// returns the answer, if one came.
fn send_a_huge_header(address: &str, path: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\nx-big: ");
    let sending = std::thread::spawn(move || {
        writer.write_all(head.as_bytes())?;
        let chunk = vec![b'a'; 1024 * 1024];
        for _ in 0..96 {
            writer.write_all(&chunk)?;
        }
        writer.write_all(b"\r\n\r\n")
    });
    let (status, _) = answer_of(&mut stream);
    let _ = sending.join();
    status
}

fn a_huge_header_line_is_refused_in_little_memory(serving: &Serving, address: &str, path: &str) {
    let before = serving.resident_kb();
    let status = send_a_huge_header(address, path);
    assert!(status == 431 || status == 0, "a 96 MB header line was answered {status}");
    let grown = serving.resident_kb().saturating_sub(before);
    assert!(grown < 8 * 1024, "the process grew by {grown} kB reading a 96 MB header line");
    let (status, answer) = get(address, path, &format!("host: {address}\r\n"));
    assert_eq!(status, 200, "the next request: {answer}");
}

#[test]
fn a_header_line_over_the_limit_is_refused_without_growing_the_console_or_the_relay() {
    let (_db, console, address) = console_on("outbox_t_header", &[]);
    a_huge_header_line_is_refused_in_little_memory(&console, &address, "/api/session");
    console.stop();

    let metrics = format!("127.0.0.1:{}", free_port());
    let relay = Serving::start(&["relay", "--database-url", &url("outbox_relay", "outbox_t_header"), "--metrics", &metrics]);
    wait_until("the relay serves its metrics", Duration::from_secs(20), || TcpStream::connect(&metrics).is_ok());
    a_huge_header_line_is_refused_in_little_memory(&relay, &metrics, "/metrics");
    relay.stop();
}

#[test]
fn a_body_over_the_limit_is_refused_before_it_is_read() {
    let (mut db, console, address) = console_on("outbox_t_body", &[]);
    let token = token(&address);
    let mut stream = TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    // A gigabyte announced, a kilobyte sent: the answer comes without the rest.
    let head = format!(
        "POST /api/action HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\nx-outbox-console: {token}\r\ncontent-length: {}\r\n\r\n",
        1u64 << 30
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&[b' '; 1024]).unwrap();
    let (status, answer) = answer_of(&mut stream);
    assert_eq!(status, 413, "{answer}");
    assert!(!billing_disabled(&mut db));

    // A body within the limit is read whole.
    let body = format!(r#"{{"action":"disable",{}"name":"billing"}}"#, " ".repeat(60 * 1024));
    let (status, answer) = post_action(&address, &format!("host: {address}\r\nx-outbox-console: {token}\r\n"), &body);
    assert_eq!(status, 200, "{answer}");
    assert!(billing_disabled(&mut db));
    console.stop();
}

#[test]
fn stalled_requests_hold_no_serving_thread_and_are_closed_after_the_read_timeout() {
    let (_db, console, address) = console_on("outbox_t_stall", &[]);
    let token = token(&address);
    // More stalled requests than the console has serving threads: half a body each, then nothing.
    let stalled_at = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(&address).unwrap();
            let head = format!(
                "POST /api/action HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\nx-outbox-console: {token}\r\ncontent-length: 1000\r\n\r\n{{\"action\":"
            );
            stream.write_all(head.as_bytes()).unwrap();
            stream
        })
        .collect();
    // And slower still: a request line sent a byte at a time stops halfway.
    let mut trickle = TcpStream::connect(&address).unwrap();
    trickle.write_all(b"GE").unwrap();
    stalled.push(trickle);

    let asked = Instant::now();
    let (status, answer) = get(&address, "/api/endpoints", &format!("host: {address}\r\n"));
    assert_eq!(status, 200, "{answer}");
    assert!(asked.elapsed() < Duration::from_secs(5), "a request waited {:?} behind stalled ones", asked.elapsed());

    for mut stream in stalled {
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (status, answer) = answer_of(&mut stream);
        assert!(status == 408 || status == 0, "a stalled request: {answer}");
    }
    let closed_after = stalled_at.elapsed();
    assert!(closed_after < Duration::from_secs(25), "the stalled connections were closed after {closed_after:?}");
    console.stop();
}

#[test]
fn connections_stalled_in_every_place_give_way_to_a_whole_request() {
    let (_db, console, address) = console_on("outbox_t_places", &[]);
    // As many connections as the console keeps open (128), each stalled in its request line.
    // They are accepted in the order they connected, before the request below.
    let mut stalled: Vec<TcpStream> = (0..128)
        .map(|_| {
            let mut stream = TcpStream::connect(&address).unwrap();
            stream.write_all(b"GE").unwrap();
            stream
        })
        .collect();
    let (status, answer) = get(&address, "/api/endpoints", &format!("host: {address}\r\n"));
    assert_eq!(status, 200, "{answer}");
    // The oldest gave way: closed at once, unanswered, not after the 10 s read timeout (408).
    stalled[0].set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (status, answer) = answer_of(&mut stalled[0]);
    assert_eq!(status, 0, "the oldest stalled connection was closed unanswered: {answer}");
    console.stop();
}

#[test]
fn the_metrics_listener_answers_only_its_address_and_allowed_hosts_and_no_other_site() {
    let database = "outbox_t_metrics_hosts";
    fresh_database(database);
    let metrics = format!("127.0.0.1:{}", free_port());
    let relay = Serving::start(&[
        "relay",
        "--database-url",
        &url("outbox_relay", database),
        "--metrics",
        &metrics,
        "--allowed-host",
        "prometheus.example",
    ]);
    wait_until("the relay serves its metrics", Duration::from_secs(20), || TcpStream::connect(&metrics).is_ok());
    let port = metrics.rsplit_once(':').unwrap().1;
    for host in [metrics.clone(), format!("localhost:{port}"), format!("prometheus.example:{port}")] {
        let (status, answer) = get(&metrics, "/metrics", &format!("host: {host}\r\n"));
        assert_eq!(status, 200, "as {host}: {answer}");
        assert!(answer.contains("outbox_relay_attempts_total"), "{answer}");
    }
    for host in [format!("attacker.example:{port}"), format!("10.1.2.3:{port}")] {
        let (status, answer) = get(&metrics, "/metrics", &format!("host: {host}\r\n"));
        assert_eq!(status, 421, "as {host}: {answer}");
    }
    let (status, _) = get(&metrics, "/metrics", &format!("host: {metrics}\r\nsec-fetch-site: cross-site\r\n"));
    assert_eq!(status, 403, "another site's page");
    let (status, _) = get(&metrics, "/metrics", &format!("host: {metrics}\r\norigin: http://evil.example\r\n"));
    assert_eq!(status, 403, "another origin");
    relay.stop();
}

#[test]
fn no_password_is_printed_whatever_form_the_database_url_takes() {
    let database = "outbox_t_redact";
    fresh_database(database);
    migrate(database, &[]);
    let served = url("postgres", database);
    let host_port = served.split_once('@').unwrap().1.rsplit_once('/').unwrap().0.to_string();
    let (host, port) = host_port.rsplit_once(':').unwrap();
    // The cluster trusts local connections: the password is sent, and ignored.
    let secret = "Pw0rd-d1stinct1ve";
    let forms = [
        format!("postgres://postgres:{secret}@{host_port}/{database}"),
        format!("postgres://postgres@{host_port}/{database}?password={secret}"),
        format!("postgres://postgres@{host_port}/{database}?application_name=t&password={secret}&connect_timeout=5"),
        format!("host={host} port={port} user=postgres password={secret} dbname={database}"),
        format!("host={host} port={port} user=postgres password='{secret} with spaces' dbname={database}"),
    ];
    for form in &forms {
        let (console, _) = Serving::console(form, &[]);
        let said = console.stop();
        assert!(!said.contains(secret), "the console printed the password of {form}:\n{said}");
        assert!(said.contains(&format!("for postgres://postgres@{host_port}/{database} ")), "{said}");
    }

    // Nothing listens there: each command fails, or waits, saying why.
    let unreachable = format!("127.0.0.1:{}", free_port());
    let (unreachable_host, unreachable_port) = unreachable.rsplit_once(':').unwrap();
    for form in [
        format!("postgres://postgres:{secret}@{unreachable}/{database}"),
        format!("postgres://postgres@{unreachable}/{database}?password={secret}"),
        format!("host={unreachable_host} port={unreachable_port} user=postgres password='{secret}' dbname={database}"),
        format!("host={unreachable_host} port=x user=postgres password='{secret}' dbname={database}"),
        format!("postgres://postgres:{secret}@{unreachable}/{database}?sslmode=bogus"),
    ] {
        for command in ["console", "migrate", "doctor"] {
            let said = Serving::start(&[command, "--database-url", &form]).stop_when_done();
            assert!(said.contains("error"), "{command} with {form}: {said}");
            assert!(!said.contains(secret), "{command} printed the password of {form}:\n{said}");
        }
        let relay = Serving::start(&["relay", "--database-url", &form]);
        relay.wait_for("outbox relay:", Duration::from_secs(20));
        let said = relay.stop();
        assert!(!said.contains(secret), "the relay printed the password of {form}:\n{said}");
    }
}

impl Serving {
    /// Waits for the process to exit by itself, then everything it said.
    fn stop_when_done(mut self) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait for outbox").is_none() {
            assert!(Instant::now() < end, "it did not exit; it said:\n{}", self.said());
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop()
    }
}
