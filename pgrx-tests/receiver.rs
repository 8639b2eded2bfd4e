//! A real HTTP receiver on 127.0.0.1 for the tests: records every request it gets and answers
//! as the test says (a status, a Retry-After, or holding the request until released).

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
}

pub struct Receiver {
    pub url: String,
    reply: Arc<Mutex<Reply>>,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Receiver {
    pub fn start(reply: Reply) -> Receiver {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = server.server_addr().to_ip().expect("an IP listener").port();
        let receiver = Receiver {
            url: format!("http://127.0.0.1:{port}/events"),
            reply: Arc::new(Mutex::new(reply)),
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
        };
        let (reply, state) = (receiver.reply.clone(), receiver.state.clone());
        thread::spawn(move || {
            for request in server.incoming_requests() {
                let (reply, state) = (*reply.lock().unwrap(), state.clone());
                thread::spawn(move || answer(request, reply, &state));
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

fn answer(mut request: tiny_http::Request, reply: Reply, state: &(Mutex<State>, Condvar)) {
    let header = |name: &'static str| request.headers().iter().find(|h| h.field.equiv(name)).map(|h| h.value.as_str().to_string());
    let id = header("webhook-id").and_then(|v| v.parse().ok()).unwrap_or(-1);
    let (timestamp, signature) = (header("webhook-timestamp").unwrap_or_default(), header("webhook-signature"));
    let (content_type, user_agent) = (header("content-type"), header("user-agent"));
    let headers = request.headers().iter().map(|h| (h.field.as_str().as_str().to_lowercase(), h.value.as_str().to_string())).collect();
    let mut body = String::new();
    let _ = request.as_reader().read_to_string(&mut body);
    let (lock, wakeup) = state;
    {
        let mut state = lock.lock().unwrap();
        state.deliveries.push(Delivery { id, timestamp, signature, content_type, user_agent, body, headers, at: Instant::now() });
        state.open += 1;
        state.most_open = state.most_open.max(state.open);
    }
    let response = match reply {
        Reply::Status(status) => tiny_http::Response::empty(status),
        Reply::RetryAfter(status, seconds) => {
            tiny_http::Response::empty(status).with_header(tiny_http::Header::from_bytes("Retry-After", seconds.to_string()).unwrap())
        }
        Reply::Hold => {
            let mut guard = lock.lock().unwrap();
            guard.held += 1;
            while !guard.released {
                guard = wakeup.wait(guard).unwrap();
            }
            guard.held -= 1;
            tiny_http::Response::empty(204)
        }
        Reply::Delay(ms) => {
            thread::sleep(std::time::Duration::from_millis(ms));
            tiny_http::Response::empty(204)
        }
    };
    lock.lock().unwrap().open -= 1;
    let _ = request.respond(response);
}
