//! Log mode with `outbox relay` and the SQL install, as on a managed server: the relay makes
//! the slot, delivers what it reads there and writes nothing for an acknowledged delivery;
//! a slot dropped while the relay was away is made again and what it held is delivered; back in
//! table mode, it drops the slot. With the REPLICATION attribute the relay streams the slot.

mod support;

use std::time::Duration;

use support::{connect, fresh_database, migrate, url, wait_until, Receiver, Relay};

fn count(db: &mut postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn the_relay_delivers_from_the_slot_and_after_a_dropped_slot_delivers_what_it_held_and_drops_it_in_table_mode() {
    // The relay's own role may not open a replication connection.
    let (mut db, mut owner, receiver) = log_mode_database("outbox_t_log", false);
    let relay_url = url("outbox_relay", "outbox_t_log");
    let arguments = ["--database-url", relay_url.as_str(), "--listen-url", relay_url.as_str(), "--poll-interval", "1s"];
    let relay = Relay::start(&arguments);
    // Made, and read once (the slot shows before the transaction that makes it commits; an
    // event committed meanwhile may also be recovered into the table path).
    let made = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot
                 WHERE NOT s.recovering AND s.confirmed_at IS NOT NULL";
    wait_until("the relay makes the slot and reads it", Duration::from_secs(20), || count(&mut db, made) == 1);

    let mut app = connect("app", "outbox_t_log");
    app.batch_execute(
        "BEGIN; SELECT outbox.outbox_enqueue('order.placed', jsonb_build_object('n', n)) FROM generate_series(1, 3) AS n; COMMIT;
         BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{\"rolled\": \"back\"}'); ROLLBACK;",
    )
    .unwrap();
    wait_until("the three events are delivered", Duration::from_secs(10), || receiver.count() == 3);
    assert_eq!(count(&mut db, "SELECT count(*) FROM outbox.outbox_deliveries") + count(&mut db, "SELECT count(*) FROM outbox.outbox"), 0);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");

    // Two events while no relay runs, then the slot is dropped (or lost with a failover).
    app.batch_execute(
        "SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 4}'); SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 5}');",
    )
    .unwrap();
    db.batch_execute("SELECT pg_drop_replication_slot(slot) FROM outbox.outbox_log_state").unwrap();
    // The relay makes the slot at READ COMMITTED whatever the database's default.
    db.batch_execute("ALTER DATABASE outbox_t_log SET default_transaction_isolation = 'repeatable read'").unwrap();
    let relay = Relay::start(&arguments);
    // Each event at least once (Receiver::distinct).
    let distinct = || receiver.distinct();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while distinct() < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if distinct() < 5 {
        let state = count(&mut db, "SELECT count(*) FROM outbox.outbox_deliveries");
        panic!("the two events were not recovered and delivered ({state} deliveries in the table): {}", relay.stop().1);
    }
    // Back in table mode, once what the log holds is delivered, the relay drops the slot.
    owner.batch_execute("SELECT outbox.outbox_set_mode('table')").unwrap();
    let slots = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot";
    wait_until("the relay drops the slot", Duration::from_secs(20), || count(&mut db, slots) == 0);
    let received = receiver.received.lock().unwrap().clone();
    assert!(received.iter().all(|(_, body)| !body.contains("rolled")), "the rolled-back event is never sent");
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
    assert!(said.contains("made the log's slot"), "{said}");
    // outbox_relay has no REPLICATION attribute of its own (a role's attributes are not
    // inherited): the relay read the slot instead of streaming it, and said why.
    assert!(said.contains("cannot stream the log's slot") && said.contains("replication"), "{said}");
}

/// A database in log mode as `outbox_owner` sets it up, with a receiver as its default
/// endpoint. The owner has the REPLICATION attribute, as rds_replication gives it on Amazon
/// RDS (its functions make and read the slot); `outbox_relay` has it if `relay_streams`.
fn log_mode_database(name: &str, relay_streams: bool) -> (postgres::Client, postgres::Client, Receiver) {
    let db = fresh_database(name);
    let mut admin = connect("postgres", "postgres");
    let relay = if relay_streams { "REPLICATION" } else { "NOREPLICATION" };
    admin.batch_execute(&format!("ALTER ROLE outbox_owner REPLICATION; ALTER ROLE outbox_relay {relay}")).unwrap();
    migrate(name, &[]);
    let receiver = Receiver::start();
    let mut owner = connect("outbox_owner", name);
    owner
        .batch_execute(&format!(
            "SELECT outbox.outbox_endpoint_set('default', '{}');
             SELECT outbox.outbox_set_mode('log');
             GRANT USAGE ON SCHEMA outbox TO app;
             GRANT EXECUTE ON FUNCTION outbox.outbox_enqueue(text, jsonb, text, timestamptz) TO app;",
            receiver.url
        ))
        .unwrap();
    (db, owner, receiver)
}

/// The relay's stream holds the slot: the server session the slot is active for is the
/// relay's replication connection.
const STREAMED: &str = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot
                         JOIN pg_stat_activity AS a ON a.pid = r.active_pid WHERE a.application_name = 'outbox relay log stream'";

#[test]
fn with_the_replication_attribute_the_relay_streams_the_slot_and_a_cut_stream_or_a_dropped_slot_loses_nothing() {
    let (mut db, mut owner, receiver) = log_mode_database("outbox_t_log_stream", true);
    let relay_url = url("outbox_relay", "outbox_t_log_stream");
    // No listener and a poll of a minute: what the stream hands over wakes the relay.
    let mut relay = Relay::start(&["--database-url", relay_url.as_str(), "--poll-interval", "60s"]);
    relay.wait_until("the relay streams the slot", Duration::from_secs(20), || count(&mut db, STREAMED) == 1);
    let mut app = connect("app", "outbox_t_log_stream");
    app.batch_execute(
        "BEGIN; SELECT outbox.outbox_enqueue('order.placed', jsonb_build_object('n', n)) FROM generate_series(1, 50) AS n; COMMIT;
         BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{\"rolled\": \"back\"}'); ROLLBACK;
         BEGIN; SELECT outbox.outbox_enqueue('order.placé', jsonb_build_object('n', n, 'café', 'crème')) FROM generate_series(51, 100) AS n; COMMIT;",
    )
    .unwrap();
    relay.wait_until("the hundred events are delivered", Duration::from_secs(10), || receiver.count() == 100);
    assert_eq!(receiver.distinct(), 100, "each once: the reads on their way are read past, not again");
    let accented = receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, body)| body.contains(r#""type" : "order.placé""#) && body.contains(r#""café": "crème""#))
        .count();
    assert_eq!(accented, 50, "a body built by the relay carries text that is not ASCII as a claim's does");
    assert_eq!(count(&mut db, "SELECT count(*) FROM outbox.outbox_deliveries") + count(&mut db, "SELECT count(*) FROM outbox.outbox"), 0);
    // The stream confirms what was delivered: the slot lets go of it.
    let confirmed = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot
                      WHERE r.confirmed_flush_lsn >= s.confirmed_lsn AND s.confirmed_lsn IS NOT NULL";
    relay.wait_until("the slot's position is the one confirmed", Duration::from_secs(20), || count(&mut db, confirmed) == 1);

    // The server session of the stream ends (an administrator, a restart): the relay reads on
    // and streams again.
    db.batch_execute("SELECT pg_terminate_backend(r.active_pid) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot")
        .unwrap();
    app.batch_execute("SELECT outbox.outbox_enqueue('order.placed', jsonb_build_object('n', n)) FROM generate_series(101, 103) AS n")
        .unwrap();
    let distinct = || receiver.distinct();
    relay.wait_until("the three events after the cut are delivered", Duration::from_secs(10), || distinct() == 103);
    relay.wait_until("the relay streams the slot again", Duration::from_secs(20), || count(&mut db, STREAMED) == 1);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");

    // Events the slot held when it was dropped are recovered; the slot made again is streamed.
    app.batch_execute(
        "SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 104}'); SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 105}');",
    )
    .unwrap();
    db.batch_execute("SELECT pg_drop_replication_slot(slot) FROM outbox.outbox_log_state").unwrap();
    let mut relay = Relay::start(&["--database-url", relay_url.as_str(), "--poll-interval", "1s"]);
    relay.wait_until("the two events the dropped slot held are delivered", Duration::from_secs(20), || distinct() == 105);
    relay.wait_until("the relay streams the new slot", Duration::from_secs(20), || count(&mut db, STREAMED) == 1);
    app.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 106}')").unwrap();
    relay.wait_until("an event after the new slot is delivered", Duration::from_secs(10), || distinct() == 106);

    // Back in table mode the relay stops streaming, reads the slot, and drops it.
    owner.batch_execute("SELECT outbox.outbox_set_mode('table')").unwrap();
    let slots = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot";
    relay.wait_until("the relay drops the slot", Duration::from_secs(20), || count(&mut db, slots) == 0);
    let received = receiver.received.lock().unwrap().clone();
    assert!(received.iter().all(|(_, body)| !body.contains("rolled")), "the rolled-back event is never sent");
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
    assert!(said.contains("made the log's slot") && !said.contains("cannot stream"), "{said}");
}

#[test]
fn a_relay_whose_lease_was_taken_ends_its_stream_so_that_the_next_reader_may_have_the_slot() {
    let (mut db, _owner, receiver) = log_mode_database("outbox_t_log_lease", true);
    let relay_url = url("outbox_relay", "outbox_t_log_lease");
    let mut relay = Relay::start(&["--database-url", relay_url.as_str(), "--poll-interval", "1s", "--lease", "2s"]);
    relay.wait_until("the relay streams the slot", Duration::from_secs(20), || count(&mut db, STREAMED) == 1);
    // Another reader takes the lease (as a relay does once this one's ran out, had it hung).
    db.batch_execute("UPDATE outbox.outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour'")
        .unwrap();
    let active = "SELECT count(*) FROM pg_replication_slots AS r JOIN outbox.outbox_log_state AS s ON r.slot_name = s.slot WHERE r.active";
    relay.wait_until("the relay lets go of the slot", Duration::from_secs(10), || count(&mut db, active) == 0);
    // The lease back, it streams again and delivers.
    db.batch_execute("UPDATE outbox.outbox_log_state SET reader_until = NULL").unwrap();
    connect("app", "outbox_t_log_lease").batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    relay.wait_until("the event is delivered", Duration::from_secs(10), || receiver.count() == 1);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}

#[test]
fn the_stream_is_encrypted_as_sslmode_asks() {
    let (mut db, _owner, _receiver) = log_mode_database("outbox_t_log_stream_tls", true);
    let base = url("outbox_relay", "outbox_t_log_stream_tls");
    let ca = format!("{}/ca.pem", std::env::var("OUTBOX_TEST_TLS").expect("OUTBOX_TEST_TLS: run through cli/test.sh"));
    let stream_encrypted = |db: &mut postgres::Client| -> Vec<bool> {
        let query = "SELECT s.ssl FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s USING (pid)
                      WHERE a.datname = 'outbox_t_log_stream_tls' AND a.application_name = 'outbox relay log stream'";
        db.query(query, &[]).unwrap().iter().map(|row| row.get(0)).collect()
    };
    for (query, expected) in [(format!("sslmode=verify-full&sslrootcert={ca}"), true), ("sslmode=disable".to_string(), false)] {
        let relay_url = format!("{base}?{query}");
        let mut relay = Relay::start(&["--database-url", relay_url.as_str()]);
        relay.wait_until("the relay streams the slot", Duration::from_secs(20), || count(&mut db, STREAMED) == 1);
        assert_eq!(stream_encrypted(&mut db), [expected], "{query}");
        let (status, said) = relay.stop();
        assert_eq!(status, 0, "{said}");
        wait_until("the stream is closed", Duration::from_secs(20), || stream_encrypted(&mut db).is_empty());
    }
}
