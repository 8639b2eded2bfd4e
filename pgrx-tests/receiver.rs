//! A real HTTP receiver on 127.0.0.1 for the tests: records every request it gets and answers
//! as the test says (a status, a Retry-After, or holding the request until released).
//!
//! Plain HTTP/1.1 on std sockets, one thread per connection: a server with a thread pool can
//! leave a burst of new connections queued behind requests it holds open, which a test would
//! take for the relay not sending them.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Instant;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub timestamp: String,
    pub signature: Option<String>,
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
    /// The request line, as `POST /events HTTP/1.1`.
    pub request_line: String,
    pub body: String,
    /// Every header, names in lower case.
    pub headers: Vec<(String, String)>,
    pub at: Instant,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("the body is JSON")
    }

    /// Whether the official Standard Webhooks library for Python verifies this delivery with
    /// `secret`: the tests check signatures with an implementation that is not the crate's.
    pub fn verified_by_standardwebhooks(&self, secret: &str) -> bool {
        let script = "import os, sys\n\
                      from standardwebhooks.webhooks import Webhook\n\
                      h = {k: os.environ[k.upper().replace('-', '_')] for k in ('webhook-id', 'webhook-timestamp', 'webhook-signature')}\n\
                      try:\n    Webhook(os.environ['SECRET']).verify(os.environ['BODY'], h)\nexcept Exception as e:\n    sys.exit(str(e))\n";
        let output = Command::new("python3")
            .args(["-c", script])
            .env("SECRET", secret)
            .env("BODY", &self.body)
            .env("WEBHOOK_ID", self.id.to_string())
            .env("WEBHOOK_TIMESTAMP", &self.timestamp)
            .env("WEBHOOK_SIGNATURE", self.signature.clone().unwrap_or_default())
            .output()
            .expect("python3 runs (scripts/setup.sh installs standardwebhooks)");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("ModuleNotFoundError"), "{stderr}");
        output.status.success()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reply {
    Status(u16),
    /// The status with a `Retry-After: <seconds>` header.
    RetryAfter(u16, u64),
    /// Keep the request open until `release()`, then answer 204.
    Hold,
    /// Answer 204 after this many milliseconds.
    Delay(u64),
}

#[derive(Default)]
struct State {
    deliveries: Vec<Delivery>,
    held: usize,
    released: bool,
    /// Requests being answered now, and the most there ever were at once.
    open: usize,
    most_open: usize,
    /// Connections accepted.
    connections: usize,
}

pub struct Receiver {
    pub url: String,
    reply: Arc<Mutex<Reply>>,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Receiver {
    pub fn start(reply: Reply) -> Receiver {
        Receiver::start_on("127.0.0.1", reply)
    }

    /// A receiver listening on `address`, a loopback address.
    pub fn start_on(address: &str, reply: Reply) -> Receiver {
        let listener = TcpListener::bind((address, 0)).unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let port = listener.local_addr().expect("a bound address").port();
        let receiver = Receiver {
            url: format!("http://{address}:{port}/events"),
            reply: Arc::new(Mutex::new(reply)),
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
        };
        let (reply, state) = (receiver.reply.clone(), receiver.state.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                state.0.lock().unwrap().connections += 1;
                let (reply, state) = (reply.clone(), state.clone());
                thread::spawn(move || serve(stream, &reply, &state));
            }
        });
        receiver
    }

    pub fn set_reply(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state.0.lock().unwrap().deliveries.clone()
    }

    pub fn deliveries_of(&self, id: i64) -> Vec<Delivery> {
        self.deliveries().into_iter().filter(|d| d.id == id).collect()
    }

    /// The most requests this receiver had open at the same time.
    pub fn most_open(&self) -> usize {
        self.state.0.lock().unwrap().most_open
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.0.lock().unwrap().connections
    }

    /// Requests currently kept open by `Reply::Hold`.
    pub fn held(&self) -> usize {
        self.state.0.lock().unwrap().held
    }

    pub fn release(&self) {
        let (lock, wakeup) = &*self.state;
        lock.lock().unwrap().released = true;
        wakeup.notify_all();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.release();
        // The listener stays open until the test process ends, so that no later receiver gets
        // its port: the workers keep idle keep-alive connections to it for a minute, and a
        // request for a later test sent over one of those would reach this receiver (or hang
        // on a half-closed server) instead of that test's.
    }
}

/// One request as read from a connection.
pub struct Request {
    pub request_line: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// The next request of a keep-alive connection; `None` once the connection ends, or if the
/// request is not one this reader understands.
pub fn read_request(reader: &mut impl BufRead) -> Option<Request> {
    let mut headers = Vec::new();
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None; // the request line, or the end of the connection
    }
    let request_line = line.trim_end().to_string();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    // The relay sends bodies of known length; a chunked one would be read as empty.
    assert!(headers.iter().all(|(name, _)| name != "transfer-encoding"), "a request with a transfer-encoding: {headers:?}");
    let length = headers.iter().find(|(name, _)| name == "content-length").map_or(Some(0), |(_, v)| v.parse().ok())?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request { request_line, headers, body })
}

/// Answers the requests of one connection as the test's reply says, until the relay closes it.
fn serve(stream: TcpStream, reply: &Mutex<Reply>, state: &(Mutex<State>, Condvar)) {
    let mut writer = stream.try_clone().expect("a second handle on the connection");
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let reply = *reply.lock().unwrap();
        let header = |name: &str| request.header(name).map(str::to_string);
        let delivery = Delivery {
            id: header("webhook-id").and_then(|v| v.parse().ok()).unwrap_or(-1),
            timestamp: header("webhook-timestamp").unwrap_or_default(),
            signature: header("webhook-signature"),
            content_type: header("content-type"),
            user_agent: header("user-agent"),
            request_line: request.request_line.clone(),
            body: String::from_utf8_lossy(&request.body).into_owned(),
            headers: request.headers.clone(),
            at: Instant::now(),
        };
        if writer.write_all(answer(delivery, reply, state).as_bytes()).is_err() {
            return;
        }
    }
}

/// Records the delivery and returns the response to write, once it is time to answer.
fn answer(delivery: Delivery, reply: Reply, state: &(Mutex<State>, Condvar)) -> String {
    let (lock, wakeup) = state;
    {
        let mut state = lock.lock().unwrap();
        state.deliveries.push(delivery);
        state.open += 1;
        state.most_open = state.most_open.max(state.open);
    }
    let (status, retry_after) = match reply {
        Reply::Status(status) => (status, None),
        Reply::RetryAfter(status, seconds) => (status, Some(seconds)),
        Reply::Hold => {
            let mut guard = lock.lock().unwrap();
            guard.held += 1;
            while !guard.released {
                guard = wakeup.wait(guard).unwrap();
            }
            guard.held -= 1;
            (204, None)
        }
        Reply::Delay(ms) => {
            thread::sleep(std::time::Duration::from_millis(ms));
            (204, None)
        }
    };
    lock.lock().unwrap().open -= 1;
    // A 204 has no body and so no content-length; every other answer says why, as receivers do.
    let body = if status == 204 { String::new() } else { refusal(status) };
    let mut response = format!("HTTP/1.1 {status} Test\r\n");
    if status != 204 {
        response.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    if let Some(seconds) = retry_after {
        response.push_str(&format!("retry-after: {seconds}\r\n"));
    }
    response.push_str("\r\n");
    response.push_str(&body);
    response
}

/// The body of an answer other than 204.
pub fn refusal(status: u16) -> String {
    format!("{{\"error\": \"the test receiver answers {status}\"}}")
}
