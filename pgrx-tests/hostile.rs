//! Receivers and failures that must not hurt the relay: a receiver sending whatever bytes it
//! likes, and PostgreSQL errors inside a worker's transactions. No worker restarts, no
//! acknowledgement is lost, and each failure leaves a readable `last_error`.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::cluster::{db, wait_until};
use super::receiver::{read_request, Receiver, Reply};

/// What a hostile receiver answers to an event, by the event's topic, and the `last_error`
/// that must result (`None`: delivered).
const ANSWERS: &[(&str, &str, Option<&str>)] = &[
    ("good", "HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n", None),
    (
        "huge.retry.after",
        "HTTP/1.1 503 Busy\r\nretry-after: 99999999999999\r\ncontent-length: 0\r\n\r\n",
        Some("HTTP 503 (Retry-After 3600s)"),
    ),
    (
        "year.9999",
        "HTTP/1.1 503 Busy\r\nretry-after: Fri, 31 Dec 9999 23:59:59 GMT\r\ncontent-length: 0\r\n\r\n",
        Some("HTTP 503 (Retry-After 3600s)"),
    ),
    ("negative.retry.after", "HTTP/1.1 429 Slow\r\nretry-after: -5\r\ncontent-length: 0\r\n\r\n", Some("HTTP 429")),
    ("float.retry.after", "HTTP/1.1 503 Busy\r\nretry-after: 1e308\r\ncontent-length: 0\r\n\r\n", Some("HTTP 503")),
    ("status.999", "HTTP/1.1 999 Nonsense\r\ncontent-length: 0\r\n\r\n", Some("HTTP 999")),
    ("huge.headers", "", Some("unreachable: ")),
    ("endless.body", "HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n", Some("HTTP 500")),
    ("unfinished.body", "HTTP/1.1 500 Oops\r\ncontent-length: 1000\r\n\r\nonly this", Some("timeout")),
];

/// A receiver on 127.0.0.1 that writes raw bytes: headers without end, bodies without end,
/// bodies that stop halfway, statuses no HTTP version has.
struct HostileReceiver {
    url: String,
    /// webhook-id → how many requests carried it.
    requests: Arc<Mutex<HashMap<i64, usize>>>,
}

impl HostileReceiver {
    fn start() -> HostileReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://127.0.0.1:{}/events", listener.local_addr().unwrap().port());
        let requests = Arc::new(Mutex::new(HashMap::new()));
        let seen = requests.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                thread::spawn(move || serve(stream, &seen));
            }
        });
        HostileReceiver { url, requests }
    }

    fn requests_of(&self, id: i64) -> usize {
        self.requests.lock().unwrap().get(&id).copied().unwrap_or(0)
    }
}

/// Answers the requests of one keep-alive connection until the answer ends it.
fn serve(stream: TcpStream, seen: &Mutex<HashMap<i64, usize>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let id = request.header("webhook-id").and_then(|v| v.parse().ok()).unwrap_or(-1i64);
        *seen.lock().unwrap().entry(id).or_default() += 1;
        let topic = serde_json::from_slice::<serde_json::Value>(&request.body).unwrap()["type"].as_str().unwrap_or("").to_string();
        let answer = ANSWERS.iter().find(|(t, _, _)| *t == topic).map(|(_, a, _)| *a).unwrap_or("");
        let _ = writer.write_all(answer.as_bytes());
        match topic.as_str() {
            "good" => continue,
            "huge.headers" => {
                let _ = writer.write_all(b"HTTP/1.1 200 OK\r\n");
                let filler = format!("x-filler: {}\r\n", "a".repeat(1000));
                for _ in 0..2000 {
                    if writer.write_all(filler.as_bytes()).is_err() {
                        break;
                    }
                }
            }
            "endless.body" => {
                let chunk = format!("{:x}\r\n{}\r\n", 65536, "b".repeat(65536));
                while writer.write_all(chunk.as_bytes()).is_ok() {}
            }
            // Hold the connection open, unanswered, until the relay gives up on it.
            "unfinished.body" => {
                let _ = reader.read(&mut [0; 1]);
            }
            _ => continue,
        }
        return;
    }
}

