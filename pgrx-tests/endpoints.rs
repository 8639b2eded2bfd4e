//! Endpoints: routing by topic, management with clear errors, secrets and their rotation
//! (checked with the official Standard Webhooks library for Python), isolation and fairness
//! between endpoints, health and auto-disable, requeue and replay, and statistics and
//! retention that never read the sent history.

use std::time::{Duration, Instant};

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

/// Adds a webhook endpoint; `extra` is SQL for the remaining named arguments, if any.
fn endpoint(db: &mut Db, name: &str, url: &str, topics: &str, extra: &str) {
    db.execute(&format!("SELECT outbox_endpoint_set('{name}', '{url}', '{topics}'{extra})"));
}

/// The endpoint names an event was routed to.
fn routed(db: &mut Db, id: i64) -> Vec<String> {
    db.column(&format!("SELECT endpoint FROM outbox_deliveries WHERE event_id = {id} ORDER BY endpoint"))
}

#[test]
fn each_event_goes_to_every_endpoint_whose_topics_match_and_the_rest_is_kept_unrouted() {
    let mut db = db();
    let (billing, audit, placed) =
        (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(204)));
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "billing", &billing.url, "{order.*,refund.issued}", "");
    endpoint(&mut db, "audit", &audit.url, "{*}", "");
    endpoint(&mut db, "jobs", &placed.url, "{order.placed}", "");

    let cases = [
        ("order.placed", vec!["audit", "billing", "jobs"]),
        ("order.a.b", vec!["audit", "billing"]),
        ("order", vec!["audit"]),
        ("orders.x", vec!["audit"]),
        ("refund.issued", vec!["audit", "billing"]),
        ("refund.issued.late", vec!["audit"]),
    ];
    let mut ids = Vec::new();
    for (topic, expected) in &cases {
        let id = db.enqueue(topic, "{}");
        assert_eq!(routed(&mut db, id), *expected, "{topic}");
        ids.push(id);
    }
    wait_until("each endpoint's deliveries are made", Duration::from_secs(30), || {
        db.count_to("audit", "sent_at IS NOT NULL") == 6
            && db.count_to("billing", "sent_at IS NOT NULL") == 3
            && db.count_to("jobs", "sent_at IS NOT NULL") == 1
    });
    assert_eq!((audit.deliveries().len(), billing.deliveries().len(), placed.deliveries().len()), (6, 3, 1), "each got its events once");

    db.execute("SELECT outbox_endpoint_drop('audit'); SELECT outbox_endpoint_drop('jobs')");
    let nobody = db.enqueue("user.created", "{}");
    assert!(routed(&mut db, nobody).is_empty());
    assert_eq!(db.count_events(&format!("id = {nobody}")), 1, "an event no endpoint wants is kept");
    // order, orders.x, refund.issued.late lost their only endpoint with audit; user.created had none.
    assert_eq!(db.value::<i64>("SELECT unrouted FROM outbox_stats()"), 4);

    let late = Receiver::start(Reply::Status(204));
    endpoint(&mut db, "late", &late.url, "{user.*}", "");
    assert_eq!(db.value::<i64>("SELECT outbox_replay('late', now() - interval '1 hour')"), 1, "replay back-fills a new endpoint");
    wait_until("the replayed event arrives", Duration::from_secs(10), || late.deliveries_of(nobody).len() == 1);
    assert_eq!(db.value::<i64>("SELECT unrouted FROM outbox_stats()"), 3);
}

