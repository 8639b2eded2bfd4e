//! What bounds a relay worker over all endpoints (`outbox.max_requests_in_flight`,
//! `outbox.max_bytes_in_flight`), and what bounds callers: the endpoints and headers there may
//! be, how far ahead `deliver_at` may schedule, and when a far-scheduled head blocks its key.

use std::time::{Duration, Instant};

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

const WORKERS: usize = 2;
/// `outbox.max_requests_in_flight`'s default.
const MAX_REQUESTS: usize = 256;

fn sql_error(db: &mut Db, sql: &str) -> (String, String) {
    let error = db.client.batch_execute(sql).expect_err(sql);
    let error = error.as_db_error().unwrap_or_else(|| panic!("{sql}: {error}"));
    (error.code().code().to_string(), error.message().to_string())
}

#[test]
fn two_hundred_hanging_endpoints_hold_no_more_than_the_budget_and_a_healthy_one_keeps_its_latency() {
    let mut db = db();
    let hanging = Receiver::start(Reply::Hold);
    let healthy = Receiver::start(Reply::Status(204));
    // Named to sort before the healthy one, which a claim that served endpoints by name
    // would leave for last.
    db.execute(&format!(
        "SELECT outbox_endpoint_set(format('a-hang-%s', n), '{}/' || n, '{{hang}}') FROM generate_series(1, 200) AS n;
         SELECT outbox_endpoint_set('z-healthy', '{}', '{{healthy}}');",
        hanging.url, healthy.url
    ));
    // Nothing times out while the test runs: only the budget's shares keep a slot for the
    // healthy endpoint. (The reload also has the workers read the new endpoints.)
    db.configure(&[("outbox.http_timeout", "5min")]);
    // Five events for each hanging endpoint: 1,000 requests they would hold open, were each
    // bounded only by its own max_in_flight (128).
    for _ in 0..5 {
        db.enqueue("hang", "{}");
    }
    wait_until("every hanging endpoint holds a request", Duration::from_secs(60), || hanging.held() >= 200);

    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let id = db.enqueue("healthy", "{}");
        wait_until("the healthy endpoint gets its event", Duration::from_secs(10), || !healthy.deliveries_of(id).is_empty());
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_secs(2), "the healthy endpoint's slowest delivery took {slowest:?}");
    let most = hanging.most_open();
    assert!(most <= WORKERS * MAX_REQUESTS, "{most} requests were open at once, more than {WORKERS} workers x {MAX_REQUESTS}");

    hanging.release();
    db.wait_for("the hanging endpoints' deliveries are sent", Duration::from_secs(60), |db| {
        db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE endpoint LIKE 'a-hang-%' AND sent_at IS NULL") == 0
    });
    db.execute("SELECT outbox_endpoint_drop(format('a-hang-%s', n)) FROM generate_series(1, 200) AS n");
    db.execute("SELECT outbox_endpoint_drop('z-healthy')");
    db.execute("ALTER SYSTEM RESET outbox.http_timeout");
    db.configure(&[]);
}

#[test]
fn the_bodies_a_worker_holds_stay_within_max_bytes_in_flight() {
    let mut db = db();
    let hanging = Receiver::start(Reply::Hold);
    db.execute(&format!("SELECT outbox_endpoint_set('bulky', '{}', '{{bulky}}')", hanging.url));
    // No poll comes to claim what the budget left out: the claim says it left some, and the
    // worker claims again as requests end.
    db.configure(&[("outbox.max_bytes_in_flight", "1MB"), ("outbox.http_timeout", "5min"), ("outbox.poll_interval", "1h")]);
    // 40 events of 100 kB that do not compress (so stored as large as they are sent): one
    // claim would take them all (batch_size 100, max_in_flight 128) without the budget.
    db.execute(
        "SELECT outbox_enqueue('bulky', jsonb_build_object('blob', (SELECT string_agg(md5(random()::text || n || m), '')
                                                                    FROM generate_series(1, 3200) AS m)))
           FROM generate_series(1, 40) AS n",
    );
    let claimed = |db: &mut Db| db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE endpoint = 'bulky' AND attempts > 0");
    wait_until("requests are in flight", Duration::from_secs(30), || hanging.held() >= 5);
    // Each worker holds at most 1 MB, and takes one body past it at most: 11 bodies each.
    let bound = WORKERS as i64 * 11;
    assert!(claimed(&mut db) <= bound, "{} claimed, more than {bound}", claimed(&mut db));
    // Both workers go through their loop again (a reload); neither takes more.
    db.configure(&[]);
    assert!(claimed(&mut db) <= bound, "{} claimed after a reload, more than {bound}", claimed(&mut db));
    assert!(hanging.most_open() as i64 <= bound, "{} requests were open at once", hanging.most_open());

    hanging.release();
    db.wait_for("every bulky event is sent", Duration::from_secs(60), |db| {
        db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE endpoint = 'bulky' AND sent_at IS NULL") == 0
    });
    db.execute("SELECT outbox_endpoint_drop('bulky')");
    db.execute("ALTER SYSTEM RESET outbox.max_bytes_in_flight");
    db.execute("ALTER SYSTEM RESET outbox.http_timeout");
    db.execute("ALTER SYSTEM RESET outbox.poll_interval");
    db.configure(&[]);
}

