//! Log mode's database side (sql/log.sql): what an enqueue writes, what the slot carries
//! (read as Debezium's connector reads it: pgoutput over the publication), the reader's lease,
//! the copy into the table path, and recovery from a lost slot.

use std::time::Duration;

use outbox_core::log::batch::Route;
use outbox_core::log::routes::{RouteCache, TopicRoute};
use outbox_core::log::{read_events, LogRead};

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};
use super::security::{assert_nothing_planted_ran, mallory_and_planted_calls, plant};

/// Takes the reader's lease as a new relay would (fence 0); its fence and the slot's state.
fn lease(db: &mut Db) -> Option<(i64, String)> {
    let rows = db.client.query("SELECT reader_fence, slot_state FROM outbox_log_lease(0, 60000)", &[]).expect("lease");
    rows.first().map(|row| (row.get(0), row.get(1)))
}

/// Reads what the slot holds, and the oldest transaction running when the read began.
fn read(db: &mut Db, fence: i64) -> (LogRead, i64) {
    let rows = db.client.query("SELECT data, xmin, log_relation FROM outbox_log_read($1, 10000)", &[&fence]).expect("read");
    let messages: Vec<Vec<u8>> = rows.iter().filter_map(|row| row.get(0)).collect();
    let oldest = rows.last().map_or(0, |row| row.get(1));
    let log_relation = rows.last().map_or(0, |row| row.get::<_, i64>(2) as u32);
    (read_events(messages.iter().map(Vec::as_slice), log_relation).expect("pgoutput messages of outbox_log"), oldest)
}

/// Where the relay sends what was read: the routes of its topics (outbox_log_route), and the
/// body of each delivery it sends at once.
fn route(db: &mut Db, read: &LogRead) -> Vec<Route> {
    let mut cache = RouteCache::default();
    let topics = cache.missing(&read.events, 0);
    let rows = db.client.query("SELECT topic, endpoint, sendable, ordered FROM outbox_log_route($1)", &[&topics]).expect("route");
    let found = rows.iter().map(|r| TopicRoute { topic: r.get(0), endpoint: r.get(1), sendable: r.get(2), ordered: r.get(3) }).collect();
    cache.insert(topics, found);
    cache.routes(&read.events)
}

fn confirm(db: &mut Db, fence: i64, read: &LogRead, oldest: i64) -> bool {
    let end = read.end.expect("a whole transaction was read") as i64;
    db.client.query_one("SELECT outbox_log_confirm($1, $2, $3)", &[&fence, &end, &oldest]).expect("confirm").get(0)
}

/// Back to table mode with no slot and no lease, as every other test expects. The workers stop
/// reading once recover_from is null; the slot is dropped once no read holds it.
fn leave_log_mode(db: &mut Db) {
    db.execute("SELECT outbox_set_mode('table')");
    db.execute(
        "UPDATE outbox_log_state SET confirmed_lsn = NULL, confirmed_at = NULL, recover_from = NULL, reader_until = NULL, recovering = false,
                                     table_since = NULL, logged_below = NULL",
    );
    db.wait_for("the log's slot is dropped", Duration::from_secs(10), |db| {
        db.client
            .batch_execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'outbox_log_%'")
            .is_ok()
    });
    db.execute("TRUNCATE outbox_log");
}

/// Log mode on, with its slot made (as a relay makes it) and the lease held by the test, not
/// the workers (taken in the transaction that turns log mode on); returns the fence.
fn enter_log_mode(db: &mut Db) -> i64 {
    leave_log_mode(db);
    let mut both = db.client.transaction().expect("begin");
    both.batch_execute("SELECT outbox_set_mode('log')").expect("log mode");
    let row = both.query_one("SELECT reader_fence, slot_state FROM outbox_log_lease(0, 600000)", &[]).expect("the lease");
    both.commit().expect("commit");
    let (fence, state): (i64, String) = (row.get(0), row.get(1));
    assert_eq!(state, "missing", "no slot before a relay makes it");
    assert!(db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")));
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 0, "nothing was enqueued before");
    fence
}

#[test]
fn an_enqueue_in_log_mode_writes_one_row_and_the_slot_carries_what_debezium_routes_by() {
    let mut db = db();
    let error = db.client.batch_execute("SELECT outbox_set_mode('stream')").expect_err("not a mode");
    assert_eq!(error.as_db_error().map(|e| e.code().code()), Some("22023"), "{error}");
    // Each session tries first where its last event went: this one's last went into the table.
    leave_log_mode(&mut db);
    let in_table: i64 = db.value("SELECT outbox_enqueue('order.placed', '{}')");
    assert_eq!(db.count_events(&format!("id = {in_table}")), 1);
    let fence = enter_log_mode(&mut db);
    assert_eq!(db.value::<i64>("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_log' AND tablename = 'outbox_log'"), 1);
    assert!(
        db.value::<i64>("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_log'::regclass") >= 7,
        "the next hours' partitions"
    );

    let (events, deliveries) = (db.count_events("true"), db.value::<i64>("SELECT count(*) FROM outbox_deliveries"));
    let id: i64 = db.value("SELECT outbox_enqueue('order.placed', '{\"total\": 42}', 'order-7')");
    db.execute("BEGIN; SELECT outbox_enqueue('order.placed', '{\"rolled\": \"back\"}'); ROLLBACK");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log"), 1, "one row, and none for the rolled-back enqueue");
    assert_eq!(
        (db.count_events("true"), db.value::<i64>("SELECT count(*) FROM outbox_deliveries")),
        (events, deliveries),
        "no table-mode row"
    );
    // Scheduled events take the table path, which keeps them until they are due.
    let scheduled: i64 = db.value("SELECT outbox_enqueue('order.placed', '{}', deliver_at => now() + interval '1 hour')");
    assert_eq!(db.count_events(&format!("id = {scheduled}")), 1);

    // What Debezium's outbox event router takes: id, the aggregate type and type (topic), the
    // aggregate id (key) and the payload, from the table's inserts over the publication.
    let (log, oldest) = read(&mut db, fence);
    assert_eq!(log.events.len(), 1, "{log:?}");
    let event = &log.events[0];
    assert_eq!((event.id, event.topic.as_str(), event.key.as_deref()), (id, "order.placed", Some("order-7")));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&event.payload).unwrap(), serde_json::json!({"total": 42}));

    // Another relay gets no lease while this one's runs, and cannot confirm.
    assert_eq!(lease(&mut db), None);
    assert!(!db.value::<bool>(&format!("SELECT outbox_log_confirm({}, 0, 0)", fence + 1)));
    assert!(confirm(&mut db, fence, &log, oldest));
    // The one after a scheduled event goes into the log again.
    let next: i64 = db.value("SELECT outbox_enqueue('order.placed', '{}')");
    let ids: Vec<i64> = read(&mut db, fence).0.events.iter().map(|event| event.id).collect();
    assert_eq!(ids, [next], "confirmed events are not read again");

    leave_log_mode(&mut db);
    let back: i64 = db.value("SELECT outbox_enqueue('order.placed', '{}')");
    assert_eq!(db.count_events(&format!("id = {back}")), 1, "back in table mode, the session's next event is in the table");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log"), 0);
}

