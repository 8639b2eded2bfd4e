use std::time::Duration;

use super::cluster::{db, wait_until};

#[test]
fn sent_events_past_the_retention_are_deleted_and_recent_and_dead_ones_stay() {
    let mut db = db();
    db.execute(
        "INSERT INTO outbox (topic, payload, sent_at) SELECT 'old', '{}', now() - interval '2 hours' FROM generate_series(1, 2500);
         INSERT INTO outbox (topic, payload, sent_at) SELECT 'recent', '{}', now() FROM generate_series(1, 10);
         INSERT INTO outbox (topic, payload, dead_at, attempts) SELECT 'dead', '{}', now() - interval '2 hours', 10 FROM generate_series(1, 10);
         INSERT INTO outbox (topic, payload, available_at) SELECT 'pending', '{}', now() + interval '1 hour' FROM generate_series(1, 10)",
    );
    assert_eq!(db.count("topic = 'old'"), 2500, "the default retention (7 days) keeps them");
    db.configure(&[("outbox.retention", "1h")]);
    wait_until("old sent events are deleted, in several batches", Duration::from_secs(30), || db.count("topic = 'old'") == 0);
    assert_eq!(db.count("topic = 'recent'"), 10, "recent sent events stay");
    assert_eq!(db.count("topic = 'dead'"), 10, "dead events stay until requeued or deleted by hand");
    assert_eq!(db.count("topic = 'pending'"), 10, "pending events stay");
}
