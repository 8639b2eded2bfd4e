use std::time::Duration;

use super::cluster::{db, wait_until, Db};
use super::receiver::{refusal, Receiver, Reply};

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
    // Each failed attempt is in the history, with the receiver's status and answer.
    let history = db.column::<String>(&format!(
        "SELECT concat_ws(' | ', attempt, status, error, response, duration_ms > 0 AND duration_ms < 10000)
           FROM outbox_attempts WHERE event_id = {id} ORDER BY attempt"
    ));
    let expected: Vec<String> = (1..=3).map(|n| format!("{n} | 500 | HTTP 500 | {} | t", refusal(500))).collect();
    assert_eq!(history, expected);

    receiver.set_reply(Reply::Status(204));
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id})")), 1);
    wait_until("the requeued event is delivered", Duration::from_secs(10), || db.is_sent(id));
    assert_eq!(receiver.deliveries_of(id).len(), 4);
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_stats()"), 0);
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id})")), 0, "a sent delivery cannot be requeued");
    assert_eq!(db.value::<i32>("SELECT outbox_requeue(-1)"), 0, "a missing event cannot be requeued");
    assert_eq!(db.value::<i64>(&format!("SELECT count(*) FROM outbox_attempts WHERE event_id = {id}")), 3, "a success adds no history");
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

/// The relay's statements that record an attempt's outcome, as the workers run them.
fn relay_statement(text: &str) -> String {
    text.replace("@extschema@", "public")
}

#[test]
fn the_relay_records_an_outcome_only_while_its_claim_is_the_latest_even_after_a_requeue() {
    let mut db = db();
    // A disabled endpoint, so that no worker claims the delivery: the test plays the workers'
    // claims (attempts and fence raised, as sql/claim_batch.sql does) and runs their
    // statements for the outcomes.
    db.execute("SELECT outbox_endpoint_set('fenced-relay', 'http://127.0.0.1:9/', '{fenced.relay}'); SELECT outbox_endpoint_disable('fenced-relay')");
    let id = db.enqueue("fenced.relay", "{}");
    let claim = format!(
        "UPDATE outbox_deliveries SET attempts = attempts + 1, fence = fence + 1, claimed_by = pg_backend_pid(), available_at = now() - interval '1 second'
          WHERE endpoint = 'fenced-relay' AND event_id = {id} RETURNING fence"
    );
    let first: i32 = db.value(&claim);
    db.execute(&format!("SELECT outbox_requeue({id}, 'fenced-relay')"));
    let second: i32 = db.value(&claim);
    assert_ne!(first, second, "the claim after a requeue has a fence of its own");
    let extension: u32 = db.value("SELECT 'outbox_deliveries'::regclass::oid");
    let endpoints = vec!["fenced-relay".to_string()];

    // The first attempt's failure and success arrive late: neither touches the live claim.
    let failed = db
        .client
        .query(
            &relay_statement(include_str!("../sql/record_failures.sql")),
            &[
                &endpoints,
                &vec![id],
                &vec![first],
                &vec!["HTTP 500".to_string()],
                &vec![60_000f64],
                &vec![10i32],
                &extension,
                &vec![Some(500i32)],
                &vec![12.5f64],
                &vec![Some("busy".to_string())],
            ],
        )
        .expect("record_failures.sql");
    assert!(failed.is_empty(), "a stale failure was recorded");
    assert_eq!(db.value::<i64>(&format!("SELECT count(*) FROM outbox_attempts WHERE event_id = {id}")), 0, "nor kept in the history");
    db.client
        .query(&relay_statement(include_str!("../sql/mark_sent.sql")), &[&endpoints, &vec![id], &vec![first], &extension])
        .expect("mark_sent.sql");
    let live = |db: &mut Db| {
        db.count_to("fenced-relay", &format!("id = {id} AND sent_at IS NULL AND last_error IS NULL AND claimed_by IS NOT NULL"))
    };
    assert_eq!(live(&mut db), 1, "the live claim is untouched");

    // The live claim's own outcome is recorded.
    db.client
        .query(&relay_statement(include_str!("../sql/mark_sent.sql")), &[&endpoints, &vec![id], &vec![second], &extension])
        .expect("mark_sent.sql");
    assert_eq!(db.count_to("fenced-relay", &format!("id = {id} AND sent_at IS NOT NULL")), 1);
    db.execute("SELECT outbox_endpoint_drop('fenced-relay')");
}