#[test]
fn events_routed_where_only_the_table_path_goes_are_copied_there_and_delivered() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.execute(&format!(
        "SELECT outbox_endpoint_set('log-hook', '{}', '{{log.*}}');
         SELECT outbox_endpoint_set('log-ordered', '{}', '{{log.*}}', ordered => true);
         SELECT outbox_endpoint_set('log-pull', NULL, '{{log.*}}', kind => 'pull');",
        receiver.url, receiver.url
    ));
    let fence = enter_log_mode(&mut db);
    db.execute("SELECT outbox_enqueue('log.one', '{\"n\": 1}', 'k'); SELECT outbox_enqueue('log.two', '{\"n\": 2}');");
    let (log, _) = read(&mut db, fence);
    let routes = route(&mut db, &log);
    let routes: Vec<_> = routes.into_iter().filter(|r| r.endpoint.starts_with("log-")).collect();
    let routed: Vec<(i32, String, bool)> = routes.iter().map(|r| (r.event, r.endpoint.clone(), r.body.is_some())).collect();
    assert_eq!(
        routed,
        [
            (1, "log-hook", true),
            (1, "log-ordered", false),
            (1, "log-pull", false),
            (2, "log-hook", true),
            (2, "log-ordered", true),
            (2, "log-pull", false)
        ]
        .map(|(e, n, d)| (e, n.to_string(), d))
        .to_vec(),
        "the ordered endpoint's keyed event and the pull endpoint's go through the table path"
    );
    let body: serde_json::Value = serde_json::from_str(routes[0].body.as_deref().unwrap()).unwrap();
    assert_eq!((body["type"].as_str(), &body["data"]), (Some("log.one"), &serde_json::json!({"n": 1})), "a claim's body");

    // The relay copies those (and any delivery that failed) into the table path.
    let copy = |db: &mut Db| -> i64 {
        let event = &log.events[0];
        db.client
            .query_one(
                "SELECT outbox_log_defer(ARRAY[$1, $1]::bigint[], ARRAY[$2, $2], ARRAY[$3, $3], ARRAY[$4, $4]::text[], ARRAY[$5, $5],
                                         ARRAY['log-ordered', 'log-pull'], ARRAY[0, 0], ARRAY[NULL, NULL]::text[], ARRAY[0, 0]::float8[])",
                &[&event.id, &event.topic, &event.payload, &event.key, &event.created_at],
            )
            .expect("defer")
            .get(0)
    };
    assert_eq!(copy(&mut db), 2);
    assert_eq!(copy(&mut db), 0, "a batch read twice is copied once");
    let id = log.events[0].id;
    let claimed: i64 = db.value("SELECT count(*) FROM outbox_claim('log-pull', 10)");
    assert_eq!(claimed, 1, "the pull consumer claims it");
    db.wait_for("the workers send the ordered endpoint's copy", Duration::from_secs(30), |db| {
        db.count_to("log-ordered", &format!("id = {id} AND sent_at IS NOT NULL")) == 1
    });
    assert_eq!(receiver.deliveries_of(id).len(), 1);

    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop(n) FROM unnest(ARRAY['log-hook', 'log-ordered', 'log-pull']) AS n");
}

#[test]
fn a_body_routed_from_the_log_is_byte_for_byte_what_a_claim_builds() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.execute(&format!("SELECT outbox_endpoint_set('log-bytes', '{}', '{{log.bytes.*}}')", receiver.url));
    let fence = enter_log_mode(&mut db);
    // Whatever the session's date style, and in time zones a whole number of hours from UTC
    // or not (a claim writes both with their minutes).
    for zone in ["UTC", "Asia/Kolkata", "America/St_Johns"] {
        db.execute(&format!("SET DateStyle = 'SQL, DMY'; SET TimeZone = '{zone}'"));
        db.execute(
            r#"SELECT outbox_enqueue('log.bytes.é', '{"s": "é\"\u0001\n</script>", "n": 1.50, "big": 123456789012345678901234567890, "e": 1e-7, "a": [true, null, {"k": []}]}');
               SELECT outbox_enqueue(E'log.bytes.\t"\\', '"just a string"'), outbox_enqueue('log.bytes.b', '[]');"#,
        );
        let (log, oldest) = read(&mut db, fence);
        let routes = route(&mut db, &log);
        let routed: Vec<_> = routes.iter().filter(|r| r.endpoint == "log-bytes").collect();
        assert_eq!(routed.len(), 3);
        for route in routed {
            let id = log.events[route.event as usize - 1].id;
            let claims: String = db.value(&format!(
                "SELECT json_build_object('type', topic, 'timestamp', created_at, 'data', payload)::text FROM outbox_log WHERE id = {id}"
            ));
            assert_eq!(
                route.body.as_deref(),
                Some(claims.as_str()),
                "event {id} in {zone}: the body a claim builds (sql/claim.sql) from the same row"
            );
        }
        assert!(confirm(&mut db, fence, &log, oldest));
    }
    db.execute("RESET DateStyle; RESET TimeZone");

    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-bytes')");
}

