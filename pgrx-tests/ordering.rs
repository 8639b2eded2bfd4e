//! Ordered endpoints: per key, deliveries in event-id order and one at a time, across relay
//! workers and pull consumers; a failing head holds back only its key, a dead one blocks it
//! until requeued or skipped; null keys flow freely; claims never read what waits.

use std::collections::BTreeMap;
use std::time::Duration;

use super::cluster::{db, prepare_claim, wait_until, Db};
use super::receiver::{Receiver, Reply};

/// Makes `name` an ordered pull endpoint for every topic; `extra` adds named arguments.
fn ordered_pull_endpoint(db: &mut Db, name: &str, extra: &str) {
    db.execute(&format!("SELECT outbox_endpoint_set('{name}', NULL, '{{*}}', kind => 'pull', ordered => true{extra})"));
}

/// Enqueues one event per key, in this order, in one transaction; returns their ids.
fn enqueue_keys(db: &mut Db, keys: &[Option<&str>]) -> Vec<i64> {
    let keys: Vec<String> = keys.iter().map(|k| k.map_or("NULL".into(), |k| format!("'{k}'"))).collect();
    db.column(&format!(
        "SELECT outbox_enqueue('job', '{{}}', k) FROM unnest(ARRAY[{}]::text[]) WITH ORDINALITY AS u (k, n) ORDER BY n",
        keys.join(", ")
    ))
}

/// Claims from `endpoint` and returns (event id, attempt), in id order.
fn claim(client: &mut postgres::Client, endpoint: &str) -> Vec<(i64, i32)> {
    client
        .query("SELECT event_id, attempt FROM outbox_claim($1, 100)", &[&endpoint])
        .unwrap_or_else(|e| panic!("outbox_claim: {e}: {:?}", e.as_db_error()))
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn ids(claimed: &[(i64, i32)]) -> Vec<i64> {
    claimed.iter().map(|(id, _)| *id).collect()
}

#[test]
fn a_webhook_endpoint_sends_each_key_in_id_order_one_at_a_time_while_other_keys_flow() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Delay(30));
    db.execute("SELECT outbox_endpoint_drop('default')");
    db.execute(&format!("SELECT outbox_endpoint_set('ordered', '{}', ordered => true)", receiver.url));
    // Five keys, ten events each, in transactions of one to four events, interleaved; and ten
    // events without a key.
    let mut sent: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut n = 0;
    for size in (1..=4).cycle().take(20) {
        let mut keys = Vec::new();
        for _ in 0..size.min(60 - n) {
            keys.push(if n % 6 == 5 { None } else { Some(["a", "b", "c", "d", "e"][n % 5]) });
            n += 1;
        }
        for (key, id) in keys.iter().zip(enqueue_keys(&mut db, &keys)) {
            sent.entry(key.unwrap_or("null").to_string()).or_default().push(id);
        }
    }
    wait_until("every event is sent", Duration::from_secs(60), || db.count_to("ordered", "sent_at IS NULL") == 0);

    let deliveries = receiver.deliveries();
    for (key, expected) in &sent {
        let arrived: Vec<_> = deliveries.iter().filter(|d| expected.contains(&d.id)).collect();
        let arrived_ids: Vec<i64> = arrived.iter().map(|d| d.id).collect();
        if key == "null" {
            assert_eq!(arrived_ids.len(), expected.len(), "every event without a key arrives once");
            continue;
        }
        assert_eq!(&arrived_ids, expected, "key {key} arrives in id order, each event once");
        // The receiver takes 30 ms to answer: a request of the key that arrived sooner after
        // the previous one was sent while that one was still in flight.
        for pair in arrived.windows(2) {
            let gap = pair[1].at.duration_since(pair[0].at);
            assert!(gap >= Duration::from_millis(30), "key {key}: event {} arrived {gap:?} after {}", pair[1].id, pair[0].id);
        }
    }
    assert!(receiver.most_open() > 1, "different keys are in flight at the same time");
    // The last of each key left it without a head; the next claims forget it.
    wait_until("no key is left", Duration::from_secs(10), || db.value::<i64>("SELECT count(*) FROM outbox_keys") == 0);
    db.execute("SELECT outbox_endpoint_drop('ordered')");
}

