use std::time::Duration;

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

/// What a consumer does with each delivery: apply the effect and record the id in one
/// transaction, skipping the effect for an id it has seen.
fn apply(db: &mut Db, event_id: i64, consumer: &str) {
    db.client
        .execute(
            "WITH first_time AS (SELECT outbox_mark_processed($1, $2) AS yes)
             UPDATE balances SET total = total + 10 FROM first_time WHERE first_time.yes",
            &[&event_id, &consumer],
        )
        .unwrap();
}

#[test]
fn a_consumer_using_mark_processed_applies_each_event_once() {
    let mut db = db();
    db.execute("DROP TABLE IF EXISTS balances; CREATE TABLE balances (total int); INSERT INTO balances VALUES (0)");
    // The receiver fails the first attempt after the consumer applied it, as a consumer that
    // crashes before answering would: the event is delivered again.
    let receiver = Receiver::start(Reply::Status(503));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let id = db.enqueue("payment.received", r#"{"amount": 10}"#);
    wait_until("the first attempt arrives", Duration::from_secs(10), || receiver.deliveries_of(id).len() == 1);
    receiver.set_reply(Reply::Status(204));
    wait_until("the event is sent", Duration::from_secs(20), || db.is_sent(id));

    let deliveries = receiver.deliveries_of(id);
    assert_eq!(deliveries.len(), 2, "the same event arrived twice");
    for delivery in &deliveries {
        apply(&mut db, delivery.id, "billing");
    }
    assert_eq!(db.value::<i32>("SELECT total FROM balances"), 10, "applied once");

    apply(&mut db, id, "analytics");
    assert_eq!(db.value::<i32>("SELECT total FROM balances"), 20, "each consumer applies it once");

    db.execute("BEGIN; SELECT outbox_mark_processed(-5, 'billing'); ROLLBACK");
    assert!(db.value::<bool>("SELECT outbox_mark_processed(-5, 'billing')"), "a rolled-back mark is forgotten");
    assert!(!db.value::<bool>("SELECT outbox_mark_processed(-5, 'billing')"));
    assert!(db.value::<bool>("SELECT outbox_mark_processed(-5)"), "the default consumer is separate");
}
