use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

#[test]
fn two_workers_deliver_200_rows_exactly_once_between_them() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.batch_size", "10")]);
    let delivered_before: Vec<i64> =
        db.client.query("SELECT delivered FROM outbox_workers() ORDER BY worker", &[]).unwrap().iter().map(|r| r.get(0)).collect();

    let ids: HashSet<i64> = (0..200).map(|n| db.enqueue("bulk", &format!(r#"{{"n": {n}}}"#))).collect();
    wait_until("all 200 are sent", Duration::from_secs(30), || db.count("sent_at IS NOT NULL") == 200);

    let received: Vec<i64> = receiver.deliveries().iter().map(|d| d.id).collect();
    assert_eq!(received.len(), 200, "no event was delivered twice");
    assert_eq!(received.into_iter().collect::<HashSet<_>>(), ids, "every event was delivered");
    assert_eq!(db.value::<i64>("SELECT count(DISTINCT claimed_by) FROM outbox_deliveries"), 2, "both workers claimed rows");
    let delivered_after: Vec<i64> =
        db.client.query("SELECT delivered FROM outbox_workers() ORDER BY worker", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    for (before, after) in delivered_before.iter().zip(&delivered_after) {
        assert!(after > before, "every worker delivered some: {delivered_before:?} -> {delivered_after:?}");
    }
}

#[test]
fn no_transaction_or_row_lock_is_held_while_a_request_is_in_flight() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    db.configure(&[("outbox.webhook_url", &receiver.url)]);

    let id = db.enqueue("held", "{}");
    wait_until("the request is in flight", Duration::from_secs(10), || receiver.held() == 1);

    let open: i64 = db.value(
        "SELECT count(*) FROM pg_stat_activity
          WHERE backend_type = 'outbox_ext relay' AND datname = current_database() AND (xact_start IS NOT NULL OR backend_xid IS NOT NULL)",
    );
    assert_eq!(open, 0, "no relay worker has a transaction open");
    let locks: i64 = db.value(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE a.backend_type = 'outbox_ext relay' AND a.datname = current_database()",
    );
    assert_eq!(locks, 0, "no relay worker holds a lock");
    db.execute(&format!("BEGIN; SELECT event_id FROM outbox_deliveries WHERE event_id = {id} FOR UPDATE NOWAIT; ROLLBACK"));
    assert_eq!(db.value::<i64>("SELECT sum(in_flight)::bigint FROM outbox_workers()"), 1);

    receiver.release();
    wait_until("the event is sent once answered", Duration::from_secs(10), || db.is_sent(id));
}

#[test]
fn a_terminated_worker_exits_promptly_and_its_abandoned_row_is_delivered_after_the_lease_even_on_its_last_attempt() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    // The lease, the request timeout plus 5 s (15 s), outlasts the worker's 3 s shutdown grace,
    // so nobody else claims the row first, and the request does not time out before the worker
    // is stopped. One attempt allowed: the abandoned one must not count.
    db.configure(&[
        ("outbox.webhook_url", &receiver.url),
        ("outbox.lease", "5s"),
        ("outbox.http_timeout", "10s"),
        ("outbox.max_attempts", "1"),
    ]);

    let id = db.enqueue("abandoned", "{}");
    wait_until("the request is in flight", Duration::from_secs(10), || receiver.held() == 1);
    receiver.set_reply(Reply::Status(204)); // the held request stays unanswered; later ones succeed
    let pid: i32 = db.value(&format!("SELECT claimed_by FROM outbox_deliveries WHERE event_id = {id}"));
    let stopping = Instant::now();
    db.execute(&format!("SELECT pg_terminate_backend({pid})"));
    wait_until("the worker has exited", Duration::from_secs(10), || {
        db.value::<i64>(&format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")) == 0
    });
    let stopped_in = stopping.elapsed();
    assert!(stopped_in < Duration::from_secs(5), "the worker took {stopped_in:?} to stop");
    assert_eq!(db.count(&format!("id = {id} AND sent_at IS NULL")), 1, "an unanswered event is not marked sent");

    wait_until("the abandoned event is delivered again", Duration::from_secs(30), || db.is_sent(id));
    assert_eq!(receiver.deliveries_of(id).len(), 2, "delivered again once the lease ran out");
    assert_eq!(
        db.value::<i32>(&format!("SELECT attempts FROM outbox_deliveries WHERE event_id = {id}")),
        1,
        "the abandoned attempt did not count"
    );
    wait_until("the worker is back", Duration::from_secs(30), || db.value::<i64>("SELECT count(*) FROM outbox_workers()") == 2);
}

#[test]
fn a_claim_that_waited_for_a_lock_leases_its_rows_from_when_it_took_them() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    // The lease is the request timeout plus 5 s (15 s); the request hangs until that timeout,
    // so the lease is read before any outcome.
    // No retention pass, which could be the statement a worker waits in.
    db.configure(&[
        ("outbox.webhook_url", &receiver.url),
        ("outbox.http_timeout", "10s"),
        ("outbox.lease", "1s"),
        ("outbox.retention", "0"),
    ]);
    let (database, user): (String, String) = (db.value("SELECT current_database()::text"), db.value("SELECT current_user::text"));
    let mut locker = db.connect(&database, &user);
    // The event is due at once, but its endpoint is disabled, so no claim has begun (and waits)
    // before the lock below: the claims that wait for it begin after the endpoint is back.
    db.execute("SELECT outbox_endpoint_disable('default')");
    let id = db.enqueue("locked.out", "{}");
    // What an endpoint being dropped holds while it waits for, or deletes, its history.
    locker.batch_execute("BEGIN; LOCK TABLE outbox_deliveries IN SHARE MODE").unwrap();
    let enabled: SystemTime = db.value("UPDATE outbox_endpoints SET disabled_at = NULL WHERE name = 'default' RETURNING clock_timestamp()");
    // Both workers: with nothing in flight and no retention, what they wait in is a claim.
    db.wait_for("both workers' claims, begun once the endpoint was back, have waited 3 s for the lock", Duration::from_secs(30), |db| {
        let sql = "SELECT count(*) = 2 FROM pg_stat_activity
                    WHERE backend_type = 'outbox_ext relay' AND datname = current_database() AND wait_event_type = 'Lock'
                      AND xact_start > $1 AND clock_timestamp() - xact_start > interval '3 seconds'";
        db.client.query_one(sql, &[&enabled]).unwrap().get(0)
    });
    let unlocked: SystemTime = locker.query_one("SELECT clock_timestamp()", &[]).unwrap().get(0);
    locker.batch_execute("COMMIT").unwrap();

    wait_until("the request is in flight", Duration::from_secs(10), || receiver.held() == 1);
    let lease_left: f64 = db
        .client
        .query_one("SELECT extract(epoch FROM available_at - $1)::float8 FROM outbox_deliveries WHERE event_id = $2", &[&unlocked, &id])
        .unwrap()
        .get(0);
    assert!(lease_left >= 15.0, "the lease runs {lease_left} s from when the lock was released, not 15 s");
    receiver.release();
    wait_until("the event is sent once answered", Duration::from_secs(10), || db.is_sent(id));
}

#[test]
fn a_delivery_left_on_its_last_attempt_by_a_worker_that_died_is_dead_not_attempted_again() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.max_attempts", "2")]);
    // Three deliveries as a worker that died in the middle of their requests leaves them, their
    // leases just run out (scheduled an hour ahead first, so no worker takes them meanwhile):
    // one on its last attempt, one with an attempt left, and one that had used every attempt
    // the endpoint now allows (its cap was lowered) after a failure that was recorded.
    let scheduled = "SELECT outbox_enqueue('died.last', '{}', NULL, now() + interval '1 hour')";
    let (last, spare, over) = (db.value::<i64>(scheduled), db.value::<i64>(scheduled), db.value::<i64>(scheduled));
    db.execute(&format!(
        "UPDATE outbox_deliveries
            SET available_at = now(),
                attempts = CASE event_id WHEN {last} THEN 2 WHEN {spare} THEN 1 ELSE 3 END,
                claimed_by = CASE WHEN event_id = {over} THEN NULL ELSE 2147483647 END,
                last_error = CASE WHEN event_id = {over} THEN 'HTTP 500' END
          WHERE event_id IN ({last}, {spare}, {over})"
    ));

    wait_until("a claim finds them", Duration::from_secs(10), || db.is_sent(spare) && db.is_dead(last) && db.is_dead(over));
    assert!(receiver.deliveries_of(last).is_empty() && receiver.deliveries_of(over).is_empty(), "no attempt beyond max_attempts");
    assert_eq!(receiver.deliveries_of(spare).len(), 1, "the one with an attempt left is sent");
    let errors =
        db.column::<String>(&format!("SELECT last_error FROM outbox_deliveries WHERE event_id IN ({last}, {over}) ORDER BY event_id"));
    assert_eq!(errors, ["the lease of attempt 2 ran out with no outcome recorded", "HTTP 500"]);
    assert_eq!(db.value::<i64>(&format!("SELECT count(claimed_by) FROM outbox_deliveries WHERE event_id IN ({last}, {over})")), 0);
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_stats()"), 2);
}