#[test]
fn endpoint_management_rejects_bad_input_with_class_22_and_changes_nothing() {
    let mut db = db();
    let long_url = format!("'http://127.0.0.1/{}'", "x".repeat(2048));
    let cases: Vec<(String, &str)> = [
        ("'bad name', 'http://127.0.0.1/'", "endpoint name"),
        ("NULL, 'http://127.0.0.1/'", "endpoint name"),
        ("'e', 'http://127.0.0.1/', '{*}', 'kafka'", "kind must be"),
        ("'e', 'http://127.0.0.1/', ordered => NULL", "ordered is true or false"),
        ("'e', 'ftp://user:hunter2@127.0.0.1/'", "http:// or https://"),
        ("'e', 'http://127.0.0.1/a b'", "without spaces"),
        ("'e', 'https://'", "http:// or https://"),
        ("'e', 'http://127.0.0.1:99999/'", "from 1 to 65535"),
        ("'e', 'http://127.0.0.1:0/'", "from 1 to 65535"),
        ("'e', 'http://127.0.0.1:abc/'", "from 1 to 65535"),
        ("'e', 'http://[::1/'", "with a host"),
        ("'e', 'http://:8080/'", "with a host"),
        ("'e', NULL", "needs a url"),
        ("'e', 'http://127.0.0.1/', '{}'", "at least one pattern"),
        ("'e', 'http://127.0.0.1/', NULL", "at least one pattern"),
        ("'e', 'http://127.0.0.1/', '{order*}'", "not a topic pattern"),
        ("'e', 'http://127.0.0.1/', '{*.placed}'", "not a topic pattern"),
        ("'e', 'http://127.0.0.1/', '{order..placed}'", "not a topic pattern"),
        ("'e', 'http://127.0.0.1/', '{order.}'", "not a topic pattern"),
        ("'e', 'http://127.0.0.1/', '{ok,NULL}'", "not a topic pattern"),
        ("'e', 'http://127.0.0.1/', headers => '[]'", "JSON object of strings"),
        ("'e', 'http://127.0.0.1/', headers => '{\"x-n\": 1}'", "must be a string"),
        ("'e', 'http://127.0.0.1/', headers => '{\"x-a\": \"a\\r\\nx-b: b\"}'", "without line breaks"),
        ("'e', 'http://127.0.0.1/', headers => '{\"Webhook-Id\": \"1\"}'", "set by the relay"),
        ("'e', 'http://127.0.0.1/', headers => '{\"content-type\": \"text/plain\"}'", "set by the relay"),
        ("'e', 'http://127.0.0.1/', headers => '{\"bad header\": \"v\"}'", "not an HTTP header name"),
        ("'e', 'http://127.0.0.1/', headers => '{\"X-A\": \"1\", \"x-a\": \"2\"}'", "named twice"),
        ("'e', 'http://127.0.0.1/', headers => '{\"User-Agent\": \"mine\"}'", "set by the relay"),
        ("'e', 'http://127.0.0.1/', timeout => '0 s'", "timeout must be from 10 milliseconds"),
        ("'e', 'http://127.0.0.1/', timeout => '1 microsecond'", "timeout must be from 10 milliseconds"),
        ("'e', 'http://127.0.0.1/', max_attempts => 0", "max_attempts must be"),
        ("'e', 'http://127.0.0.1/', max_in_flight => -1", "max_in_flight must be"),
    ]
    .into_iter()
    .map(|(args, message)| (format!("SELECT outbox_endpoint_set({args})"), message))
    .chain([
        (format!("SELECT outbox_endpoint_set('e', {long_url})"), "at most 2048 bytes"),
        ("SELECT outbox_endpoint_rotate_secret('missing')".to_string(), "does not exist"),
        ("SELECT outbox_endpoint_rotate_secret('default', 'hunter2-not-a-secret')".to_string(), "\"whsec_\" followed by"),
        ("SELECT outbox_endpoint_rotate_secret('default', 'whsec_aHVudGVyMg==')".to_string(), "24 to 64 bytes"),
        // Base64 the workers would not decode: whitespace, and trailing bits that are not zero.
        (
            "SELECT outbox_endpoint_rotate_secret('default', 'whsec_MfKQ9r8GKYqrTwjU PD8ILPZIo2LaLaSw')".to_string(),
            "\"whsec_\" followed by",
        ),
        (
            "SELECT outbox_endpoint_rotate_secret('default', 'whsec_eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eB==')".to_string(),
            "\"whsec_\" followed by",
        ),
        ("SELECT outbox_endpoint_rotate_secret('default', NULL, '-1 hour')".to_string(), "grace must be"),
        ("SELECT outbox_endpoint_disable('missing')".to_string(), "does not exist"),
        ("SELECT outbox_endpoint_enable('missing')".to_string(), "does not exist"),
        ("SELECT outbox_endpoint_drop('missing')".to_string(), "does not exist"),
        ("SELECT outbox_replay('missing', now())".to_string(), "does not exist"),
        ("SELECT outbox_requeue(1, 'missing')".to_string(), "outbox_requeue: endpoint 'missing' does not exist"),
        ("SELECT outbox_endpoint_rotate_secret('default', NULL, NULL)".to_string(), "grace must be zero or positive, not NULL"),
    ])
    .collect();
    let before: String =
        db.value("SELECT (SELECT jsonb_agg(e) FROM outbox_endpoints e)::text || (SELECT count(*) FROM outbox_endpoint_secrets)");
    for (sql, message) in cases {
        let error = db.client.batch_execute(&sql).expect_err(&sql);
        let error = error.as_db_error().unwrap_or_else(|| panic!("{sql}: {error}"));
        assert_eq!(error.code().code(), "22023", "{sql}: {}", error.message());
        assert!(error.message().contains(message), "{sql}: {:?} should say {message:?}", error.message());
        assert!(!error.message().contains("hunter2"), "{sql}: the error repeats a credential: {}", error.message());
    }
    for sql in ["SELECT outbox_mark_processed(NULL)", "SELECT outbox_mark_processed(1, NULL)", "SELECT outbox_skip(NULL, NULL)"] {
        let error = db.client.batch_execute(sql).expect_err(sql);
        let error = error.as_db_error().unwrap_or_else(|| panic!("{sql}: {error}"));
        assert_eq!(error.code().code(), "22004", "{sql}: {}", error.message());
        assert!(error.message().ends_with("must not be null"), "{sql}: {}", error.message());
    }
    let after: String =
        db.value("SELECT (SELECT jsonb_agg(e) FROM outbox_endpoints e)::text || (SELECT count(*) FROM outbox_endpoint_secrets)");
    assert_eq!(after, before, "nothing changed");
    // What the stricter URL check still takes.
    for url in [
        "http://user:pw@127.0.0.1:8080/hook?a=1#f",
        "https://[::1]:8443/hook",
        "http://localhost",
        "https://example.com:443",
        "http://user:0@127.0.0.1/hook",
        "http://user:p@ss@127.0.0.1/hook",
        "http://127.0.0.1:/hook",
    ] {
        db.execute(&format!("SELECT outbox_endpoint_set('ok', '{url}')"));
    }
    db.execute("SELECT outbox_endpoint_drop('ok')");
}