#[test]
fn a_dropped_slot_is_made_again_and_every_event_not_confirmed_is_delivered() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.execute(&format!("SELECT outbox_endpoint_set('log-lost', '{}', '{{lost.*}}')", receiver.url));
    let fence = enter_log_mode(&mut db);
    let confirmed = db.enqueue("lost.before", "{}");
    let (log, oldest) = read(&mut db, fence);
    assert!(confirm(&mut db, fence, &log, oldest));
    let unconfirmed = [db.enqueue("lost.after", "{\"n\": 1}"), db.enqueue("lost.after", "{\"n\": 2}")];

    // What a failover to a standby (which has no slot in PostgreSQL 15) or a DROP leaves.
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    assert_eq!(lease(&mut db), None, "the lease is still this relay's");
    let state: String = db.value(&format!("SELECT slot_state FROM outbox_log_lease({fence}, 60000)"));
    assert_eq!(state, "missing");
    // Only at READ COMMITTED: at REPEATABLE READ, what commits while the slot is being made
    // would be neither in it nor recovered.
    let refused = db.client.batch_execute(&format!("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT outbox_log_make_slot({fence})"));
    let message = refused.expect_err("refused at REPEATABLE READ").as_db_error().map(|e| e.message().to_string());
    assert!(message.is_some_and(|m| m.contains("READ COMMITTED")));
    db.execute("ROLLBACK");
    assert!(db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")));
    // Committed once the slot was made: the new slot holds it, and recovery leaves it there.
    let during = db.enqueue("lost.during", "{}");
    // Until recovered, the new slot is neither read nor confirmed: a confirmation would move
    // the recovery past the two events only the recovery copies.
    let rows: i64 = db.value(&format!("SELECT count(*) FROM outbox_log_read({fence}, 10000)"));
    assert_eq!(rows, 0, "no read while recovering");
    assert!(!db.value::<bool>(&format!("SELECT outbox_log_confirm({fence}, (pg_current_wal_lsn() - '0/0')::bigint, 0)")));
    // Each to log-lost and to the endpoint default, which takes every topic.
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 4, "the two events not confirmed");
    assert_eq!(db.count_events(&format!("id = {during}")), 0, "an event the new slot holds is not recovered");
    for id in unconfirmed {
        db.wait_for("the workers deliver a recovered event", Duration::from_secs(30), |db| {
            db.count_to("log-lost", &format!("id = {id} AND sent_at IS NOT NULL")) == 1
        });
        assert_eq!(receiver.deliveries_of(id).len(), 1);
    }
    assert!(receiver.deliveries_of(confirmed).is_empty(), "a confirmed event is not sent again");
    // The new slot carries what comes next.
    let next = db.enqueue("lost.next", "{}");
    assert_eq!(read(&mut db, fence).0.events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![during, next]);
    // Lost again before anything of it is confirmed: both are recovered, the one committed
    // before the first recovery too.
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    assert!(db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")));
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 4, "during and next, to both endpoints");
    assert_eq!(db.count_events(&format!("id IN ({during}, {next})")), 2);

    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-lost')");
}

#[test]
fn a_recovery_of_more_deliveries_than_it_copies_at_a_time_copies_each_once() {
    let mut db = db();
    let fence = enter_log_mode(&mut db);
    // Routed to the endpoint default alone, which has no URL here: the copies wait in the
    // table path. One more than the 10,000 a recovery copies at a time (tiny payloads).
    db.execute("SELECT outbox_enqueue('many', jsonb_build_object('n', n)) FROM generate_series(1, 10001) AS n");
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    assert!(db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")));
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 10001);
    assert_eq!(db.value::<i64>("SELECT count(DISTINCT event_id) FROM outbox_deliveries WHERE endpoint = 'default'"), 10001);
    assert_eq!(db.count_events("topic = 'many'"), 10001);
    leave_log_mode(&mut db);
}

#[test]
fn a_slot_made_by_a_transaction_that_did_not_commit_is_still_recovered() {
    let mut db = db();
    let fence = enter_log_mode(&mut db);
    let unconfirmed = db.enqueue("made.before", "{}");
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    assert_eq!(db.value::<String>(&format!("SELECT slot_state FROM outbox_log_lease({fence}, 60000)")), "missing");
    // A slot outlives a rollback of the transaction that made it (a relay killed, or its
    // connection lost, before the commit).
    db.execute(&format!("BEGIN; SELECT outbox_log_make_slot({fence}); ROLLBACK"));
    let state: String = db.value(&format!("SELECT slot_state FROM outbox_log_lease({fence}, 60000)"));
    assert_eq!(state, "recovering", "the lease marked it before it was made");
    assert!(!db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")), "it is there");
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 1, "to the endpoint default");
    assert_eq!(db.count_events(&format!("id = {unconfirmed}")), 1);
    leave_log_mode(&mut db);
}