#[test]
fn a_failing_head_holds_back_only_its_key_and_a_dead_one_blocks_it_until_skipped_or_requeued() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    ordered_pull_endpoint(&mut db, "jobs", ", max_attempts => 2");
    let [a1, a2, a3, b1, b2, free]: [i64; 6] =
        enqueue_keys(&mut db, &[Some("a"), Some("a"), Some("a"), Some("b"), Some("b"), None]).try_into().unwrap();
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![a1, b1, free], "the head of each key, and the event without one");

    // a1 fails and backs off; b goes on.
    assert!(db.value::<bool>(&format!("SELECT outbox_nack('jobs', {a1}, 1, 'boom', retry_in => '0')")));
    db.execute(&format!("SELECT outbox_ack('jobs', {b1}, 1)"));
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a1, 2), (b2, 1)], "a1 is retried; a2 waits behind it");
    assert_eq!(
        db.value::<i64>(&format!("SELECT count(*) FROM outbox_deliveries WHERE event_id IN ({a2}, {a3}) AND attempts = 0 AND waiting")),
        2,
        "waiting for order costs no attempts"
    );

    // a1's last attempt fails: dead, and key a is blocked.
    db.execute(&format!("SELECT outbox_nack('jobs', {a1}, 2, 'boom again')"));
    db.execute(&format!("SELECT outbox_ack('jobs', {b2}, 1)"));
    let stats: (i64, i64, i64) = {
        let row =
            db.client.query_one("SELECT dead, blocked_keys, waiting FROM outbox_endpoint_stats() WHERE endpoint = 'jobs'", &[]).unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(stats, (1, 1, 3), "one dead, blocking one key, with two events behind it (and the leased free one)");
    assert!(claim(&mut db.client, "jobs").is_empty(), "nothing of key a is claimable behind its dead head");

    // Requeued, the dead head goes first again.
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({a1}, 'jobs')")), 1);
    // (Its attempts start afresh; the attempt numbers claims return go on from 2.)
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a1, 3)]);
    db.execute(&format!("SELECT outbox_nack('jobs', {a1}, 3, 'no', retry_in => '0')"));
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a1, 4)]);
    db.execute(&format!("SELECT outbox_nack('jobs', {a1}, 4, 'still no')"));

    // Skipped, it stays dead and the key goes on in order.
    let err = db.client.execute(&format!("SELECT outbox_skip('jobs', {a2})"), &[]).unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("55000"), "only a dead delivery is skipped: {err}");
    assert!(db.value::<bool>(&format!("SELECT outbox_skip('jobs', {a1})")));
    assert!(!db.value::<bool>(&format!("SELECT outbox_skip('jobs', {a1})")), "skipped once, it blocks nothing any more");
    assert_eq!(db.count_to("jobs", &format!("id = {a1} AND dead_at IS NOT NULL")), 1, "a skipped delivery stays dead");
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a2, 1)]);
    db.execute(&format!("SELECT outbox_ack('jobs', {a2}, 1)"));
    // A skipped delivery requeued waits for its turn like any other: behind a3, which is
    // now the head.
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a3, 1)]);
    db.execute(&format!("SELECT outbox_requeue({a1}, 'jobs')"));
    assert!(claim(&mut db.client, "jobs").is_empty(), "a1 waits behind the head a3");
    db.execute(&format!("SELECT outbox_ack('jobs', {a3}, 1)"));
    assert_eq!(claim(&mut db.client, "jobs"), vec![(a1, 5)]);
    db.execute(&format!("SELECT outbox_ack('jobs', {a1}, 5)"));
    db.execute(&format!("SELECT outbox_ack('jobs', {free}, 1)"));
    assert_eq!(db.value::<i64>("SELECT blocked_keys + waiting + pending FROM outbox_endpoint_stats() WHERE endpoint = 'jobs'"), 0);
    db.execute("SELECT outbox_endpoint_drop('jobs')");
}