#[test]
fn during_a_rotation_both_secrets_sign_and_standardwebhooks_verifies_either() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    endpoint(&mut db, "partner", &receiver.url, "{*}", ", headers => '{\"Authorization\": \"Bearer t0k\"}'");
    let old: String = db.value("SELECT outbox_endpoint_rotate_secret('partner')");
    assert!(old.starts_with("whsec_") && old.len() == 6 + 44, "a generated secret is whsec_ + base64 of 32 bytes: {old}");
    let first = db.enqueue("signed.once", "{}");
    wait_until("the first event arrives", Duration::from_secs(10), || receiver.deliveries_of(first).len() == 1);
    let delivery = &receiver.deliveries_of(first)[0];
    assert_eq!(delivery.signature.as_deref().unwrap().matches("v1,").count(), 1);
    assert_eq!(delivery.header("authorization"), Some("Bearer t0k"), "static headers are sent");
    assert!(delivery.verified_by_standardwebhooks(&old));

    let new: String = db.value("SELECT outbox_endpoint_rotate_secret('partner', NULL, '1 hour')");
    let second = db.enqueue("signed.twice", "{}");
    wait_until("the second event arrives", Duration::from_secs(10), || receiver.deliveries_of(second).len() == 1);
    let delivery = &receiver.deliveries_of(second)[0];
    assert_eq!(delivery.signature.as_deref().unwrap().matches("v1,").count(), 2, "one signature per live secret");
    assert!(delivery.verified_by_standardwebhooks(&old), "a receiver still on the old secret verifies");
    assert!(delivery.verified_by_standardwebhooks(&new), "a receiver on the new secret verifies");
    let stranger: String = db.value("SELECT outbox_endpoint_rotate_secret('default')");
    assert!(!delivery.verified_by_standardwebhooks(&stranger), "another secret does not verify");

    db.execute("SELECT outbox_endpoint_rotate_secret('partner', NULL, '0 seconds')");
    let third = db.enqueue("after.grace", "{}");
    wait_until("the third event arrives", Duration::from_secs(10), || receiver.deliveries_of(third).len() == 1);
    let delivery = &receiver.deliveries_of(third)[0];
    assert_eq!(delivery.signature.as_deref().unwrap().matches("v1,").count(), 1, "after the grace period, one signature");
    assert!(!delivery.verified_by_standardwebhooks(&new), "the replaced secret no longer signs");

    // Only the secrets table holds secret material, and nobody but its owner may read it.
    let readable: i64 = db.value(&format!(
        "SELECT count(*) FROM (SELECT to_jsonb(e)::text AS t FROM outbox_endpoints e
                               UNION ALL SELECT to_jsonb(d)::text FROM outbox_deliveries d
                               UNION ALL SELECT to_jsonb(o)::text FROM outbox o) AS rows
          WHERE t LIKE '%{}%'",
        &new[6..20]
    ));
    assert_eq!(readable, 0);
    assert!(!db.value::<bool>("SELECT has_table_privilege('public', 'outbox_endpoint_secrets', 'SELECT')"));
}

