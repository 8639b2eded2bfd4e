use std::time::Duration;

use super::cluster::{db, prepare_claim, wait_until};
use super::receiver::{Receiver, Reply};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

#[test]
fn a_delivery_carries_the_contract_headers_body_and_a_valid_signature() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    db.execute(&format!("SELECT outbox_endpoint_rotate_secret('default', '{SECRET}')"));

    let id = db.enqueue("order.placed", r#"{"order_id": 7, "total": 42.5}"#);
    wait_until("the event is marked sent", Duration::from_secs(10), || db.is_sent(id));

    let deliveries = receiver.deliveries_of(id);
    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    assert_eq!(delivery.content_type.as_deref(), Some("application/json"));
    assert_eq!(delivery.user_agent.as_deref(), Some(concat!("outbox_ext/", env!("CARGO_PKG_VERSION"))));
    let timestamp: i64 = delivery.timestamp.parse().expect("webhook-timestamp is unix seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - timestamp).abs() < 60, "webhook-timestamp {timestamp} is the attempt's time");
    assert!(delivery.verified_by_standardwebhooks(SECRET), "the signature verifies: {:?}", delivery.signature);
    assert!(!delivery.verified_by_standardwebhooks(OTHER_SECRET), "and only with the endpoint's secret");

    let body = delivery.json();
    assert_eq!(body["type"], "order.placed");
    assert_eq!(body["data"], serde_json::json!({"order_id": 7, "total": 42.5}));
    let created_at: String = db.value(&format!("SELECT to_json(created_at)#>>'{{}}' FROM outbox WHERE id = {id}"));
    assert_eq!(body["timestamp"], created_at.as_str(), "timestamp is created_at in RFC 3339");
    assert!(created_at.contains('T') && (created_at.ends_with('Z') || created_at[created_at.len() - 6..].starts_with(['+', '-'])));
}

#[test]
fn a_user_and_password_in_the_url_are_sent_as_basic_authorization_and_nowhere_else() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    let with_credentials = receiver.url.replacen("http://", "http://us%40er:p%3Ass@", 1);
    db.configure(&[("outbox.webhook_url", &with_credentials)]);

    let id = db.enqueue("order.placed", "{}");
    wait_until("the event is marked sent", Duration::from_secs(10), || db.is_sent(id));

    let delivery = &receiver.deliveries_of(id)[0];
    // base64 of "us@er:p:ss": the user and password percent-decoded, as curl sends them.
    let authorizations: Vec<&str> = delivery.headers.iter().filter(|(name, _)| name == "authorization").map(|(_, v)| v.as_str()).collect();
    assert_eq!(authorizations, ["Basic dXNAZXI6cDpzcw=="]);
    assert_eq!(delivery.request_line, "POST /events HTTP/1.1");
    assert_eq!(delivery.header("host"), receiver.url.strip_prefix("http://").and_then(|rest| rest.strip_suffix("/events")));
    assert_eq!(delivery.header("accept"), Some("*/*"));

    // An endpoint's own Accept replaces the relay's, rather than joining it.
    db.execute(&format!(
        "SELECT outbox_endpoint_set('accepting', '{}', '{{accepting}}', headers => '{{\"Accept\": \"application/json\"}}')",
        receiver.url
    ));
    let id = db.enqueue("accepting", "{}");
    let sent = format!("id = {id} AND sent_at IS NOT NULL");
    wait_until("the event is sent to both endpoints", Duration::from_secs(10), || db.is_sent(id) && db.count_to("accepting", &sent) == 1);
    let deliveries = receiver.deliveries_of(id);
    let accepts: Vec<Vec<&str>> = deliveries
        .iter()
        .map(|delivery| delivery.headers.iter().filter(|(name, _)| name == "accept").map(|(_, v)| v.as_str()).collect())
        .collect();
    assert!(accepts.contains(&vec!["application/json"]) && accepts.contains(&vec!["*/*"]), "{accepts:?}");
    db.execute("SELECT outbox_endpoint_drop('accepting')");
}