#[test]
fn a_first_slot_made_by_a_transaction_that_did_not_commit_is_taken_and_one_made_before_the_lease_looked_is_not() {
    let mut db = db();
    leave_log_mode(&mut db);
    // As on a fresh install: no slot was ever the outbox's.
    db.execute("UPDATE outbox_log_state SET slot_ours = false, slot_wanted_from = NULL");
    let mut both = db.client.transaction().expect("begin");
    both.batch_execute("SELECT outbox_set_mode('log')").expect("log mode");
    let fence: i64 = both.query_one("SELECT reader_fence FROM outbox_log_lease(0, 600000)", &[]).expect("the lease").get(0);
    both.commit().expect("commit");
    let before = db.enqueue("first.before", "{}");
    let state = |db: &mut Db| db.value::<String>(&format!("SELECT slot_state FROM outbox_log_lease({fence}, 600000)"));

    // A slot of the outbox's name made before the lease ever found none is someone else's.
    db.execute("UPDATE outbox_log_state SET slot_wanted_from = NULL");
    db.execute("SELECT pg_create_logical_replication_slot(slot, 'pgoutput') FROM outbox_log_state");
    assert_eq!(state(&mut db), "foreign");
    let refused = db.client.batch_execute(&format!("SELECT outbox_log_make_slot({fence})")).expect_err("a slot made first is refused");
    assert_eq!(refused.code(), Some(&postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE), "{refused}");
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");

    // From 17 on the outbox makes failover slots: one made after the lease found none, but not
    // as a failover slot, is not one it made either.
    let fails_over = db.value::<i32>("SELECT current_setting('server_version_num')::integer") >= 170_000;
    assert_eq!(state(&mut db), "missing");
    if fails_over {
        db.execute("SELECT pg_create_logical_replication_slot(slot, 'pgoutput') FROM outbox_log_state");
        let refused = db.client.batch_execute(&format!("SELECT outbox_log_make_slot({fence})")).expect_err("not a failover slot");
        assert_eq!(refused.code(), Some(&postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE), "{refused}");
        db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    }

    // Once the lease found none, the relay's making is cut off before its commit: the slot
    // stays, and is not marked the outbox's.
    assert_eq!(state(&mut db), "missing");
    db.execute(&format!("BEGIN; SELECT outbox_log_make_slot({fence}); ROLLBACK"));
    assert_eq!(state(&mut db), "foreign", "made, and not marked");
    // Committed after the slot was made and before it was taken: in the slot, and recovered
    // too (delivered twice at worst; consumers deduplicate by id).
    let between = db.enqueue("first.between", "{}");
    assert!(db.value::<bool>(&format!("SELECT outbox_log_make_slot({fence})")), "taken as the one it made");
    assert_eq!(state(&mut db), "recovering");
    // pg_replication_slots has a failover column from 17 on.
    let failover: Option<bool> = db.value(
        "SELECT (to_jsonb(r) ->> 'failover')::boolean FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot",
    );
    assert_eq!(failover.unwrap_or(false), fails_over, "a failover slot from 17 on, and only there");
    assert_eq!(db.value::<i64>(&format!("SELECT outbox_log_recover({fence})")), 2, "the events before it, to the endpoint default");
    assert_eq!(db.count_events(&format!("id IN ({before}, {between})")), 2);
    let after = db.enqueue("first.after", "{}");
    assert_eq!(
        read(&mut db, fence).0.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![between, after],
        "the slot holds what came after it was made"
    );
    leave_log_mode(&mut db);
}

#[test]
fn bad_input_in_log_mode_errors_with_class_22_and_writes_nothing_into_the_log() {
    let mut db = db();
    enter_log_mode(&mut db);
    super::enqueue::refuses_bad_input(&mut db);
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log"), 0, "no row in the log");
    assert_eq!(db.count_events("true"), 0, "nor in the table path");
    let id: i64 = db.value(&format!("SELECT outbox_enqueue('at.the.limit', '{{\"k\": \"{}\"}}')", "x".repeat(91)));
    assert_eq!(db.value::<i64>(&format!("SELECT count(*) FROM outbox_log WHERE id = {id}")), 1, "at the limit, into the log");
    db.execute("RESET outbox.max_payload_bytes");
    leave_log_mode(&mut db);
}

/// Log mode with the workers reading the slot: `endpoint` takes `topics`.
fn log_mode_with_workers(db: &mut Db, endpoint: &str, url: &str, topics: &str) {
    leave_log_mode(db);
    db.execute(&format!("SELECT outbox_endpoint_set('{endpoint}', '{url}', '{{{topics}}}')"));
    turn_on_log_mode_for_the_workers(db);
}

/// Log mode on, once a worker has made the slot and read it. Until the slot is made, events go
/// to the table path (recovered); while it is being made, an event may reach both (sent twice,
/// as after a lost slot). The tests count sends: wait until a relay has read the finished slot
/// (it confirms each read, an empty one too). The slot shows before the transaction that makes
/// it commits: it alone says nothing.
fn turn_on_log_mode_for_the_workers(db: &mut Db) {
    db.execute("SELECT outbox_set_mode('log')");
    db.wait_for("a relay reads the slot it made", Duration::from_secs(30), |db| {
        db.value::<bool>(
            "SELECT EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot
                             WHERE NOT s.recovering AND s.confirmed_at IS NOT NULL)",
        )
    });
}