/// Workers that read the endpoints while a rotation is open (uncommitted) read them again
/// once it commits: an attempt claimed after the commit is signed with the new secret. (The
/// endpoints' version was a sequence, which moved before the commit: the workers took the new
/// number with the old secrets and sent unsigned.)
#[test]
fn workers_that_read_the_endpoints_during_a_rotation_sign_with_the_new_secret_once_it_commits() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    endpoint(&mut db, "rotated", &receiver.url, "{rotated}", "");
    let database: String = db.value("SELECT current_database()");
    let mut rotation = db.connect(&database, "postgres");
    rotation.batch_execute("BEGIN").unwrap();
    let secret: String = rotation.query_one("SELECT outbox_endpoint_rotate_secret('rotated')", &[]).unwrap().get(0);
    // A reload has both workers read the endpoints now, while the rotation is open.
    db.configure(&[]);
    rotation.batch_execute("COMMIT").unwrap();
    let id = db.enqueue("rotated", "{}");
    wait_until("the event arrives", Duration::from_secs(10), || receiver.deliveries_of(id).len() == 1);
    let delivery = &receiver.deliveries_of(id)[0];
    assert!(delivery.verified_by_standardwebhooks(&secret), "signed with the committed secret: {:?}", delivery.signature);
    db.execute("SELECT outbox_endpoint_drop('rotated')");
}

#[test]
fn an_endpoint_moved_to_another_origin_loses_its_secrets_and_one_moved_within_its_origin_keeps_them() {
    let mut db = db();
    let (old, new) = (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(204)));
    let secrets = |db: &mut Db| db.value::<i64>("SELECT count(*) FROM outbox_endpoint_secrets WHERE endpoint = 'moving'");
    endpoint(&mut db, "moving", &old.url, "{moving}", "");
    let secret: String = db.value("SELECT outbox_endpoint_rotate_secret('moving')");
    // The same scheme, host and port, however spelled: the same receiver, the secret stays.
    let port = old.url.trim_start_matches("http://127.0.0.1:").trim_end_matches("/events");
    for same in [format!("http://127.0.0.1:{port}/other?x=1"), format!("http://127.0.0.1:{port}")] {
        endpoint(&mut db, "moving", &same, "{moving}", "");
        assert_eq!(secrets(&mut db), 1, "{same} is the same origin");
    }
    let first = db.enqueue("moving", "{}");
    wait_until("the event reaches the old receiver", Duration::from_secs(10), || old.deliveries_of(first).len() == 1);
    assert!(old.deliveries_of(first)[0].verified_by_standardwebhooks(&secret));
    // Another port (or scheme, or host): whoever may change the URL must not receive requests
    // signed for the old receiver, so the secrets go.
    endpoint(&mut db, "moving", &new.url, "{moving}", "");
    assert_eq!(secrets(&mut db), 0, "a new origin keeps no secret");
    let second = db.enqueue("moving", "{}");
    wait_until("the event reaches the new receiver", Duration::from_secs(10), || new.deliveries_of(second).len() == 1);
    assert_eq!(new.deliveries_of(second)[0].signature, None, "nothing is signed with the old receiver's secret");
    // A backslash, which URL parsers read as a slash (so the host ends before it), is refused.
    let error =
        db.client.batch_execute("SELECT outbox_endpoint_set('moving', 'http://evil.example\\@127.0.0.1:1/')").expect_err("a backslash");
    assert_eq!(error.code().map(|c| c.code()), Some("22023"), "{error}");
    db.execute("SELECT outbox_endpoint_rotate_secret('moving')");
    for other in ["https://127.0.0.1:1/", "http://localhost:1/", "http://127.0.0.1:1/"] {
        endpoint(&mut db, "moving", &new.url, "{moving}", "");
        db.execute("SELECT outbox_endpoint_rotate_secret('moving')");
        endpoint(&mut db, "moving", other, "{moving}", "");
        assert_eq!(secrets(&mut db), 0, "{other} is another origin");
    }
    db.execute("SELECT outbox_endpoint_drop('moving')");
}