#[test]
fn two_consumers_never_hold_two_events_of_one_key_and_transactions_keep_their_order() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    ordered_pull_endpoint(&mut db, "jobs", "");
    let mut other = db.connect("pgrx_tests", "postgres");
    let first = enqueue_keys(&mut db, &[Some("a"), Some("b"), Some("a"), Some("c"), Some("b")]);
    let (a1, b1, a2, c1, b2) = (first[0], first[1], first[2], first[3], first[4]);
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![a1, b1, c1]);
    assert!(claim(&mut other, "jobs").is_empty(), "the other consumer finds every key taken");
    db.execute(&format!("SELECT outbox_ack('jobs', {b1}, 1)"));
    assert_eq!(ids(&claim(&mut other, "jobs")), vec![b2], "b's next goes to whoever claims");
    for id in [a1, c1] {
        db.execute(&format!("SELECT outbox_ack('jobs', {id}, 1)"));
    }
    other.execute(&format!("SELECT outbox_ack('jobs', {b2}, 1)"), &[]).unwrap();
    assert_eq!(ids(&claim(&mut other, "jobs")), vec![a2]);
    other.execute(&format!("SELECT outbox_ack('jobs', {a2}, 1)"), &[]).unwrap();

    // Two transactions enqueue key k; the one that took the later id commits first. What is
    // committed when the key's next delivery is chosen goes in id order...
    let mut late = db.connect("pgrx_tests", "postgres");
    late.batch_execute("BEGIN").unwrap();
    let earlier: i64 = late.query_one("SELECT outbox_enqueue('job', '{}', 'k')", &[]).unwrap().get(0);
    let later = enqueue_keys(&mut db, &[Some("k")])[0];
    assert!(earlier < later);
    // ...so the later id goes first here: the earlier one was not committed when it was chosen.
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![later]);
    late.batch_execute("COMMIT").unwrap();
    assert!(claim(&mut db.client, "jobs").is_empty(), "the earlier id waits behind the head");
    db.execute(&format!("SELECT outbox_ack('jobs', {later}, 1)"));
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![earlier]);
    db.execute(&format!("SELECT outbox_ack('jobs', {earlier}, 1)"));

    // Both committed before the key moves on: id order.
    let head = enqueue_keys(&mut db, &[Some("m")])[0];
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![head]);
    late.batch_execute("BEGIN").unwrap();
    let x: i64 = late.query_one("SELECT outbox_enqueue('job', '{}', 'm')", &[]).unwrap().get(0);
    let y = enqueue_keys(&mut db, &[Some("m")])[0];
    late.batch_execute("COMMIT").unwrap();
    db.execute(&format!("SELECT outbox_ack('jobs', {head}, 1)"));
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![x]);
    db.execute(&format!("SELECT outbox_ack('jobs', {x}, 1)"));
    assert_eq!(ids(&claim(&mut db.client, "jobs")), vec![y]);
    db.execute(&format!("SELECT outbox_ack('jobs', {y}, 1)"));

    // No longer ordered: whatever waited is claimable at once, also what a transaction in
    // progress enqueued as waiting (the change waits for that transaction to commit).
    enqueue_keys(&mut db, &[Some("z"), Some("z"), Some("z")]);
    assert_eq!(claim(&mut db.client, "jobs").len(), 1);
    late.batch_execute("BEGIN").unwrap();
    let in_progress: i64 = late.query_one("SELECT outbox_enqueue('job', '{}', 'z')", &[]).unwrap().get(0);
    let mut operator = db.connect("pgrx_tests", "postgres");
    let operator_pid: i32 = operator.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let unordering = std::thread::spawn(move || {
        operator.batch_execute("SELECT outbox_endpoint_set('jobs', NULL, '{*}', kind => 'pull', ordered => false)").unwrap();
    });
    wait_until("the change waits for the enqueue in progress", Duration::from_secs(10), || {
        db.value::<i64>(&format!("SELECT count(*) FROM pg_locks WHERE pid = {operator_pid} AND NOT granted")) == 1
    });
    late.batch_execute("COMMIT").unwrap();
    unordering.join().unwrap();
    let claimed = ids(&claim(&mut db.client, "jobs"));
    assert_eq!(claimed.len(), 3, "the two that waited and the one enqueued meanwhile: {claimed:?}");
    assert!(claimed.contains(&in_progress));
    db.execute("SELECT outbox_endpoint_drop('jobs')");
}

#[test]
fn claims_never_read_the_deliveries_waiting_behind_their_keys() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    ordered_pull_endpoint(&mut db, "jobs", "");
    // 100,000 events on 1,000 keys: each key's head is claimed (in flight), 99 wait behind it.
    db.execute(
        "SELECT outbox_enqueue('job', '{}', 'k' || (n % 1000)) FROM generate_series(0, 99999) AS n; \
         SELECT count(*) FROM outbox_claim('jobs', 1000)",
    );
    db.execute("VACUUM ANALYZE outbox_deliveries");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_deliveries WHERE waiting"), 99_000);
    // The relay's own claim statement, as a worker would run it if `jobs` were a webhook
    // endpoint (the kind changes only inside this transaction, which is rolled back).
    db.execute(&format!(
        "BEGIN; UPDATE outbox_endpoints SET kind = 'webhook', url = 'http://127.0.0.1:9/' WHERE name = 'jobs'; {}",
        prepare_claim()
    ));
    let plan = db
        .column::<String>(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE claim('webhook', '{jobs}', '{100}', '{30000}', '{10}', 67108864, 1)",
        )
        .join("\n");
    db.execute("ROLLBACK; DEALLOCATE claim");
    assert!(plan.contains("outbox_deliveries_pending"), "the claim walks the pending index:\n{plan}");
    // Only the 1,000 leased heads are in the index, and a leased head is not due: the scan
    // stops at once.
    let scanned = plan.lines().find(|line| line.contains("Index Scan using outbox_deliveries_pending")).unwrap_or_default().to_string();
    // "rows=0" up to 17, "rows=0.00" from 18 (which shows the average per loop).
    let rows: Option<f64> = scanned.split("rows=").nth(1).and_then(|rest| rest.split_whitespace().next()?.parse().ok());
    assert_eq!(rows, Some(0.0), "nothing of the 99,000 waiting deliveries is read:\n{plan}");
    let buffers: u64 = plan
        .lines()
        .find_map(|line| line.trim().strip_prefix("Buffers: shared hit="))
        .and_then(|hits| hits.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(buffers < 20, "the claim touched {buffers} pages:\n{plan}");
    db.execute("SELECT outbox_endpoint_drop('jobs')");
}