#[test]
fn the_workers_deliver_from_the_slot_signed_once_each_and_record_nothing_for_an_acknowledgement() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    log_mode_with_workers(&mut db, "log-fast", &receiver.url, "fast.*");
    let secret: String = db.value("SELECT outbox_endpoint_rotate_secret('log-fast')");
    db.execute("BEGIN; SELECT outbox_enqueue('fast.rolled_back', '{}'); ROLLBACK");
    let ids: Vec<i64> = db.column("SELECT outbox_enqueue('fast.made', jsonb_build_object('n', n)) FROM generate_series(1, 200) AS n");
    db.wait_for("every event reaches the receiver", Duration::from_secs(30), |_| {
        ids.iter().all(|&id| !receiver.deliveries_of(id).is_empty())
    });
    for &id in &ids {
        let deliveries = receiver.deliveries_of(id);
        assert_eq!(deliveries.len(), 1, "event {id} was sent once");
        assert!(deliveries[0].verified_by_standardwebhooks(&secret), "event {id} is signed");
    }
    assert!(receiver.deliveries().iter().all(|d| d.json()["type"] == "fast.made"), "the rolled-back event is never sent");
    // (The endpoint default, which takes every topic and has no URL here, keeps its copies in
    // the table path, where they wait as in table mode.)
    assert_eq!(db.count_to("log-fast", "true"), 0, "an acknowledged delivery read from the log writes no row");
    // The routes of fast.made are kept now: a new subscriber and a rotated secret still count
    // from the next read on.
    let also = Receiver::start(Reply::Status(204));
    db.execute(&format!("SELECT outbox_endpoint_set('log-also', '{}', '{{fast.*}}')", also.url));
    let rotated: String = db.value("SELECT outbox_endpoint_rotate_secret('log-fast')");
    let next = db.enqueue("fast.made", "{}");
    db.wait_for("the next event reaches both endpoints", Duration::from_secs(30), |_| {
        !receiver.deliveries_of(next).is_empty() && !also.deliveries_of(next).is_empty()
    });
    assert!(receiver.deliveries_of(next)[0].verified_by_standardwebhooks(&rotated), "signed with the new secret");
    db.execute("SELECT outbox_endpoint_drop('log-also')");
    // Other tables' writes (some megabytes of WAL): the relay confirms past them too, so the
    // slot keeps no WAL for them.
    db.execute("CREATE TABLE log_other (n int); INSERT INTO log_other SELECT generate_series(1, 100000); DROP TABLE log_other");
    db.wait_for("the slot is confirmed up to now", Duration::from_secs(10), |db| {
        db.value::<bool>("SELECT slot_state = 'ready' AND lag_bytes < 100000 AND lag_seconds < 5 FROM outbox_log_lag()")
    });
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-fast')");
}

#[test]
fn back_in_table_mode_the_slot_is_dropped_once_every_event_written_into_the_log_is_delivered() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    log_mode_with_workers(&mut db, "log-back", &receiver.url, "back.*");
    let database: String = db.value("SELECT current_database()");
    // A snapshot taken in log mode, which outlives the switch: its enqueue goes into the log.
    let mut late = db.connect(&database, "postgres");
    late.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_log_state").unwrap();
    let before = db.enqueue("back.before", "{}");
    db.execute("SELECT outbox_set_mode('table')");
    let after = db.enqueue("back.after", "{}");
    db.wait_for("both are delivered", Duration::from_secs(20), |_| {
        !receiver.deliveries_of(before).is_empty() && !receiver.deliveries_of(after).is_empty()
    });
    let confirmed_after_the_switch = "SELECT confirmed_at > (SELECT max(created_at) FROM outbox) FROM outbox_log_state";
    db.wait_for("the relay confirms the log in table mode", Duration::from_secs(20), |db| {
        db.value::<Option<bool>>(confirmed_after_the_switch) == Some(true)
    });
    let slot = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = (SELECT slot FROM outbox_log_state)";
    assert_eq!(db.value::<i64>(slot), 1, "kept while a snapshot that sees log mode is left");
    assert!(db.value::<bool>("SELECT logged_below IS NULL AND table_since IS NOT NULL FROM outbox_log_state"), "and not about to go");

    let late_id: i64 = late.query_one("SELECT outbox_enqueue('back.late', '{}')", &[]).unwrap().get(0);
    late.batch_execute("COMMIT").unwrap();
    assert_eq!(db.value::<i64>(&format!("SELECT count(*) FROM outbox_log WHERE id = {late_id}")), 1, "written into the log");
    db.wait_for("the late event is delivered and the slot dropped", Duration::from_secs(20), |db| {
        !receiver.deliveries_of(late_id).is_empty() && db.value::<i64>(slot) == 0
    });
    assert!(db.column::<String>("SELECT slot FROM outbox_log_lag()").is_empty(), "no lag to report");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log_state WHERE reader_until IS NOT NULL"), 0, "no reader");
    // Its partitions go as a log mode's do: every row is below logged_below.
    db.execute(
        "CREATE TABLE outbox_log_past PARTITION OF outbox_log
           FOR VALUES FROM (date_trunc('hour', now()) - interval '3 hours') TO (date_trunc('hour', now()) - interval '2 hours')",
    );
    db.execute("SELECT outbox_log_maintain()");
    assert_eq!(db.value::<Option<String>>("SELECT to_regclass('outbox_log_past')::text"), None, "a past hour's partition is dropped");

    // In log mode again, a new slot: nothing of the old log comes again.
    turn_on_log_mode_for_the_workers(&mut db);
    let again = db.enqueue("back.again", "{}");
    db.wait_for("an event of the new slot is delivered", Duration::from_secs(20), |_| !receiver.deliveries_of(again).is_empty());
    for id in [before, after, late_id, again] {
        assert_eq!(receiver.deliveries_of(id).len(), 1, "event {id} was sent once");
    }
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-back')");
}

#[test]
fn a_commit_into_the_log_wakes_the_reader_also_while_a_read_is_on_its_way() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    log_mode_with_workers(&mut db, "log-woken", &receiver.url, "woken.*");
    // From here on no poll for an hour: only a commit's wakeup reads the log. (A relay that
    // holds no lease tries for it at the poll: it is taken already.)
    db.configure(&[("outbox.poll_interval", "1h")]);
    let first = db.enqueue("woken.first", "{}");
    wait_until("the reader, woken by the commit, sends the first event", Duration::from_secs(10), || receiver.held() == 1);
    let second = db.enqueue("woken.second", "{}");
    receiver.set_reply(Reply::Status(204));
    receiver.release();
    db.wait_for(
        "the second event, committed while the first was on its way, is read once that read is confirmed",
        Duration::from_secs(10),
        |_| !receiver.deliveries_of(second).is_empty(),
    );
    assert_eq!(receiver.deliveries_of(first).len(), 1);
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-woken')");
}