#[test]
fn an_endpoint_that_is_down_slow_or_disabled_never_delays_another() {
    let mut db = db();
    let fast = Receiver::start(Reply::Status(204));
    let slow = Receiver::start(Reply::Hold);
    let down = format!("http://127.0.0.1:{}/down", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "fast", &fast.url, "{*}", "");
    endpoint(&mut db, "slow", &slow.url, "{*}", ", timeout => '1 hour'");
    endpoint(&mut db, "down", &down, "{*}", "");
    endpoint(&mut db, "off", &fast.url, "{*}", "");
    db.execute("SELECT outbox_endpoint_disable('off', 'maintenance')");

    let ids: Vec<i64> = (0..50).map(|n| db.enqueue("order.placed", &format!(r#"{{"n": {n}}}"#))).collect();
    db.wait_for("every event reaches the healthy endpoint", Duration::from_secs(30), |db| db.count_to("fast", "sent_at IS NOT NULL") == 50);
    // Every delivery to slow is claimed and unanswered (the relay holds all 50 requests open;
    // the receiver may not have read each of them yet when the machine is loaded).
    db.wait_for("the slow endpoint holds its requests", Duration::from_secs(30), |db| {
        slow.held() > 0 && db.count_to("slow", "claimed_by IS NOT NULL AND attempts = 1 AND sent_at IS NULL") == 50
    });
    assert_eq!(db.count_to("slow", "sent_at IS NOT NULL"), 0, "none of which has finished");
    assert!(ids.iter().all(|id| fast.deliveries_of(*id).len() == 1), "the disabled endpoint (same URL) got nothing");
    assert_eq!(db.count_to("off", "attempts = 0 AND sent_at IS NULL AND dead_at IS NULL"), 50, "its deliveries wait");
    wait_until("the down endpoint's failures are recorded", Duration::from_secs(10), || {
        db.count_to("down", "last_error LIKE 'unreachable:%'") == 50
    });
    let stats: (i64, i64, i64) = {
        let row = db.client.query_one("SELECT pending, waiting, dead FROM outbox_endpoint_stats() WHERE endpoint = 'off'", &[]).unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(stats, (0, 50, 0), "a disabled endpoint's deliveries are waiting");
    let health: (bool, String) = {
        let row =
            db.client.query_one("SELECT failing_since IS NOT NULL, last_error FROM outbox_endpoints WHERE name = 'down'", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    assert!(health.0 && health.1.starts_with("unreachable:"), "the workers keep the endpoint's health: {health:?}");
    slow.release();
    // 30 s, and what the workers were doing if not: it timed out at 10 s once in a loaded full run.
    db.wait_for("the slow endpoint's deliveries complete", Duration::from_secs(30), |db| db.count_to("slow", "sent_at IS NOT NULL") == 50);
    assert!(db.value::<bool>("SELECT last_success_at IS NOT NULL AND failing_since IS NULL FROM outbox_endpoints WHERE name = 'slow'"));
}

#[test]
fn a_backlog_at_one_endpoint_does_not_hold_up_another_and_max_in_flight_bounds_it() {
    let mut db = db();
    let busy = Receiver::start(Reply::Delay(50));
    let quiet = Receiver::start(Reply::Status(204));
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "busy", &busy.url, "{busy}", ", max_in_flight => 3");
    endpoint(&mut db, "quiet", &quiet.url, "{quiet}", "");
    db.execute(
        "WITH e AS (INSERT INTO outbox (topic, payload) SELECT 'busy', '{}' FROM generate_series(1, 100000) RETURNING id)
         INSERT INTO outbox_deliveries (event_id, endpoint) SELECT id, 'busy' FROM e;
         ANALYZE outbox_deliveries",
    );
    wait_until("the backlog is being worked on", Duration::from_secs(10), || busy.deliveries().len() >= 10);
    let started = Instant::now();
    let id = db.enqueue("quiet", "{}");
    wait_until("the fresh event for the other endpoint arrives", Duration::from_secs(5), || quiet.deliveries_of(id).len() == 1);
    let waited = started.elapsed();
    let remaining = db.count_to("busy", "sent_at IS NULL");
    assert!(remaining > 90_000, "the backlog was still there ({remaining} left) when the fresh event arrived after {waited:?}");
    assert!(busy.most_open() <= 3 * 2, "max_in_flight 3 per worker, 2 workers: at most 6 at once, saw {}", busy.most_open());
    assert!(busy.most_open() >= 2, "the busy endpoint was worked on concurrently ({})", busy.most_open());
    db.execute("SELECT outbox_endpoint_drop('busy')");
}

#[test]
fn an_endpoint_that_gets_room_back_sends_what_was_committed_while_it_was_full() {
    let mut db = db();
    // With an hour between polls, only the finished requests can start the claim.
    db.configure(&[("outbox.poll_interval", "1h")]);
    let full = Receiver::start(Reply::Hold);
    let other = Receiver::start(Reply::Status(204));
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "full", &full.url, "{full}", ", max_in_flight => 1");
    endpoint(&mut db, "other", &other.url, "{other}", "");
    // One request held per worker: neither has room for endpoint full, both have room for
    // other, so the next commit wakes them and their claim leaves endpoint full out.
    db.execute("SELECT outbox_enqueue('full', '{}') FROM generate_series(1, 2)");
    wait_until("each worker holds a request to endpoint full", Duration::from_secs(10), || full.held() == 2);
    let late = db.enqueue("full", "{}");
    let id = db.enqueue("other", "{}");
    wait_until("the event for endpoint other arrives", Duration::from_secs(10), || other.deliveries_of(id).len() == 1);
    assert!(full.deliveries_of(late).is_empty());
    full.release();
    wait_until("the event committed while endpoint full had no room arrives once it has", Duration::from_secs(10), || {
        full.deliveries_of(late).len() == 1
    });
}

#[test]
fn an_endpoint_failing_past_disable_after_is_disabled_and_resumes_when_enabled() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(503));
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "flaky", &receiver.url, "{*}", ", max_attempts => 100");
    db.configure(&[("outbox.endpoint_disable_after", "2s")]);
    let id = db.enqueue("order.placed", "{}");
    wait_until("the endpoint is disabled", Duration::from_secs(30), || {
        db.value::<bool>("SELECT disabled_at IS NOT NULL FROM outbox_endpoints WHERE name = 'flaky'")
    });
    let reason: String = db.value("SELECT disabled_reason FROM outbox_endpoints WHERE name = 'flaky'");
    assert!(reason.contains("no successful delivery since") && reason.contains("HTTP 503"), "{reason}");
    assert_eq!(db.count_to("flaky", &format!("id = {id} AND dead_at IS NULL AND sent_at IS NULL")), 1, "its delivery waits, not dead");
    let attempts = receiver.deliveries_of(id).len();
    receiver.set_reply(Reply::Status(204));

    db.execute("SELECT outbox_endpoint_enable('flaky')");
    wait_until("the waiting delivery is made once enabled", Duration::from_secs(10), || db.count_to("flaky", "sent_at IS NOT NULL") == 1);
    assert_eq!(receiver.deliveries_of(id).len(), attempts + 1, "nothing was attempted while disabled");
    assert!(db.value::<bool>(
        "SELECT disabled_at IS NULL AND failing_since IS NULL AND last_success_at IS NOT NULL FROM outbox_endpoints WHERE name = 'flaky'"
    ));
}

#[test]
fn requeue_and_replay_send_again_what_an_endpoint_missed() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(500));
    let other = Receiver::start(Reply::Status(500));
    db.execute("SELECT outbox_endpoint_drop('default')");
    endpoint(&mut db, "a", &receiver.url, "{*}", ", max_attempts => 1");
    endpoint(&mut db, "b", &other.url, "{*}", ", max_attempts => 1");
    let id = db.enqueue("order.placed", "{}");
    wait_until("both deliveries are dead", Duration::from_secs(10), || {
        db.count_to("a", "dead_at IS NOT NULL") == 1 && db.count_to("b", "dead_at IS NOT NULL") == 1
    });
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_endpoint_stats() WHERE endpoint = 'a'"), 1);
    receiver.set_reply(Reply::Status(204));
    other.set_reply(Reply::Status(204));
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id}, 'a')")), 1, "only a's dead delivery");
    wait_until("the requeued delivery is made", Duration::from_secs(10), || db.count_to("a", "sent_at IS NOT NULL") == 1);
    assert_eq!(db.count_to("b", "dead_at IS NOT NULL"), 1, "b's stays dead");
    assert_eq!(other.deliveries_of(id).len(), 1, "b was not sent the event again");
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id})")), 1, "null endpoint: every dead delivery (b's)");
    wait_until("b's requeued delivery is made", Duration::from_secs(10), || db.count_to("b", "sent_at IS NOT NULL") == 1);

    assert_eq!(db.value::<i64>("SELECT outbox_replay('b', now() - interval '1 hour')"), 1);
    wait_until("the replayed delivery is made and recorded", Duration::from_secs(10), || {
        db.count_to("b", "sent_at IS NOT NULL") == 1 && db.value::<i64>("SELECT sent FROM outbox_stats()") == 3
    });
    assert_eq!(other.deliveries_of(id).len(), 3, "b got the event again, once");
    assert_eq!(
        db.value::<i64>("SELECT outbox_replay('b', now() - interval '1 hour', now() - interval '30 minutes')"),
        0,
        "outside the window"
    );
}