#[test]
fn a_hostile_receiver_costs_no_acknowledgement_and_no_worker() {
    let mut db = db();
    let receiver = HostileReceiver::start();
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.http_timeout", "2s")]);
    let pids = db.worker_pids();

    // One transaction, so that the good events are claimed in the same batches as the hostile ones.
    let mut events = Vec::new();
    let mut transaction = db.client.transaction().unwrap();
    for round in 0..3 {
        for (topic, _, expected) in ANSWERS {
            let id: i64 = transaction.query_one("SELECT outbox_enqueue($1, '{}')", &[topic]).unwrap().get(0);
            events.push((id, *topic, *expected, round));
        }
    }
    transaction.commit().unwrap();

    wait_until("every good event is sent and every hostile one has a last_error", Duration::from_secs(30), || {
        events.iter().all(|(id, _, expected, _)| match expected {
            None => db.is_sent(*id),
            Some(_) => db.count(&format!("id = {id} AND last_error IS NOT NULL")) == 1,
        })
    });
    for (id, topic, expected, _) in &events {
        let row = db
            .client
            .query_one(
                "SELECT last_error, sent_at IS NOT NULL, dead_at IS NOT NULL, available_at <= now() + interval '1 hour' FROM outbox_deliveries WHERE event_id = $1",
                &[id],
            )
            .unwrap();
        let (error, sent, dead, within_the_hour): (Option<String>, bool, bool, bool) = (row.get(0), row.get(1), row.get(2), row.get(3));
        match expected {
            None => {
                assert!(sent, "{topic} ({id}) is sent");
                assert_eq!(receiver.requests_of(*id), 1, "{topic} ({id}) was delivered exactly once");
            }
            Some(expected) => {
                let error = error.unwrap();
                // A transport error's text is hyper's; every other one is exactly as listed.
                let matches = if expected.ends_with(": ") { error.starts_with(expected) } else { error == *expected };
                assert!(matches, "{topic}: last_error {error:?}, expected {expected:?}");
                assert!(error.len() <= 1024 && !error.chars().any(char::is_control), "{topic}: unreadable last_error {error:?}");
                assert!(!sent && !dead, "{topic} waits for its retry");
                assert!(within_the_hour, "{topic} is retried within the hour");
            }
        }
    }
    assert_eq!(db.worker_pids(), pids, "no worker crashed or restarted");
}

#[test]
fn an_error_in_a_workers_transaction_is_caught_and_its_acknowledgements_are_kept() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    // No request may time out while held (its retry would be a second delivery): the timeout
    // outlasts every wait below, and the 20 events commit together, so that a slow disk cannot
    // spread their requests' start over the timeout.
    db.configure(&[("outbox.webhook_url", &receiver.url), ("lock_timeout", "50ms"), ("outbox.http_timeout", "2min")]);
    let pids = db.worker_pids();
    let ids: Vec<i64> = db.column("SELECT outbox_enqueue('held', '{}') FROM generate_series(1, 20)");
    wait_until("all 20 requests are in flight", Duration::from_secs(10), || receiver.held() == 20);

    // Another session locks the deliveries against writes: recording the acknowledgements (and
    // any claim) now fails with a lock timeout, an ERROR inside the workers' transactions.
    let (mut locker, _) = pgrx_tests::client().expect("a second connection");
    locker.batch_execute("BEGIN; LOCK TABLE outbox_deliveries IN EXCLUSIVE MODE").unwrap();
    let rollbacks = "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()";
    let rolled_back_before: i64 = db.value(rollbacks);
    receiver.release();
    wait_until("the workers' transactions fail on the lock", Duration::from_secs(20), || {
        db.value::<i64>(rollbacks) >= rolled_back_before + 2
    });
    assert_eq!(db.count("sent_at IS NOT NULL"), 0, "nothing could be recorded while the lock was held");
    locker.batch_execute("ROLLBACK").unwrap();

    wait_until("every acknowledgement is recorded once the lock is gone", Duration::from_secs(20), || {
        db.count("sent_at IS NOT NULL") == 20
    });
    for id in ids {
        let (claims, error): (i32, Option<String>) = {
            let row = db.client.query_one("SELECT attempts, last_error FROM outbox_deliveries WHERE event_id = $1", &[&id]).unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!(
            receiver.deliveries_of(id).len(),
            1,
            "event {id} was delivered exactly once (claimed {claims} times, last error {error:?})"
        );
    }
    assert_eq!(db.worker_pids(), pids, "no worker crashed or restarted");
}
