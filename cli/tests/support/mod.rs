//! What the `outbox` binary's end-to-end tests share: a real cluster (`OUTBOX_TEST_URL`, a
//! superuser's URL, started by cli/test.sh with the extension's library installed and no relay
//! workers; `OUTBOX_TEST_MANAGED_URL`, one that loads no outbox library), a database of their
//! own per test, roles as a managed server has them, the binary run as a process, and a
//! receiver on 127.0.0.1.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

pub const BINARY: &str = env!("CARGO_BIN_EXE_outbox");

/// Which cluster a test uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `OUTBOX_TEST_URL`: the extension's library preloaded, as the extension install needs.
    Library,
    /// `OUTBOX_TEST_MANAGED_URL`: no outbox library loaded, as on a managed server, where every
    /// `outbox.*` name is a placeholder that any role may SET; `wal_level = logical`.
    Managed,
    /// `OUTBOX_TEST_TLS_URL`: a server that offers TLS, as managed servers do, with a
    /// certificate of cli/test.sh's CA (`OUTBOX_TEST_TLS`), loading no outbox library, with
    /// `wal_level = logical`: the managed one, or one of the same major built with OpenSSL.
    Tls,
}

/// `user`'s URL for `database` on the cluster of `OUTBOX_TEST_URL`.
pub fn url(user: &str, database: &str) -> String {
    url_on(Server::Library, user, database)
}

/// `user`'s URL for `database` on `server`.
pub fn url_on(server: Server, user: &str, database: &str) -> String {
    let variable = match server {
        Server::Library => "OUTBOX_TEST_URL",
        Server::Managed => "OUTBOX_TEST_MANAGED_URL",
        Server::Tls => "OUTBOX_TEST_TLS_URL",
    };
    let base = std::env::var(variable).unwrap_or_else(|_| panic!("{variable}: run through cli/test.sh"));
    let (scheme_and_host, _) = base.rsplit_once('/').expect("a URL ending in /database");
    let host = scheme_and_host.split_once('@').map_or(scheme_and_host.trim_start_matches("postgres://"), |(_, host)| host);
    format!("postgres://{user}@{host}/{database}")
}

pub fn connect(user: &str, database: &str) -> Client {
    connect_on(Server::Library, user, database)
}

pub fn connect_on(server: Server, user: &str, database: &str) -> Client {
    Client::connect(&url_on(server, user, database), NoTls).unwrap_or_else(|e| panic!("connect as {user} to {database}: {e}"))
}

/// A new, empty database named `name`, and the roles a managed server's users would have:
/// `outbox_owner` with nothing but CREATE on it (it runs migrate), `outbox_relay` a member of
/// it (it runs the relay), `app` with nothing (the recipes grant it what it needs).
pub fn fresh_database(name: &str) -> Client {
    fresh_database_on(Server::Library, name)
}

pub fn fresh_database_on(server: Server, name: &str) -> Client {
    let mut admin = connect_on(server, "postgres", "postgres");
    // A log-mode test leaves its slot, which keeps the database from being dropped.
    admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", &[&name]).unwrap();
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    for role in ["outbox_owner", "outbox_relay", "app"] {
        let exists = admin.query_one("SELECT count(*) FROM pg_roles WHERE rolname = $1", &[&role]).unwrap().get::<_, i64>(0) > 0;
        if !exists {
            admin.batch_execute(&format!("CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")).unwrap();
        }
    }
    admin.batch_execute(&format!("GRANT CREATE ON DATABASE {name} TO outbox_owner; GRANT outbox_owner TO outbox_relay")).unwrap();
    connect_on(server, "postgres", name)
}

/// Runs `outbox ARGS` to its end.
pub fn outbox(args: &[&str]) -> Output {
    Command::new(BINARY).args(args).output().expect("run outbox")
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `outbox migrate` as `outbox_owner`; panics unless it succeeds.
pub fn migrate(database: &str, extra: &[&str]) -> String {
    migrate_on(Server::Library, database, extra)
}

pub fn migrate_on(server: Server, database: &str, extra: &[&str]) -> String {
    let url = url_on(server, "outbox_owner", database);
    let mut args = vec!["migrate", "--database-url", &url];
    args.extend_from_slice(extra);
    let output = outbox(&args);
    assert!(output.status.success(), "outbox migrate {extra:?}: {}", text(&output));
    text(&output)
}

/// A relay process, stopped with SIGTERM when dropped.
pub struct Relay {
    pub child: Child,
}

impl Relay {
    pub fn start(args: &[&str]) -> Relay {
        let child =
            Command::new(BINARY).arg("relay").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start outbox relay");
        Relay { child }
    }

    /// Waits until `condition` holds; after `deadline`, stops the relay and panics with what
    /// it printed.
    pub fn wait_until(&mut self, what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
        let end = Instant::now() + deadline;
        while !condition() {
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let mut output = String::new();
                self.child.stderr.take().expect("piped").read_to_string(&mut output).ok();
                panic!("timed out after {deadline:?} waiting until {what}; the relay said:\n{output}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then its exit status and what it printed.
    pub fn stop(mut self) -> (i32, String) {
        // SAFETY: signals a child process of ours, which has not been waited for yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait for the relay");
        let mut output = String::new();
        self.child.stderr.take().expect("piped").read_to_string(&mut output).ok();
        (status.code().unwrap_or(-1), output)
    }
}

/// Reads the requests of one connection and answers each 204, until the relay closes it.
fn answer_each(stream: TcpStream, kept: &Mutex<Vec<(String, String)>>) {
    let mut writer = stream.try_clone().expect("a second handle on the connection");
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if !matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            return;
        }
        let (mut id, mut length) = (String::new(), 0);
        loop {
            line.clear();
            if !matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                return;
            }
            if line == "\r\n" {
                break;
            }
            let Some((name, value)) = line.split_once(':') else { return };
            match name.trim().to_ascii_lowercase().as_str() {
                "webhook-id" => id = value.trim().to_string(),
                "content-length" => length = value.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        kept.lock().unwrap().push((id, String::from_utf8_lossy(&body).into_owned()));
        if writer.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").is_err() {
            return;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `condition` holds, or panics after `deadline`.
pub fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !condition() {
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A webhook receiver on 127.0.0.1 that answers 204 and keeps each request's webhook-id and body.
/// Plain HTTP/1.1 on std sockets, a thread per connection: tiny_http's pool of threads left
/// some of a burst of connections unanswered until the relay's timeout.
pub struct Receiver {
    pub url: String,
    pub received: Arc<Mutex<Vec<(String, String)>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen on 127.0.0.1");
        let url = format!("http://{}/hook", listener.local_addr().expect("a bound address"));
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || answer_each(stream, &kept));
            }
        });
        Receiver { url, received }
    }

    /// The events received at least once: after a lost slot, events it held that were already
    /// delivered may come again (consumers deduplicate by webhook-id).
    pub fn distinct(&self) -> usize {
        let mut ids: Vec<String> = self.received.lock().unwrap().iter().map(|(id, _)| id.clone()).collect();
        ids.sort();
        ids.dedup();
        ids.len()
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}