#[test]
fn a_replay_that_waited_for_a_drop_of_its_endpoint_fails_and_writes_nothing() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_set('gone', NULL, '{*}', kind => 'pull')");
    db.enqueue("order.placed", "{}");
    db.execute("DELETE FROM outbox_deliveries WHERE endpoint = 'gone'");
    let mut dropper = db.connect("pgrx_tests", "postgres");
    dropper.batch_execute("BEGIN; SELECT outbox_endpoint_drop('gone')").unwrap();
    let mut operator = db.connect("pgrx_tests", "postgres");
    let operator_pid: i32 = operator.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let replay = std::thread::spawn(move || {
        operator.query_one("SELECT outbox_replay('gone', now() - interval '1 hour')", &[]).map(|row| row.get::<_, i64>(0))
    });
    wait_until("the replay waits for the drop", Duration::from_secs(10), || {
        db.value::<i64>(&format!("SELECT count(*) FROM pg_locks WHERE pid = {operator_pid} AND NOT granted")) == 1
    });
    dropper.batch_execute("COMMIT").unwrap();
    let error = replay.join().unwrap().expect_err("a replay to a dropped endpoint");
    assert_eq!(error.code(), Some(&postgres::error::SqlState::INVALID_PARAMETER_VALUE), "{error}");
    assert_eq!(
        db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE endpoint = 'gone'"),
        0,
        "no delivery to an endpoint that is gone"
    );
}