#[test]
fn the_workers_report_their_updates_to_the_statistics_autovacuum_reads() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let updates = "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'outbox_deliveries'";
    let before: i64 = db.value(updates);

    let id = db.enqueue("counted", "{}");
    wait_until("the event is sent", Duration::from_secs(10), || db.is_sent(id));
    // A claim and an acknowledgement: two updates, which only the workers could have made.
    wait_until("the workers' updates are counted", Duration::from_secs(10), || db.value::<i64>(updates) >= before + 2);
}

#[test]
fn after_the_extension_is_dropped_and_created_again_in_place_the_workers_deliver_and_record() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let before = db.enqueue("before", "{}");
    wait_until("an event is sent", Duration::from_secs(10), || db.is_sent(before));
    let pids = db.worker_pids();

    // Same schema, same table names: the workers' statements keep working, but the rows are
    // new ones, which acknowledgements meant for the old rows must not mark.
    db.execute("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext SCHEMA public");
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let after = db.enqueue("after", "{}");
    wait_until("the new installation's event is delivered and recorded", Duration::from_secs(10), || db.is_sent(after));
    assert_eq!(receiver.deliveries_of(after).len(), 1);
    assert_eq!(db.worker_pids(), pids, "no worker restarted");
}

#[test]
fn plans_made_on_a_near_empty_table_never_scan_the_deliveries_whole_as_the_backlog_grows() {
    // db() empties the tables: the workers plan their statements again at their next use.
    let mut db = db();
    let (ok, failing) = (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(500)));
    db.configure(&[("outbox.webhook_url", &ok.url)]);
    db.execute(&format!("SELECT outbox_endpoint_set('failing', '{}')", failing.url));
    let attempts = |db: &mut Db| -> (i64, i64) {
        let row = db.client.query_one("SELECT sum(delivered)::bigint, sum(failed)::bigint FROM outbox_workers()", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    // Rows read by table scans of either table, rows fetched through the indexes of the
    // deliveries (by index scans and bitmap scans alike), and their updates.
    let table_stats = |db: &mut Db| -> [i64; 4] {
        let row = db
            .client
            .query_one(
                "SELECT d.seq_tup_read, o.seq_tup_read, d.idx_tup_fetch, d.n_tup_upd
                   FROM pg_stat_user_tables AS d, pg_stat_user_tables AS o
                  WHERE d.relid = 'outbox_deliveries'::regclass AND o.relid = 'outbox'::regclass",
                &[],
            )
            .unwrap();
        [row.get(0), row.get(1), row.get(2), row.get(3)]
    };
    // One event first: its claim, acknowledgement and failure are planned with a row or two in
    // the table, as after CREATE EXTENSION or a TRUNCATE, when the statistics say as little.
    let (delivered, failed) = attempts(&mut db);
    db.enqueue("first", "{}");
    wait_until("the first event is sent to one endpoint and failed at the other", Duration::from_secs(10), || {
        let (d, f) = attempts(&mut db);
        d > delivered && f > failed
    });
    let [deliveries_read, events_read, fetched, updated] = table_stats(&mut db);

    // Then a backlog: 2,000 events, each sent to one endpoint and failing at the other.
    let (delivered, failed) = attempts(&mut db);
    db.execute("SELECT count(outbox_enqueue('backlog', '{}')) FROM generate_series(1, 2000)");
    wait_until("every event is sent once and failed at least once", Duration::from_secs(60), || {
        let (d, f) = attempts(&mut db);
        d >= delivered + 2000 && f >= failed + 2000
    });
    // Claims, acknowledgements and failures: 8,000 updates at least, counted once the workers
    // report their statistics, with the rows their scans read.
    wait_until("the workers' updates are counted", Duration::from_secs(10), || table_stats(&mut db)[3] >= updated + 8000);
    let [deliveries_read_after, events_read_after, fetched_after, _] = table_stats(&mut db);
    assert_eq!(deliveries_read_after, deliveries_read, "no batch read outbox_deliveries whole");
    assert_eq!(events_read_after, events_read, "no batch read outbox whole");
    // About 4 per delivery (its claims, acknowledgement or failures, retries); an index read
    // whole for each batch would fetch the backlog each time, hundreds of thousands of rows.
    assert!(fetched_after - fetched < 100_000, "{} rows fetched through the indexes of outbox_deliveries", fetched_after - fetched);
    db.execute("SELECT outbox_endpoint_drop('failing')");
}
