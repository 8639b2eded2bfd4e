//! Log mode with `outbox relay` and the SQL install, as on a managed server: the relay makes
//! the slot, delivers what it reads there and writes nothing for an acknowledged delivery;
//! a slot dropped while the relay was away is made again and what it held is delivered; back in
//! table mode, it drops the slot. With the REPLICATION attribute the relay streams the slot.

mod support;

use std::time::Duration;

use support::{
    connect, connect_on, fresh_database, fresh_database_on, migrate, migrate_on, outbox, text, url, url_on, wait_until, Receiver, Relay,
    Server,
};

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
    // inherited): the relay read the slot instead of streaming it, and said why (up to 15 in
    // the message, from 16 on in its detail, which the relay repeats).
    let why = said.lines().find(|line| line.contains("cannot stream the log's slot")).unwrap_or_default();
    assert!(why.to_lowercase().contains("replication"), "{said}");
}

/// A database in log mode as `outbox_owner` sets it up, with a receiver as its default
/// endpoint. The owner has the REPLICATION attribute, as rds_replication gives it on Amazon
/// RDS (its functions make and read the slot); `outbox_relay` has it if `relay_streams`.
fn log_mode_database(name: &str, relay_streams: bool) -> (postgres::Client, postgres::Client, Receiver) {
    log_mode_database_on(Server::Library, name, relay_streams)
}