#[test]
fn an_endpoint_drop_held_up_by_an_open_enqueue_gives_up_after_2_s_and_changes_nothing() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_set('gone', NULL, '{*}', kind => 'pull')");
    let mut producer = db.connect("pgrx_tests", "postgres");
    producer.batch_execute("BEGIN; SELECT outbox_enqueue('order.placed', '{}')").unwrap();
    let mut operator = db.connect("pgrx_tests", "postgres");
    // Without the 2 s limit the drop would wait for the producer (and every new enqueue, claim
    // and ack behind it); this bounds the test instead.
    operator.batch_execute("SET statement_timeout = '20s'").unwrap();
    let started = Instant::now();
    let error = operator.batch_execute("SELECT outbox_endpoint_drop('gone')").expect_err("a drop behind an open transaction gives up");
    let waited = started.elapsed();
    let error = error.as_db_error().unwrap_or_else(|| panic!("{error}"));
    assert_eq!(error.code(), &postgres::error::SqlState::LOCK_NOT_AVAILABLE, "{error}");
    assert!(error.message().starts_with("outbox_endpoint_drop: waited 2 s"), "{error}");
    assert!(waited < Duration::from_secs(10), "gave up after {waited:?}");
    producer.batch_execute("COMMIT").unwrap();
    assert_eq!(
        db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE endpoint = 'gone'"),
        1,
        "the endpoint and its deliveries stay"
    );

    // Once it holds the table, it does not wait long for the endpoint's row either.
    producer.batch_execute("BEGIN; SELECT outbox_endpoint_disable('gone')").unwrap();
    let error = operator.batch_execute("SELECT outbox_endpoint_drop('gone')").expect_err("a drop behind an open change gives up");
    let error = error.as_db_error().unwrap_or_else(|| panic!("{error}"));
    assert_eq!(error.code(), &postgres::error::SqlState::LOCK_NOT_AVAILABLE, "{error}");
    assert!(error.message().starts_with("outbox_endpoint_drop: waited 2s for a transaction changing endpoint 'gone'"), "{error}");
    producer.batch_execute("ROLLBACK").unwrap();
    db.execute("SELECT outbox_endpoint_drop('gone')");
}

/// Enqueues (with `key`, if any) in a transaction of `isolation` whose snapshot was taken before `db`
/// ran `change`: the event's id, committed, or the SQLSTATE it failed with, rolled back.
fn enqueue_after(
    db: &mut Db,
    producer: &mut postgres::Client,
    isolation: postgres::IsolationLevel,
    change: &str,
    key: Option<&str>,
) -> Result<i64, String> {
    let mut tx = producer.build_transaction().isolation_level(isolation).start().unwrap();
    tx.execute("SELECT 1", &[]).unwrap(); // takes the snapshot
    db.execute(change);
    match tx.query_one("SELECT outbox_enqueue('order.placed', '{}', key => $1)", &[&key]) {
        Ok(row) => {
            tx.commit().unwrap();
            Ok(row.get(0))
        }
        Err(error) => Err(error.code().map_or_else(|| error.to_string(), |code| code.code().to_string())),
    }
}