#[test]
fn a_commit_wakes_a_worker_without_waiting_for_the_poll() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    // With an hour between polls, only the commit's wakeup can explain a prompt delivery.
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.poll_interval", "1h")]);
    let id = db.enqueue("wake.me", "{}");
    wait_until("the event arrives long before the next poll", Duration::from_secs(10), || !receiver.deliveries_of(id).is_empty());
}

#[test]
fn commits_leave_a_worker_with_nothing_to_send_to_asleep_until_it_can_claim() {
    let mut db = db();
    // No URL: the only endpoint cannot be sent to. An hour between polls.
    db.configure(&[("outbox.webhook_url", ""), ("outbox.poll_interval", "1h")]);
    let pids = db.worker_pids();
    let before: Vec<u64> = pids.iter().map(|pid| times_slept(*pid)).collect();
    let ids: Vec<i64> = (0..300).map(|_| db.enqueue("asleep", "{}")).collect();
    for (pid, before) in pids.iter().zip(before) {
        let woken = times_slept(*pid) - before;
        // Without the check every one of the 300 commits woke both workers.
        assert!(woken < 30, "worker {pid} woke {woken} times during 300 commits it could do nothing about");
    }
    // Given a URL it delivers them (the reload's claim), and the next commit wakes it again.
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    wait_until("the 300 events arrive", Duration::from_secs(20), || ids.iter().all(|id| !receiver.deliveries_of(*id).is_empty()));
    let id = db.enqueue("awake", "{}");
    wait_until("a commit wakes the worker again, long before the next poll", Duration::from_secs(10), || {
        !receiver.deliveries_of(id).is_empty()
    });
}

/// How many times the process went to sleep of its own accord (its main thread's voluntary
/// context switches).
fn times_slept(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the worker's /proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/<pid>/status")
}

#[test]
fn claims_are_served_by_the_partial_index() {
    let mut db = db();
    db.insert_deliveries("history", 20_000, "sent_at", "now()");
    db.insert_deliveries("pending", 10, "attempts", "0");
    db.execute("ANALYZE outbox; ANALYZE outbox_deliveries");
    db.execute(&format!("BEGIN; {}", prepare_claim()));
    let plan: Vec<String> = db
        .client
        .query("EXPLAIN EXECUTE claim('webhook', '{default}', '{100}', '{30000}', '{10}', 67108864, 1)", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    db.execute("ROLLBACK; DEALLOCATE claim");
    let plan = plan.join("\n");
    assert!(plan.contains("outbox_deliveries_pending"), "the claim walks the outbox_deliveries_pending index:\n{plan}");
    assert!(plan.contains("LockRows"), "the claim locks the rows it takes:\n{plan}");
}

#[test]
fn a_reload_that_shortens_the_poll_interval_takes_effect_at_once() {
    let mut db = db();
    // Nothing to send to, so no commit wakes the workers; each arms an hour's poll.
    db.configure(&[("outbox.webhook_url", ""), ("outbox.poll_interval", "1h")]);
    wait_until("the workers have armed their hour-long poll", Duration::from_secs(10), || {
        db.value::<bool>("SELECT clock_timestamp() > max(settings_loaded_at) + interval '1.5 seconds' FROM outbox_workers()")
    });
    db.configure(&[("outbox.poll_interval", "1s")]);
    // An endpoint the workers have not read yet: only the poll finds it.
    let receiver = Receiver::start(Reply::Status(204));
    db.execute(&format!("SELECT outbox_endpoint_set('polled', '{}', '{{polled}}')", receiver.url));
    let id = db.enqueue("polled", "{}");
    wait_until("the next poll, a second away, finds the endpoint", Duration::from_secs(10), || !receiver.deliveries_of(id).is_empty());
    db.execute("SELECT outbox_endpoint_drop('polled')");
}