fn log_mode_database_on(server: Server, name: &str, relay_streams: bool) -> (postgres::Client, postgres::Client, Receiver) {
    let db = fresh_database_on(server, name);
    let mut admin = connect_on(server, "postgres", "postgres");
    let relay = if relay_streams { "REPLICATION" } else { "NOREPLICATION" };
    admin.batch_execute(&format!("ALTER ROLE outbox_owner REPLICATION; ALTER ROLE outbox_relay {relay}")).unwrap();
    migrate_on(server, name, &[]);
    let receiver = Receiver::start();
    let mut owner = connect_on(server, "outbox_owner", name);
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
    let (mut db, _owner, _receiver) = log_mode_database_on(Server::Tls, "outbox_t_log_stream_tls", true);
    let base = url_on(Server::Tls, "outbox_relay", "outbox_t_log_stream_tls");
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

/// A role with CREATE on the database (and REPLICATION, for the slot) who gets there first.
fn squatter(database: &str) -> postgres::Client {
    let mut admin = connect("postgres", "postgres");
    let exists = count(&mut admin, "SELECT count(*) FROM pg_roles WHERE rolname = 'squat'") > 0;
    if !exists {
        admin.batch_execute("CREATE ROLE squat LOGIN NOSUPERUSER").unwrap();
    }
    admin.batch_execute(&format!("ALTER ROLE squat REPLICATION; GRANT CREATE ON DATABASE {database} TO squat")).unwrap();
    connect("squat", database)
}

/// What a refused switch leaves: table mode, and no publication, slot or partition of ours.
fn assert_nothing_switched(db: &mut postgres::Client) {
    assert_eq!(count(db, "SELECT count(*) FROM outbox.outbox_log_state WHERE enabled OR recover_from IS NOT NULL"), 0);
    assert_eq!(
        count(db, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.outbox_log'::regclass"),
        1,
        "the default partition alone"
    );
}

#[test]
fn log_mode_refuses_a_publication_or_slot_that_someone_else_made_first() {
    let db_name = "outbox_t_log_squat";
    let mut db = fresh_database(db_name);
    connect("postgres", "postgres").batch_execute("ALTER ROLE outbox_owner REPLICATION").unwrap();
    migrate(db_name, &[]);
    let mut owner = connect("outbox_owner", db_name);
    let mut squat = squatter(db_name);
    // The publication first, for a table of the squatter's named as ours.
    squat
        .batch_execute(
            "CREATE SCHEMA squat;
             CREATE TABLE squat.outbox_log (id bigint, topic text, payload jsonb, key text, created_at timestamptz, xact xid8);
             CREATE PUBLICATION outbox_log FOR TABLE squat.outbox_log WITH (publish = 'insert', publish_via_partition_root = true)",
        )
        .unwrap();
    let error = owner.batch_execute("SELECT outbox.outbox_set_mode('log')").expect_err("a squatter's publication");
    let error = error.as_db_error().expect("an error of the server");
    assert_eq!(error.code().code(), "55000", "{error:?}");
    assert!(error.message().contains("the publication outbox_log is not the outbox's own: it is owned by squat"), "{}", error.message());
    assert_nothing_switched(&mut db);
    let doctor = outbox(&["doctor", "--database-url", &url("outbox_owner", db_name)]);
    assert_eq!(doctor.status.code(), Some(2), "{}", text(&doctor));
    assert!(text(&doctor).contains("publication outbox_log: not the outbox's own: it is owned by squat"), "{}", text(&doctor));
    // One of the owner's own that publishes another table too is refused as well.
    squat.batch_execute("DROP PUBLICATION outbox_log").unwrap();
    owner
        .batch_execute(
            "CREATE TABLE outbox.lookalike (x int);
             CREATE PUBLICATION outbox_log FOR TABLE outbox.outbox_log, outbox.lookalike",
        )
        .unwrap();
    let error = owner.batch_execute("SELECT outbox.outbox_set_mode('log')").expect_err("a publication of another table too");
    assert!(error.as_db_error().unwrap().message().contains("publishes tables other than"), "{error}");
    owner.batch_execute("DROP PUBLICATION outbox_log; DROP TABLE outbox.lookalike").unwrap();

    // The slot first: any role with REPLICATION can make one of the name the outbox would.
    let slot: String = db.query_one("SELECT slot::text FROM outbox.outbox_log_state", &[]).unwrap().get(0);
    squat.batch_execute(&format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")).unwrap();
    let error = owner.batch_execute("SELECT outbox.outbox_set_mode('log')").expect_err("a squatter's slot");
    assert!(
        error.as_db_error().unwrap().message().contains(&format!("a replication slot named {slot} exists that the outbox did not make")),
        "{error}"
    );
    assert_nothing_switched(&mut db);
    let doctor = outbox(&["doctor", "--database-url", &url("outbox_owner", db_name)]);
    assert!(text(&doctor).contains(&format!("replication slot {slot}: not one the outbox made")), "{}", text(&doctor));
    squat.batch_execute(&format!("SELECT pg_drop_replication_slot('{slot}')")).unwrap();

    // With neither, the switch makes its own publication, of the outbox's table alone.
    owner.batch_execute("SELECT outbox.outbox_set_mode('log')").unwrap();
    let published: Vec<String> = db
        .query("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'outbox_log'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(published, vec!["outbox.outbox_log".to_string()]);
    // A slot someone makes before the relay does is never read: the relay says why, and once it
    // is dropped, makes its own and delivers what waited.
    squat.batch_execute(&format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")).unwrap();
    let receiver = Receiver::start();
    owner
        .batch_execute(&format!(
            "SELECT outbox.outbox_endpoint_set('default', '{}');
             SELECT outbox.outbox_enqueue('order.placed', '{{\"n\": 1}}');",
            receiver.url
        ))
        .unwrap();
    let relay_url = url("outbox_relay", db_name);
    let mut relay = Relay::start(&["--database-url", relay_url.as_str(), "--poll-interval", "100ms"]);
    assert_eq!(count(&mut db, "SELECT count(*) FROM outbox.outbox_log_lag() WHERE slot_state = 'foreign'"), 1);
    relay.wait_until("the relay has tried to make the slot", Duration::from_secs(20), || {
        count(&mut db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%outbox_log_make_slot(%'") > 0
    });
    assert_eq!(receiver.count(), 0, "nothing is read from a slot the outbox did not make");
    squat.batch_execute(&format!("SELECT pg_drop_replication_slot('{slot}')")).unwrap();
    relay.wait_until("the relay makes its own slot and delivers", Duration::from_secs(30), || receiver.distinct() == 1);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
    assert!(said.contains(&format!("a replication slot named {slot} exists that the outbox did not make")), "{said}");
}

#[test]
fn log_mode_refuses_an_owner_that_cannot_make_a_slot_and_a_log_nobody_reads_shows() {
    let db_name = "outbox_t_log_stall";
    let mut db = fresh_database(db_name);
    connect("postgres", "postgres").batch_execute("ALTER ROLE outbox_owner NOREPLICATION").unwrap();
    migrate(db_name, &[]);
    let mut owner = connect("outbox_owner", db_name);
    let error = owner.batch_execute("SELECT outbox.outbox_set_mode('log')").expect_err("an owner without REPLICATION");
    let error = error.as_db_error().expect("an error of the server");
    assert_eq!(error.code().code(), "42501", "{error:?}");
    assert!(
        error.message().contains("log mode needs a replication slot, and the outbox's owner outbox_owner cannot make one"),
        "{}",
        error.message()
    );
    assert!(error.hint().unwrap_or_default().contains("ALTER ROLE outbox_owner REPLICATION"), "{error:?}");
    assert_nothing_switched(&mut db);

    // With REPLICATION it switches; with no relay to read the log, its events show as pending
    // at once (the slot is not made yet), and the lag grows from the switch.
    connect("postgres", "postgres").batch_execute("ALTER ROLE outbox_owner REPLICATION").unwrap();
    owner
        .batch_execute(
            "SELECT outbox.outbox_endpoint_set('default', 'http://127.0.0.1:9/hook');
             SELECT outbox.outbox_endpoint_set('audit', 'http://127.0.0.1:9/audit', '{order.*}');
             SELECT outbox.outbox_set_mode('log');
             SELECT outbox.outbox_enqueue('order.placed', '{}') FROM generate_series(1, 3);
             SELECT outbox.outbox_enqueue('user.created', '{}');",
        )
        .unwrap();
    let pending: Vec<(String, i64)> = db
        .query("SELECT endpoint, pending FROM outbox.outbox_endpoint_stats() ORDER BY endpoint", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(pending, vec![("audit".to_string(), 3), ("default".to_string(), 4)]);
    assert_eq!(count(&mut db, "SELECT pending FROM outbox.outbox_stats()"), 7);
    let lag = |db: &mut postgres::Client| -> f64 {
        db.query_one("SELECT lag_seconds FROM outbox.outbox_log_lag() WHERE slot_state = 'missing'", &[]).unwrap().get(0)
    };
    let first = lag(&mut db);
    wait_until("the lag grows while nothing reads the log", Duration::from_secs(10), || lag(&mut db) > first);
    assert!(count(&mut db, "SELECT count(*) FROM outbox.outbox_stats() WHERE oldest_pending_age > interval '0'") == 1);

    // The log's hourly partitions are the outbox's, in log mode and back in table mode.
    let doctor_url = url("outbox_owner", db_name);
    for mode in ["log", "table"] {
        owner.batch_execute(&format!("SELECT outbox.outbox_set_mode('{mode}')")).unwrap();
        assert!(count(&mut db, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.outbox_log'::regclass") > 1);
        let doctor = outbox(&["doctor", "--database-url", &doctor_url]);
        assert_eq!(doctor.status.code(), Some(0), "in {mode} mode: {}", text(&doctor));
    }
}
