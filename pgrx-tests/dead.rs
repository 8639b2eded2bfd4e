//! Dead deliveries found, requeued and skipped by a filter (endpoint, topic, error, time),
//! each counted by a dry run first, with clear errors for a filter that could match nothing.

use super::cluster::{db, Db};

/// Writes `n` dead deliveries of `topic` to `endpoint`, dead since `ago` with `error`.
fn dead(db: &mut Db, endpoint: &str, topic: &str, n: i64, error: &str, ago: &str) {
    db.insert_deliveries_to(endpoint, topic, n, "attempts, dead_at, last_error", &format!("3, now() - interval '{ago}', '{error}'"));
}

#[test]
fn dead_deliveries_are_listed_counted_and_requeued_by_endpoint_topic_error_and_time() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    for name in ["billing", "audit"] {
        db.execute(&format!("SELECT outbox_endpoint_set('{name}', NULL, '{{*}}', kind => 'pull')"));
    }
    dead(&mut db, "billing", "order.placed", 3, "HTTP 503", "2 hours");
    dead(&mut db, "billing", "order.cancelled", 2, "timeout", "10 minutes");
    dead(&mut db, "audit", "order.placed", 4, "HTTP 503", "10 minutes");
    db.insert_deliveries_to("billing", "order.placed", 5, "sent_at", "now()");
    let answered: i64 = db.value("SELECT max(event_id) FROM outbox_deliveries WHERE endpoint = 'billing' AND last_error = 'timeout'");
    db.execute(&format!(
        "INSERT INTO outbox_attempts (event_id, endpoint, attempt, failed_at, status, duration_ms, error, response)
         VALUES ({answered}, 'billing', 3, now(), 504, 30000, 'timeout', 'gateway busy')"
    ));

    let dead_now = |db: &mut Db| db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE dead_at IS NOT NULL");
    for (filter, expected) in [
        ("", 9),
        ("endpoint => 'billing'", 5),
        ("endpoint => 'billing', topic => 'order.*'", 5),
        ("topic => 'order.cancelled'", 2),
        ("topic => '*'", 9),
        ("error => 'http 5'", 7),
        ("since => now() - interval '1 hour'", 6),
        ("until => now() - interval '1 hour'", 3),
        ("endpoint => 'audit', error => 'timeout'", 0),
    ] {
        assert_eq!(db.value::<i64>(&format!("SELECT outbox_requeue_dead({filter})")), expected, "dry run of ({filter})");
    }
    assert_eq!(dead_now(&mut db), 9, "a dry run changes nothing");

    let listed: Vec<(i64, String, Option<i32>, Option<String>)> = db
        .client
        .query("SELECT event_id, last_error, last_status, last_response FROM outbox_dead(endpoint => 'billing', max_rows => 2)", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    assert_eq!(listed.len(), 2, "at most max_rows");
    assert!(listed.iter().all(|(_, error, _, _)| error == "timeout"), "the most recently dead first: {listed:?}");
    assert_eq!(listed[0], (answered, "timeout".into(), Some(504), Some("gateway busy".into())), "with the receiver's last answer");

    for (call, message) in [
        ("outbox_requeue_dead(topic => 'order*')", "'order*' is not a topic pattern"),
        ("outbox_skip_dead(endpoint => 'missing')", "endpoint 'missing' does not exist"),
        ("outbox_dead(since => now(), until => now() - interval '1 day')", "must be before until"),
        ("outbox_dead(max_rows => 0)", "max_rows must be 1 or more"),
    ] {
        let error = db.client.execute(&format!("SELECT * FROM {call}"), &[]).expect_err(call);
        let error = error.as_db_error().unwrap_or_else(|| panic!("{call}: {error}"));
        assert_eq!(error.code().code(), "22023", "{call}: {error}");
        assert!(error.message().contains(message), "{call}: {}", error.message());
    }

    assert_eq!(db.value::<i64>("SELECT outbox_requeue_dead(endpoint => 'billing', error => '503', dry_run => false)"), 3);
    assert_eq!(dead_now(&mut db), 6, "only what the filter matched left the dead");
    assert_eq!(
        db.count_to("billing", "dead_at IS NULL AND sent_at IS NULL AND attempts = 0 AND topic = 'order.placed'"),
        3,
        "requeued with a fresh attempt budget"
    );

    db.fresh_role("dead_reader");
    for call in ["outbox_dead()", "outbox_requeue_dead()", "outbox_skip_dead()"] {
        let error = db.as_role("dead_reader", &format!("SELECT * FROM {call}")).expect_err(call);
        assert_eq!(error.code().map(|c| c.code()), Some("42501"), "{call} needs a grant: {error}");
    }
}

#[test]
fn a_bulk_skip_unblocks_each_key_whose_head_is_dead_and_counts_them_first() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    db.execute("SELECT outbox_endpoint_set('jobs', NULL, '{*}', kind => 'pull', ordered => true, max_attempts => 1)");
    let ids: Vec<i64> = db
        .column("SELECT outbox_enqueue('job', '{}', k) FROM unnest(ARRAY['a', 'a', 'b', 'b', 'c']) WITH ORDINALITY AS u (k, n) ORDER BY n");
    let [a1, a2, b1, b2, c1]: [i64; 5] = ids.try_into().unwrap();
    let claimed: Vec<i64> = db.column("SELECT event_id FROM outbox_claim('jobs', 100) ORDER BY event_id");
    assert_eq!(claimed, vec![a1, b1, c1], "the head of each key");
    db.execute(&format!("SELECT outbox_nack('jobs', {a1}, 1, 'schema mismatch'), outbox_nack('jobs', {b1}, 1, 'timeout')"));
    db.execute(&format!("SELECT outbox_ack('jobs', {c1}, 1)"));
    assert!(db.column::<i64>("SELECT event_id FROM outbox_claim('jobs', 100)").is_empty(), "keys a and b are blocked");

    assert_eq!(db.value::<i64>("SELECT outbox_skip_dead(endpoint => 'jobs')"), 2, "a dry run counts the blocking heads");
    assert_eq!(db.value::<i64>("SELECT outbox_skip_dead(error => 'schema', dry_run => false)"), 1);
    let claimed: Vec<i64> = db.column("SELECT event_id FROM outbox_claim('jobs', 100)");
    assert_eq!(claimed, vec![a2], "key a goes on; b is still blocked");
    let skipped: Vec<(i64, bool)> = db
        .client
        .query("SELECT event_id, skipped FROM outbox_dead(endpoint => 'jobs') ORDER BY event_id", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(skipped, vec![(a1, true), (b1, false)], "outbox_dead tells a skipped delivery from a blocking one");
    assert_eq!(
        db.value::<i64>("SELECT outbox_requeue_dead(endpoint => 'jobs')"),
        1,
        "a bulk requeue leaves a1 dead: sent now, it would follow a2 out of order"
    );
    assert_eq!(db.value::<i64>("SELECT outbox_skip_dead(dry_run => false)"), 1, "b1, and a1 no more");
    let claimed: Vec<i64> = db.column("SELECT event_id FROM outbox_claim('jobs', 100)");
    assert_eq!(claimed, vec![b2]);
    assert_eq!(db.count_to("jobs", "dead_at IS NOT NULL"), 2, "skipped deliveries stay dead");
}