/// The reader renews its lease when half of it has passed, not at every read; a lease made
/// shorter by a reload holds from the next read on, so that a relay that dies right after the
/// reload is replaced as soon as the new length says.
#[test]
fn a_lease_made_shorter_holds_from_the_next_read_on() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.lease", "10min")]);
    log_mode_with_workers(&mut db, "log-lease", &receiver.url, "lease.*");
    assert!(db.value::<bool>("SELECT reader_until > now() + interval '5 min' FROM outbox_log_state"), "taken for ten minutes");
    db.configure(&[("outbox.lease", "5s")]);
    let id = db.enqueue("lease.event", "{}");
    db.wait_for("the event is delivered", Duration::from_secs(10), |_| !receiver.deliveries_of(id).is_empty());
    assert!(db.value::<bool>("SELECT reader_until < now() + interval '10 s' FROM outbox_log_state"), "renewed for 5 s");
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-lease')");
}

/// Another relay takes the lease while a read is on its way, reads and confirms past it, and
/// lets the lease go. The relays go on reading the log: the one that lost the lease must not
/// confirm the slot back at its read's end, which the slot is already past.
#[test]
fn the_log_is_read_on_after_another_relay_took_the_lease_and_confirmed_past_a_read_on_its_way() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Hold);
    log_mode_with_workers(&mut db, "log-taken", &receiver.url, "taken.*");
    db.configure(&[("outbox.lease", "2s")]);
    let first = db.enqueue("taken.first", "{}");
    wait_until("the first event is on its way", Duration::from_secs(10), || receiver.held() == 1);
    let thief: i64 = db.value(
        "UPDATE outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour' RETURNING reader_fence",
    );
    db.enqueue("taken.second", "{}");
    let (log, oldest) = read(&mut db, thief);
    assert!(log.events.len() >= 2, "the other relay reads both");
    assert!(confirm(&mut db, thief, &log, oldest));
    db.execute("UPDATE outbox_log_state SET reader_until = NULL");
    db.wait_for("the relay takes the lease again, the first event still on its way", Duration::from_secs(30), |db| {
        db.value::<bool>(&format!("SELECT reader_fence > {thief} AND reader_until IS NOT NULL FROM outbox_log_state"))
    });
    assert_eq!(receiver.held(), 1);
    receiver.set_reply(Reply::Status(204));
    receiver.release();
    let third = db.enqueue("taken.third", "{}");
    db.wait_for("the relay takes the lease again and delivers what came after", Duration::from_secs(30), |_| {
        !receiver.deliveries_of(third).is_empty()
    });
    assert_eq!(receiver.deliveries_of(first).len(), 1, "the first event's request was answered");
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-taken')");
}

#[test]
fn a_failing_endpoint_goes_on_in_the_table_path_and_holds_back_neither_the_slot_nor_the_others() {
    let mut db = db();
    let (healthy, failing) = (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(503)));
    log_mode_with_workers(&mut db, "log-healthy", &healthy.url, "mixed.*");
    db.execute(&format!("SELECT outbox_endpoint_set('log-failing', '{}', '{{mixed.*}}')", failing.url));
    let ids: Vec<i64> = db.column("SELECT outbox_enqueue('mixed.event', jsonb_build_object('n', n)) FROM generate_series(1, 20) AS n");
    db.wait_for("the healthy endpoint gets every event", Duration::from_secs(30), |_| {
        ids.iter().all(|&id| healthy.deliveries_of(id).len() == 1)
    });
    db.wait_for("the failures are copied into the table path", Duration::from_secs(30), |db| {
        db.count_to("log-failing", "attempts >= 1 AND last_error LIKE '%503%'") == 20
    });
    assert_eq!(db.count_to("log-healthy", "true"), 0, "the healthy endpoint's deliveries left no row");
    // Later events do not wait behind the failing endpoint's retries.
    let later = db.enqueue("mixed.event", "{}");
    db.wait_for("a later event reaches the healthy endpoint", Duration::from_secs(10), |_| !healthy.deliveries_of(later).is_empty());
    failing.set_reply(Reply::Status(204));
    db.wait_for("the table path delivers what failed", Duration::from_secs(60), |db| {
        db.count_to("log-failing", "sent_at IS NOT NULL") >= 20
    });
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop(n) FROM unnest(ARRAY['log-healthy', 'log-failing']) AS n");
}

/// An endpoint that never answers: its requests time out a round of its request slots at a
/// time. After the first timeout the rest of its deliveries go to the table path at once, and
/// so do those of the next reads for a while: the log goes on for the other endpoints.
#[test]
fn an_endpoint_that_times_out_holds_the_log_back_one_timeout_at_most() {
    let mut db = db();
    db.configure(&[("outbox.http_timeout", "1s")]);
    let (healthy, hanging) = (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Hold));
    log_mode_with_workers(&mut db, "log-healthy", &healthy.url, "slow.*");
    db.execute(&format!("SELECT outbox_endpoint_set('log-hanging', '{}', '{{slow.*}}', max_in_flight => 2)", hanging.url));
    db.execute("SELECT outbox_enqueue('slow.event', jsonb_build_object('n', n)) FROM generate_series(1, 20) AS n");
    db.wait_for("two requests to the hanging endpoint are on their way", Duration::from_secs(10), |_| hanging.held() == 2);
    // Ten rounds of timeouts would take ten seconds before the next read.
    let later = db.enqueue("slow.event", "{}");
    db.wait_for("a later event reaches the healthy endpoint", Duration::from_secs(5), |_| !healthy.deliveries_of(later).is_empty());
    db.wait_for("every delivery to the hanging endpoint is in the table path", Duration::from_secs(10), |db| {
        db.count_to("log-hanging", "true") == 21
    });
    hanging.set_reply(Reply::Status(204));
    hanging.release();
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop(n) FROM unnest(ARRAY['log-healthy', 'log-hanging']) AS n");
}