#[test]
fn an_enqueue_whose_snapshot_predates_an_endpoint_drop_or_change_fails_so_it_is_retried() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    db.execute("SELECT outbox_endpoint_set('kept', NULL, '{*}', kind => 'pull')");
    let mut producer = db.connect("pgrx_tests", "postgres");
    let serialization_failure = Err("40001".to_string());
    for isolation in [postgres::IsolationLevel::RepeatableRead, postgres::IsolationLevel::Serializable] {
        db.execute("SELECT outbox_endpoint_set('gone', NULL, '{*}', kind => 'pull')");
        let dropped = enqueue_after(&mut db, &mut producer, isolation, "SELECT outbox_endpoint_drop('gone')", None);
        assert_eq!(dropped, serialization_failure, "{isolation:?}: routing to a dropped endpoint");
        // Tried again, as such a transaction is: the event goes where it can be sent.
        let id = enqueue_after(&mut db, &mut producer, isolation, "SELECT 1", None).unwrap();
        assert_eq!(routed(&mut db, id), vec!["kept"], "{isolation:?}");

        // The workers' writes of an endpoint's health do not stand in the way...
        let health = "UPDATE outbox_endpoints SET last_success_at = now(), failing_since = NULL WHERE name = 'kept'";
        let id = enqueue_after(&mut db, &mut producer, isolation, health, None).unwrap();
        assert_eq!(routed(&mut db, id), vec!["kept"], "{isolation:?}");
        // ...but a change made with the endpoint functions does, as a drop does: the event
        // would be routed by the endpoint as it was.
        let topics = "SELECT outbox_endpoint_set('kept', NULL, '{order.*}', kind => 'pull')";
        assert_eq!(enqueue_after(&mut db, &mut producer, isolation, topics, None), serialization_failure, "{isolation:?}");
    }
    // Turning ordered off, likewise: the event would wait for its key with no sequencer.
    db.execute("SELECT outbox_endpoint_set('kept', NULL, '{*}', kind => 'pull', ordered => true)");
    let unordered = "SELECT outbox_endpoint_set('kept', NULL, '{*}', kind => 'pull', ordered => false)";
    let isolation = postgres::IsolationLevel::RepeatableRead;
    assert_eq!(enqueue_after(&mut db, &mut producer, isolation, unordered, Some("order-1")), serialization_failure);
}

/// The plan of `sql`, as text.
fn plan(db: &mut Db, sql: &str) -> String {
    db.column::<String>(&format!("EXPLAIN {sql}")).join("\n")
}

#[test]
fn with_a_million_sent_deliveries_stats_and_retention_read_only_what_they_need() {
    let mut db = db();
    db.insert_deliveries("history", 1_000_000, "sent_at, attempts", "now(), 1");
    db.insert_deliveries("expired", 500, "sent_at, attempts", "now() - interval '2 hours', 1");
    db.insert_deliveries("pending", 100, "available_at", "now() + interval '1 hour'");
    db.execute("ANALYZE outbox; ANALYZE outbox_deliveries");
    for function in ["outbox_stats()", "outbox_endpoint_stats()"] {
        // The SQL functions are inlined into EXPLAIN of their body: plan the body's queries.
        let fastest = (0..5)
            .map(|_| {
                let started = Instant::now();
                db.execute(&format!("SELECT * FROM {function}"));
                started.elapsed()
            })
            .min()
            .unwrap();
        assert!(fastest < Duration::from_millis(50), "{function} took {fastest:?} with a million sent deliveries");
    }
    let queued = plan(&mut db, "SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NULL AND dead_at IS NULL AND NOT waiting");
    assert!(!queued.contains("Seq Scan"), "counting the queue reads the pending index:\n{queued}");
    let behind = plan(&mut db, "SELECT count(*) FROM outbox_deliveries WHERE waiting");
    assert!(behind.contains("outbox_deliveries_waiting"), "counting what waits for its key reads that index:\n{behind}");
    let dead = plan(&mut db, "SELECT count(*) FROM outbox_deliveries WHERE dead_at IS NOT NULL");
    assert!(dead.contains("outbox_deliveries_dead"), "counting the dead reads their index:\n{dead}");
    assert_eq!(db.value::<i64>("SELECT waiting FROM outbox_stats()"), 100);

    db.configure(&[("outbox.retention", "1h")]);
    wait_until("expired deliveries and their events are deleted", Duration::from_secs(30), || db.count_events("topic = 'expired'") == 0);
    assert_eq!(db.count_to("default", "topic = 'history'"), 1_000_000, "recent history stays");
    assert_eq!(db.count_to("default", "topic = 'pending'"), 100, "pending deliveries stay");
    let retention = plan(&mut db, "SELECT 1 FROM outbox_deliveries WHERE sent_at < now() - interval '1 hour' ORDER BY sent_at LIMIT 1000");
    assert!(
        retention.contains("outbox_deliveries_sent") && !retention.contains("Seq Scan"),
        "retention walks the sent index:\n{retention}"
    );
    db.execute("TRUNCATE outbox_attempts, outbox_deliveries, outbox");
}
