use std::time::Duration;

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

#[test]
fn bad_input_errors_with_class_22_and_writes_nothing() {
    let mut db = db();
    refuses_bad_input(&mut db);
    assert_eq!(db.count_events("true"), 0, "no outbox row was written");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_deliveries"), 0, "nor a delivery");

    db.enqueue("at.the.limit", &format!(r#"{{"k": "{}"}}"#, "x".repeat(91)));
    assert_eq!(db.count("topic = 'at.the.limit'"), 1, "a payload exactly at the limit is accepted");
}

/// Each kind of bad input fails the caller's transaction with its class 22 error, the business
/// write with it; in either mode, since the checks come before the mode is read.
pub fn refuses_bad_input(db: &mut Db) {
    db.execute("CREATE TABLE IF NOT EXISTS orders (id int); TRUNCATE orders; SET outbox.max_payload_bytes = 100");
    let exactly_100 = format!(r#"'{{"k": "{}"}}'"#, "x".repeat(91));
    let over_by_one = format!(r#"'{{"k": "{}"}}'"#, "x".repeat(92));
    assert_eq!(db.value::<i32>(&format!("SELECT octet_length({exactly_100}::jsonb::text)")), 100);
    let cases = [
        ("NULL", "'{}'", "22004", "topic must not be null"),
        ("''", "'{}'", "22023", "topic must not be empty"),
        ("'  '", "'{}'", "22023", "topic must not be empty"),
        ("repeat('t', 256)", "'{}'", "22023", "topic is 256 bytes, more than 255"),
        ("repeat('é', 128)", "'{}'", "22023", "topic is 256 bytes, more than 255"),
        ("'t'", "NULL", "22004", "payload must not be null"),
        ("'t'", over_by_one.as_str(), "22023", "101 bytes of JSON text, more than outbox.max_payload_bytes (100 bytes)"),
    ];
    for (topic, payload, sqlstate, message) in cases {
        db.execute("BEGIN; INSERT INTO orders VALUES (1)");
        let error = db
            .client
            .batch_execute(&format!("SELECT outbox_enqueue({topic}, {payload}::jsonb)"))
            .expect_err("bad input must raise an error");
        let error = error.as_db_error().expect("a database error");
        assert_eq!(error.code().code(), sqlstate, "topic {topic}, payload {payload}");
        assert!(error.message().contains(message), "{:?} should say {message:?}", error.message());
        db.execute("ROLLBACK");
    }
    assert_eq!(db.value::<i64>("SELECT count(*) FROM orders"), 0, "the business write aborted with it");
}

#[test]
fn odd_but_valid_events_are_stored_as_given() {
    let mut db = db();
    let nested = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let long_topic = "t".repeat(255);
    let long_payload = format!(r#"{{"text": "{}"}}"#, "x".repeat(500_000));
    let cases = [
        ("ünïcödé.tøpic ✓", r#"{"emoji": "📦", "escaped": "a\tb\u00e9"}"#),
        ("t", "{}"),
        ("t", nested.as_str()),
        ("t", "42"),
        (long_topic.as_str(), "[]"),
        ("t", long_payload.as_str()),
    ];
    for (topic, payload) in cases {
        let id = db.enqueue(topic, payload);
        let row = db.client.query_one("SELECT topic, payload = $2::text::jsonb FROM outbox WHERE id = $1", &[&id, &payload]).unwrap();
        assert_eq!(row.get::<_, String>(0), topic);
        assert!(row.get::<_, bool>(1), "payload {payload} round-trips");
    }
}

#[test]
fn a_rolled_back_enqueue_leaves_no_row_and_is_never_delivered() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);

    db.execute("BEGIN; SELECT outbox_enqueue('rolled.back', '{}'); ROLLBACK");
    let committed = db.enqueue("committed", "{}");
    // The committed event was enqueued after the rolled-back one; once it has arrived, the
    // rolled-back one would have arrived too if it could.
    wait_until("the committed event arrives", Duration::from_secs(10), || !receiver.deliveries_of(committed).is_empty());
    wait_until("it is marked sent", Duration::from_secs(10), || db.count("sent_at IS NOT NULL") == 1);

    assert!(receiver.deliveries().iter().all(|d| d.json()["type"] == "committed"));
    assert_eq!(db.count_events("topic = 'rolled.back'"), 0);
    assert_eq!(db.count_events("true"), 1);
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_deliveries"), 1);
}

#[test]
fn deliver_at_schedules_every_delivery_and_the_key_is_stored() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let later: i64 = db.value("SELECT outbox_enqueue('reminder', '{}', 'order-7', now() + interval '2 seconds')");
    // Read before the enqueuing transaction commits, so that no worker's claim has moved
    // available_at yet.
    let (past, due_now): (i64, bool) = {
        let mut transaction = db.client.transaction().unwrap();
        let past: i64 = transaction.query_one("SELECT outbox_enqueue('late', '{}', NULL, now() - interval '1 day')", &[]).unwrap().get(0);
        let sql = "SELECT available_at = now() FROM outbox_deliveries WHERE event_id = $1";
        let due_now: bool = transaction.query_one(sql, &[&past]).unwrap().get(0);
        transaction.commit().unwrap();
        (past, due_now)
    };
    assert_eq!(db.value::<Option<String>>(&format!("SELECT key FROM outbox WHERE id = {later}")).as_deref(), Some("order-7"));
    assert!(due_now, "a past deliver_at counts as now: it cannot jump the queue");
    wait_until("the unscheduled event is sent", Duration::from_secs(10), || db.is_sent(past));
    assert!(receiver.deliveries_of(later).is_empty(), "not before its time");
    assert_eq!(db.value::<i64>("SELECT waiting FROM outbox_stats()"), 1, "a scheduled delivery is waiting");
    wait_until("the scheduled event is sent once due", Duration::from_secs(10), || db.is_sent(later));
    let sent_after: bool = db.value(&format!(
        "SELECT d.sent_at >= o.created_at + interval '2 seconds' FROM outbox_deliveries d JOIN outbox o ON o.id = d.event_id WHERE d.event_id = {later}"
    ));
    assert!(sent_after, "delivered no sooner than deliver_at");
    for infinite in ["infinity", "-infinity"] {
        let error = db.client.batch_execute(&format!("SELECT outbox_enqueue('t', '{{}}', NULL, '{infinite}')")).expect_err(infinite);
        assert_eq!(error.code().map(|c| c.code()), Some("22023"), "{error}");
    }
}