/// A slot's position is written to disk apart from the WAL: were it confirmed past events
/// whose copy into the table path was committed asynchronously, as the workers' claims are, a
/// crash could keep the position and lose the copy. A synchronous standby that never connects
/// holds every synchronous commit back (an asynchronous one does not wait): the reader must
/// wait in its copy, with the slot still holding the events.
#[test]
fn a_copy_into_the_table_path_is_on_disk_before_the_slot_lets_go_of_its_events() {
    let mut db = db();
    let failing = Receiver::start(Reply::Status(503));
    log_mode_with_workers(&mut db, "log-durable", &failing.url, "durable.*");
    let slot: String = db.value("SELECT slot::text FROM outbox_log_state");
    // This session's own commits wait for no standby.
    db.execute("SET synchronous_commit = local");
    db.execute("ALTER SYSTEM SET synchronous_standby_names = 'outbox_test_never_connects'");
    db.execute("SELECT pg_reload_conf()");
    let id = db.enqueue("durable.event", "{}");
    db.wait_for("the reader waits for its copy of the failed delivery to be flushed", Duration::from_secs(30), |db| {
        db.value::<i64>("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid <> pg_backend_pid()") > 0
    });
    let held: Vec<Vec<u8>> = db.column(&format!(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, 'proto_version', '1', 'publication_names', 'outbox_log')"
    ));
    let log_relation: i64 = db.value("SELECT 'outbox_log'::regclass::oid::bigint");
    let held = read_events(held.iter().map(Vec::as_slice), log_relation as u32).expect("pgoutput messages of outbox_log");
    assert!(held.events.iter().any(|e| e.id == id), "the slot still holds the event");
    db.execute("ALTER SYSTEM RESET synchronous_standby_names");
    db.execute("SELECT pg_reload_conf()");
    db.wait_for("the copy is made once its commit is flushed", Duration::from_secs(30), |db| {
        db.count_to("log-durable", &format!("event_id = {id} AND last_error LIKE '%503%'")) == 1
    });
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-durable')");
}

#[test]
fn the_log_keeps_partitions_for_the_next_hours_and_drops_those_read_and_confirmed() {
    let mut db = db();
    let fence = enter_log_mode(&mut db);
    let ahead = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_log'::regclass
                   AND pg_get_expr((SELECT relpartbound FROM pg_class WHERE oid = inhrelid), inhrelid) LIKE 'FOR VALUES%'
                   AND inhrelid::regclass::text > 'outbox_log_' || to_char(now(), 'YYYYMMDD\"h\"HH24')";
    // Five, or four if the hour turned since log mode was turned on.
    assert!(db.value::<i64>(ahead) >= 4, "the next hours beside this one");
    // An hour long past, with an event the relay has not confirmed yet, and one in the default
    // partition (an hour no partition was made for).
    db.execute(
        "CREATE TABLE outbox_log_past PARTITION OF outbox_log
           FOR VALUES FROM (date_trunc('hour', now()) - interval '3 hours') TO (date_trunc('hour', now()) - interval '2 hours');
         INSERT INTO outbox_log (id, topic, payload, created_at) VALUES (nextval('outbox_id_seq'), 'old', '{}', now() - interval '170 minutes'),
                                                                       (nextval('outbox_id_seq'), 'old', '{}', now() - interval '1 day');",
    );
    db.execute("SELECT outbox_log_maintain()");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log WHERE topic = 'old'"), 2, "not confirmed yet: kept");

    db.enqueue("log.later", "{}");
    let (log, oldest) = read(&mut db, fence);
    assert!(confirm(&mut db, fence, &log, oldest));
    db.execute("SELECT outbox_log_maintain()");
    assert_eq!(
        db.value::<Option<String>>("SELECT to_regclass('outbox_log_past')::text"),
        None,
        "the past hour's partition is dropped whole"
    );
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log WHERE topic = 'old'"), 0, "the default partition is emptied");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_log WHERE topic = 'log.later'"), 1, "this hour's is kept");
    leave_log_mode(&mut db);
}

#[test]
fn a_slot_lost_while_a_read_is_on_its_way_is_made_again_and_that_read_recovered() {
    let mut db = db();
    // A short lease: the relay renews it, and checks the slot, every second.
    db.configure(&[("outbox.lease", "2s")]);
    let receiver = Receiver::start(Reply::Hold);
    log_mode_with_workers(&mut db, "log-held", &receiver.url, "held.*");
    let id = db.enqueue("held.one", "{}");
    db.wait_for("the relay sends it", Duration::from_secs(30), |_| receiver.held() >= 1);
    // Lost while the request is held: the read it came in cannot be confirmed on this slot.
    db.execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state");
    receiver.release();
    db.wait_for("the event, recovered into the table path, is delivered there", Duration::from_secs(30), |db| {
        db.count_to("log-held", &format!("id = {id} AND sent_at IS NOT NULL")) == 1
    });
    let next = db.enqueue("held.two", "{}");
    db.wait_for("the next event is delivered too", Duration::from_secs(30), |_| !receiver.deliveries_of(next).is_empty());
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-held')");
    db.execute("ALTER SYSTEM RESET outbox.lease");
    db.configure(&[]);
}

