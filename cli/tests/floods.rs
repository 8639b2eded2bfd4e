//! What any role can do to a relay without any privilege of the outbox's: notify its channel
//! in a loop, or run its maintenance at the same time as another.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::*;

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The relay's claims so far, from its /metrics.
fn claims(metrics: &str) -> u64 {
    let mut stream = TcpStream::connect(metrics).expect("connect to /metrics");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page.lines()
        .find_map(|line| line.strip_prefix("outbox_relay_claim_duration_seconds_count "))
        .unwrap_or_else(|| panic!("no claim count in {page}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_flood_of_notifications_costs_the_relay_a_claim_per_5_ms_at_most() {
    let mut db = fresh_database("outbox_t_flood");
    migrate("outbox_t_flood", &[]);
    let receiver = Receiver::start();
    connect("outbox_owner", "outbox_t_flood")
        .batch_execute(&format!("SELECT outbox.outbox_endpoint_set('default', '{}')", receiver.url))
        .unwrap();
    let relay_url = url("outbox_relay", "outbox_t_flood");
    let metrics = format!("127.0.0.1:{}", free_port());
    // A poll a minute away: every claim in the flood is one a notification started.
    let mut relay =
        Relay::start(&["--database-url", &relay_url, "--listen-url", &relay_url, "--poll-interval", "60s", "--metrics", &metrics]);
    relay.wait_until("the relay asks to be notified", Duration::from_secs(20), || {
        db.query_one("SELECT count(*) FROM outbox.outbox_relays WHERE listening", &[]).unwrap().get::<_, i64>(0) == 1
    });
    relay.wait_until("its metrics are served", Duration::from_secs(20), || TcpStream::connect(&metrics).is_ok());
    // A role with nothing of the outbox's may notify its channel.
    let mut app = connect("app", "outbox_t_flood");
    let before = claims(&metrics);
    let started = Instant::now();
    for _ in 0..3000 {
        app.batch_execute("NOTIFY outbox_enqueued").unwrap();
    }
    let made = claims(&metrics) - before;
    let bound = started.elapsed().as_millis() as u64 / 5 + 2;
    assert!(made <= bound, "{made} claims in {:?} of notifications, more than one per 5 ms ({bound})", started.elapsed());
    assert_eq!(receiver.count(), 0, "a notification is not an event");
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}

#[test]
fn two_sessions_making_the_log_partitions_at_once_both_succeed() {
    let mut owner_db = fresh_database("outbox_t_partitions");
    migrate("outbox_t_partitions", &[]);
    let mut first = connect("outbox_owner", "outbox_t_partitions");
    // The first makes the partitions of the next hours and has not committed them yet.
    first.batch_execute("BEGIN; SELECT outbox.outbox_log_maintain()").unwrap();
    let second = std::thread::spawn(|| {
        connect("outbox_owner", "outbox_t_partitions").query_one("SELECT outbox.outbox_log_maintain()", &[]).map(|row| row.get::<_, i32>(0))
    });
    // Once the second waits for the first (or has returned), the first commits: a second that
    // looked for a partition before that commit and makes it after must not fail.
    wait_until("the second maintains too", Duration::from_secs(20), || {
        second.is_finished()
            || owner_db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%outbox_log_maintain%'",
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0)
                > 0
    });
    first.batch_execute("COMMIT").unwrap();
    let made = second.join().unwrap();
    assert!(made.is_ok(), "the second maintenance failed: {made:?}");
    let partitions = |db: &mut postgres::Client| -> i64 {
        db.query_one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.outbox_log'::regclass", &[]).unwrap().get(0)
    };
    let made = partitions(&mut owner_db);
    assert!(made >= 7, "the default partition and six hours', made once: {made}");
    // A session in a zone half an hour off UTC names and bounds the same hours.
    let mut elsewhere = connect("outbox_owner", "outbox_t_partitions");
    elsewhere.batch_execute("SET TimeZone = 'Asia/Kolkata'").unwrap();
    elsewhere.query_one("SELECT outbox.outbox_log_maintain()", &[]).expect("maintained from another time zone");
    assert!(partitions(&mut owner_db) <= made + 1, "the same hours, not overlapping ones");
}

#[test]
fn no_role_stops_the_log_maintenance_by_holding_a_lock_of_its_own() {
    let mut db = fresh_database("outbox_t_maintain_lock");
    migrate("outbox_t_maintain_lock", &[]);
    let log: i64 = db.query_one("SELECT 'outbox.outbox_log'::regclass::oid::bigint", &[]).unwrap().get(0);
    // A role with nothing of the outbox's holds every advisory lock maintenance could take.
    let mut app = connect("app", "outbox_t_maintain_lock");
    app.batch_execute(&format!(
        "SELECT pg_advisory_lock(hashtext('outbox_log_maintain ' || {log})), pg_advisory_lock(hashtext('outbox_log_maintain'))"
    ))
    .unwrap();
    assert!(app.batch_execute("LOCK TABLE outbox.outbox_log_state IN SHARE UPDATE EXCLUSIVE MODE NOWAIT").is_err());
    let made: i32 = connect("outbox_owner", "outbox_t_maintain_lock").query_one("SELECT outbox.outbox_log_maintain()", &[]).unwrap().get(0);
    assert!(made >= 6, "the next hours' partitions are made: {made}");
}

#[test]
fn the_row_of_a_killed_relay_stops_costing_each_commit_a_notification() {
    let mut db = fresh_database("outbox_t_stale_relay");
    migrate("outbox_t_stale_relay", &[]);
    // A relay killed while it listened: its row says so, and is no longer refreshed.
    db.batch_execute(
        "INSERT INTO outbox.outbox_relays (host, pid, version, seen_at, listening) VALUES ('gone', 1, '0.3.0', now() - interval '10 minutes', true)",
    )
    .unwrap();
    let mut listener = connect("postgres", "outbox_t_stale_relay");
    listener.batch_execute("LISTEN outbox_enqueued").unwrap();
    let mut owner = connect("outbox_owner", "outbox_t_stale_relay");
    owner.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    // Notifications arrive in commit order: one the enqueue sent comes before this marker.
    connect("postgres", "outbox_t_stale_relay").batch_execute("NOTIFY outbox_enqueued, 'marker'").unwrap();
    let mut heard = Vec::new();
    let mut notifications = listener.notifications();
    let mut waiting = notifications.timeout_iter(Duration::from_secs(10));
    while let Some(notification) = postgres::fallible_iterator::FallibleIterator::next(&mut waiting).unwrap() {
        heard.push(notification.payload().to_string());
        if notification.payload() == "marker" {
            break;
        }
    }
    assert_eq!(heard, vec!["marker".to_string()], "no notification for a relay gone for 10 minutes");
}
