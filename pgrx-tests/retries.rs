use std::time::Duration;

use super::cluster::{db, wait_until};
use super::receiver::{Receiver, Reply};

#[test]
fn a_receiver_that_always_fails_sees_exactly_max_attempts_then_the_row_is_dead() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(500));
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.max_attempts", "3")]);

    let id = db.enqueue("always.fails", "{}");
    wait_until("the event is dead", Duration::from_secs(30), || db.is_dead(id));

    let attempts = receiver.deliveries();
    assert_eq!(attempts.len(), 3, "exactly max_attempts attempts");
    assert!(attempts.iter().all(|d| d.id == id), "webhook-id is the row id on every retry");
    assert_eq!(db.value::<String>(&format!("SELECT last_error FROM outbox_deliveries WHERE event_id = {id}")), "HTTP 500");
    assert_eq!(db.value::<i32>(&format!("SELECT attempts FROM outbox_deliveries WHERE event_id = {id}")), 3);
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_stats()"), 1);
    assert_eq!(db.value::<i64>("SELECT pending + waiting FROM outbox_stats()"), 0);

    receiver.set_reply(Reply::Status(204));
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id})")), 1);
    wait_until("the requeued event is delivered", Duration::from_secs(10), || db.is_sent(id));
    assert_eq!(receiver.deliveries_of(id).len(), 4);
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_stats()"), 0);
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id})")), 0, "a sent delivery cannot be requeued");
    assert_eq!(db.value::<i32>("SELECT outbox_requeue(-1)"), 0, "a missing event cannot be requeued");
}

#[test]
fn retry_after_delays_the_next_attempt() {
    let mut db = db();
    let receiver = Receiver::start(Reply::RetryAfter(429, 2));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);

    let id = db.enqueue("slow.down", "{}");
    wait_until("the first attempt arrives", Duration::from_secs(10), || receiver.deliveries_of(id).len() == 1);
    receiver.set_reply(Reply::Status(204));
    wait_until("the retry succeeds", Duration::from_secs(20), || db.is_sent(id));

    let attempts = receiver.deliveries_of(id);
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at - attempts[0].at;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}, sooner than Retry-After: 2");
    assert_eq!(db.value::<String>(&format!("SELECT last_error FROM outbox_deliveries WHERE event_id = {id}")), "HTTP 429 (Retry-After 2s)");
}