#[test]
fn endpoints_and_their_headers_are_bounded_and_the_bound_changes_nothing() {
    let mut db = db();
    let headers = (1..=33).map(|n| format!("\"x-h{n}\": \"v\"")).collect::<Vec<_>>().join(", ");
    let (code, message) =
        sql_error(&mut db, &format!("SELECT outbox_endpoint_set('many', 'http://127.0.0.1:9/', headers => '{{{headers}}}')"));
    assert_eq!((code.as_str(), message.contains("at most 32 headers")), ("22023", true), "{message}");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_endpoints WHERE name = 'many'"), 0);

    let existing: i64 = db.value("SELECT count(*) FROM outbox_endpoints");
    db.execute(&format!(
        "SELECT outbox_endpoint_set(format('bound-%s', n), NULL, kind => 'pull') FROM generate_series(1, {}) AS n",
        1000 - existing
    ));
    let (code, message) = sql_error(&mut db, "SELECT outbox_endpoint_set('one-too-many', NULL, kind => 'pull')");
    assert_eq!(code, "54000", "{message}");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_endpoints"), 1000);
    // An endpoint that exists can still be changed.
    db.execute("SELECT outbox_endpoint_set('bound-1', NULL, '{jobs.*}', kind => 'pull')");
    db.execute("SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name LIKE 'bound-%'");
}

#[test]
fn deliver_at_is_refused_beyond_the_horizon_and_a_far_scheduled_head_counts_as_blocking_its_key() {
    let mut db = db();
    let (code, message) = sql_error(&mut db, "SELECT outbox_enqueue('later', '{}', deliver_at => now() + interval '91 days')");
    assert_eq!(code, "22023", "the default horizon is 90 days: {message}");
    db.execute("BEGIN; SELECT outbox_enqueue('later', '{}', deliver_at => now() + interval '89 days'); ROLLBACK");
    db.execute("SET outbox.deliver_at_horizon = '1h'");
    let (code, message) = sql_error(&mut db, "SELECT outbox_enqueue('later', '{}', deliver_at => now() + interval '2 hours')");
    assert!(code == "22023" && message.contains("outbox.deliver_at_horizon"), "{message}");
    db.execute("RESET outbox.deliver_at_horizon");

    db.execute("SELECT outbox_endpoint_set('far', NULL, '{far}', kind => 'pull', ordered => true)");
    let blocked = |db: &mut Db| db.value::<i64>("SELECT blocked_keys FROM outbox_endpoint_stats() WHERE endpoint = 'far'");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'soon', deliver_at => now() + interval '10 minutes')");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'soon')");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'next-month', deliver_at => now() + interval '30 days')");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'next-month')");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'leased')");
    db.execute("SELECT outbox_enqueue('far', '{}', key => 'leased')");
    // A claim gives each key its head and takes the one due now, for a long lease.
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_claim('far', 10, '2 hours')"), 1);
    assert_eq!(blocked(&mut db), 1, "the head due in 30 days blocks its key; neither the one due in 10 minutes nor a long lease does");
    db.execute("SELECT outbox_endpoint_drop('far')");
}