#[test]
fn a_slot_invalidated_by_max_slot_wal_keep_size_is_made_again_and_what_it_held_is_delivered() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    log_mode_with_workers(&mut db, "log-invalidated", &receiver.url, "invalidated.*");
    let confirmed = db.enqueue("invalidated.before", "{}");
    let written: String = db.value("SELECT pg_current_wal_lsn()::text");
    // Confirmed past it, and no transaction that might still commit before it is left to
    // recover from: one running anywhere in the cluster when a read began holds recover_from
    // back, and a recovery delivers again what it may have missed (consumers deduplicate).
    db.wait_for("the first event is delivered and the slot confirmed past it", Duration::from_secs(30), |db| {
        db.value::<bool>(&format!(
            "SELECT coalesce(s.confirmed_lsn >= '{written}' AND s.recover_from > l.xact, false)
               FROM outbox_log_state AS s, outbox_log AS l WHERE l.id = {confirmed}"
        ))
    });
    // The relays kept off the slot, as by a reader that took the lease and stopped.
    db.execute("UPDATE outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour'");
    let held = [db.enqueue("invalidated.held", r#"{"n": 1}"#), db.enqueue("invalidated.held", r#"{"n": 2}"#)];
    // The slot may keep no WAL but the current segment's: the next checkpoint past a segment
    // switch invalidates it, as PostgreSQL does to a slot that fell too far behind.
    db.configure(&[("max_slot_wal_keep_size", "1MB")]);
    let slot_status = "SELECT r.wal_status FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot";
    db.wait_for("PostgreSQL invalidates the slot", Duration::from_secs(30), |db| {
        db.execute("SELECT pg_logical_emit_message(false, 'outbox-test', 'wal'); SELECT pg_switch_wal()");
        db.execute("CHECKPOINT");
        db.value::<String>(slot_status) == "lost"
    });
    db.execute("ALTER SYSTEM RESET max_slot_wal_keep_size");
    db.configure(&[]);
    // The lease free again: a relay finds the slot lost, makes it again and recovers.
    db.execute("UPDATE outbox_log_state SET reader_until = NULL");
    db.wait_for("the events the lost slot held are delivered", Duration::from_secs(30), |_| {
        held.iter().all(|id| !receiver.deliveries_of(*id).is_empty())
    });
    db.wait_for("the slot made again is read", Duration::from_secs(30), |db| {
        matches!(db.column::<String>(slot_status).as_slice(), [status] if status != "lost")
            && !db.value::<bool>("SELECT recovering FROM outbox_log_state")
    });
    let next = db.enqueue("invalidated.after", "{}");
    db.wait_for("an event after it is delivered", Duration::from_secs(30), |_| !receiver.deliveries_of(next).is_empty());
    for id in held {
        assert_eq!(receiver.deliveries_of(id).len(), 1, "event {id} was committed before the new slot: recovered alone");
    }
    assert_eq!(receiver.deliveries_of(confirmed).len(), 1, "an event confirmed before the loss is not sent again");
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop('log-invalidated')");
}

/// What log mode runs (the reader's lease, read, routing, copy into the table path, recovery
/// and partition upkeep) with a non-superuser's look-alikes of what it calls planted in
/// public: none of them runs.
#[test]
fn nothing_a_non_superuser_plants_runs_when_the_relay_reads_the_log() {
    let mut db = db();
    mallory_and_planted_calls(&mut db);
    plant(&mut db, "public");
    // Closer matches than pg_catalog's for what routing calls: a concat of texts (pg_catalog's
    // takes "any"), and a text[] overlap.
    db.execute("SET ROLE mallory");
    db.execute(
        "CREATE FUNCTION public.concat(text, text, text, text, text, text, text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO public.planted_calls VALUES ('concat');
           EXECUTE 'ALTER ROLE mallory SUPERUSER';
           RETURN pg_catalog.concat($1, $2, $3, $4, $5, $6, $7);
         END $$;
         CREATE FUNCTION public.planted_overlap(text[], text[]) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO public.planted_calls VALUES ('&&');
           EXECUTE 'ALTER ROLE mallory SUPERUSER';
           RETURN $1 OPERATOR(pg_catalog.&&) $2;
         END $$;
         CREATE OPERATOR public.&& (LEFTARG = text[], RIGHTARG = text[], FUNCTION = public.planted_overlap);",
    );
    db.execute("RESET ROLE");

    let (healthy, failing) = (Receiver::start(Reply::Status(204)), Receiver::start(Reply::Status(503)));
    log_mode_with_workers(&mut db, "log-planted", &healthy.url, "planted.*");
    db.execute(&format!("SELECT outbox_endpoint_set('log-planted-failing', '{}', '{{planted.*}}')", failing.url));
    let delivered = db.enqueue("planted.one", "{}");
    db.wait_for("an event is delivered from the log", Duration::from_secs(30), |_| !healthy.deliveries_of(delivered).is_empty());
    db.wait_for("its failure is copied into the table path", Duration::from_secs(30), |db| {
        db.count_to("log-planted-failing", &format!("id = {delivered} AND attempts >= 1")) == 1
    });
    db.wait_for("the slot is dropped between two reads", Duration::from_secs(10), |db| {
        db.client.batch_execute("SELECT pg_drop_replication_slot(slot) FROM outbox_log_state").is_ok()
    });
    let after = db.enqueue("planted.two", "{}");
    db.wait_for("the slot is made again and the next event delivered", Duration::from_secs(30), |_| {
        !healthy.deliveries_of(after).is_empty()
    });
    db.execute("SELECT outbox_log_maintain()");

    assert_nothing_planted_ran(&mut db);
    // The plants are live: calls that look in public first reach them (rolled back: they make
    // mallory a superuser).
    let mut live = db.client.transaction().expect("begin");
    live.batch_execute("SET LOCAL search_path = public, pg_catalog").expect("search_path");
    live.query_one("SELECT concat('a', 'b', 'c', 'd', 'e', 'f', 'g'), ARRAY['a'] && ARRAY['b']", &[]).expect("the plants");
    let caught: i64 = live.query_one("SELECT count(*) FROM public.planted_calls", &[]).expect("count").get(0);
    assert_eq!(caught, 2, "the planted concat and && catch calls that look in public");
    live.rollback().expect("rollback");
    leave_log_mode(&mut db);
    db.execute("SELECT outbox_endpoint_drop(n) FROM unnest(ARRAY['log-planted', 'log-planted-failing']) AS n");
    db.execute("DROP TABLE public.planted_calls; DROP OWNED BY mallory");
}
