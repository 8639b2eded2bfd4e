use std::time::Duration;

use super::cluster::{db, wait_until};
use super::receiver::{Receiver, Reply};

#[test]
fn sent_events_past_the_retention_and_dead_ones_past_the_dead_retention_are_deleted_and_the_rest_stay() {
    let mut db = db();
    db.insert_deliveries("old", 2500, "sent_at", "now() - interval '2 hours'");
    db.insert_deliveries("recent", 10, "sent_at", "now()");
    db.insert_deliveries("dead", 10, "dead_at, attempts", "now() - interval '2 hours', 10");
    db.insert_deliveries("pending", 10, "available_at", "now() + interval '1 hour'");
    // Sent long ago to default, still pending at another endpoint: the event stays.
    db.insert_deliveries("elsewhere", 10, "sent_at", "now() - interval '2 hours'");
    db.execute(
        "INSERT INTO outbox_endpoints (name, url) VALUES ('other', 'http://127.0.0.1:9/');
         UPDATE outbox_endpoints SET disabled_at = now() WHERE name = 'other';
         INSERT INTO outbox_deliveries (event_id, endpoint) SELECT id, 'other' FROM outbox WHERE topic = 'elsewhere'",
    );
    assert_eq!(db.count("topic = 'old'"), 2500, "the default retention (7 days) keeps them");
    db.configure(&[("outbox.retention", "1h")]);
    wait_until("old sent events are deleted, in several batches", Duration::from_secs(30), || {
        db.count("topic IN ('old', 'elsewhere')") == 0
    });
    assert_eq!(db.count("topic = 'recent'"), 10, "recent sent events stay");
    assert_eq!(db.count("topic = 'dead'"), 10, "dead events stay for outbox.dead_retention (30 days)");
    assert_eq!(db.count("topic = 'pending'"), 10, "pending events stay");
    assert_eq!(db.count_events("topic = 'elsewhere'"), 10, "an event still pending at another endpoint stays");
    assert_eq!(db.count("topic = 'elsewhere'"), 0, "while its old sent delivery goes");

    db.insert_deliveries("dead.recently", 10, "dead_at, attempts", "now() - interval '10 minutes', 10");
    // The dead head of an ordered key, long dead, with a delivery waiting behind it.
    db.execute("SELECT outbox_endpoint_set('queue', NULL, '{queued}', kind => 'pull', ordered => true, max_attempts => 1)");
    let head = db.value::<i64>("SELECT outbox_enqueue('queued', '{}', key => 'k')");
    db.execute("SELECT outbox_enqueue('queued', '{}', key => 'k')");
    db.execute(&format!("SELECT outbox_nack('queue', event_id, attempt, 'no') FROM outbox_claim('queue') WHERE event_id = {head}"));
    db.execute(&format!("UPDATE outbox_deliveries SET dead_at = now() - interval '2 hours' WHERE event_id = {head}"));
    db.configure(&[("outbox.dead_retention", "1h")]);
    wait_until("deliveries dead for longer than outbox.dead_retention go, with their events", Duration::from_secs(30), || {
        db.count_events("topic = 'dead'") == 0
    });
    assert_eq!(db.count("topic = 'dead.recently'"), 10, "recently dead ones stay");
    assert_eq!(
        db.count_to("queue", &format!("id = {head} AND dead_at IS NOT NULL")),
        1,
        "the dead head of a key stays, to be requeued or skipped"
    );
    assert!(db.value::<bool>(&format!("SELECT outbox_skip('queue', {head})")));
    db.execute("SELECT outbox_endpoint_drop('queue')");
    assert_eq!(db.count("topic = 'pending'"), 10, "pending ones stay");
    db.execute("ALTER SYSTEM RESET outbox.dead_retention");
    db.configure(&[]);
}

#[test]
fn retention_keeps_an_event_that_a_replay_in_progress_is_giving_a_new_delivery() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.insert_deliveries("late.replayed", 1, "sent_at", "now() - interval '2 hours'");
    db.insert_deliveries("other", 1, "sent_at", "now() - interval '2 hours'");
    let (replayed, other): (i64, i64) =
        (db.value("SELECT id FROM outbox WHERE topic = 'late.replayed'"), db.value("SELECT id FROM outbox WHERE topic = 'other'"));
    db.execute(&format!("SELECT outbox_endpoint_set('late', '{}', '{{late.*}}')", receiver.url));
    // A back-fill of the new endpoint, not committed yet when retention looks at the event.
    let mut operator = db.connect("pgrx_tests", "postgres");
    operator.batch_execute("BEGIN; SELECT outbox_replay('late', now() - interval '1 day')").unwrap();
    db.configure(&[("outbox.retention", "1h")]);
    wait_until("a retention pass deleted the other old event", Duration::from_secs(30), || db.count_events(&format!("id = {other}")) == 0);
    assert_eq!(db.count_events(&format!("id = {replayed}")), 1, "the event being replayed stays");

    operator.batch_execute("COMMIT").unwrap();
    wait_until("the replayed event is delivered to the new endpoint", Duration::from_secs(30), || {
        db.count_to("late", &format!("id = {replayed} AND sent_at IS NOT NULL")) == 1
    });
    assert_eq!(receiver.deliveries_of(replayed).len(), 1);
}
