//! An `outbox relay` serving the extension's install obeys the server as the relay workers do:
//! it is woken by the commit, connects only where the server's `outbox.allowed_destinations`
//! (and its own flag) allow, and delivers nothing while `outbox.relay` is off for the database.

mod support;

use std::time::Duration;

use support::*;

/// A database with the extension in schema outbox and its endpoint `default` at `receiver`.
fn extension_database(name: &str, receiver: &Receiver) -> postgres::Client {
    let mut db = fresh_database(name);
    db.batch_execute(&format!(
        "CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox;
         SELECT outbox.outbox_endpoint_set('default', '{}');",
        receiver.url
    ))
    .unwrap();
    db
}

fn count(db: &mut postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).unwrap().get(0)
}

/// Sets a server setting for the test, reset when dropped (the cluster is shared).
struct ServerSetting<'a>(&'a str);

impl<'a> ServerSetting<'a> {
    fn set(name: &'a str, value: &str) -> ServerSetting<'a> {
        let mut admin = connect("postgres", "postgres");
        admin.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        ServerSetting(name)
    }
}

impl Drop for ServerSetting<'_> {
    fn drop(&mut self) {
        let mut admin = connect("postgres", "postgres");
        admin.batch_execute(&format!("ALTER SYSTEM RESET {}", self.0)).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    }
}

#[test]
fn a_relay_serving_the_extension_is_woken_by_the_commit_not_by_its_poll() {
    let receiver = Receiver::start();
    let mut db = extension_database("outbox_t_ext_wake", &receiver);
    let relay_url = url("postgres", "outbox_t_ext_wake");
    // A poll a minute away: only the commit's NOTIFY can bring the event within the deadline.
    let mut relay = Relay::start(&["--database-url", &relay_url, "--listen-url", &relay_url, "--poll-interval", "60s"]);
    relay.wait_until("the relay asks to be notified", Duration::from_secs(20), || {
        count(&mut db, "SELECT count(*) FROM outbox.outbox_relays WHERE listening") == 1
    });
    db.batch_execute("BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{}'); ROLLBACK;").unwrap();
    db.batch_execute("BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{}'); COMMIT;").unwrap();
    relay.wait_until("the committed event arrives", Duration::from_secs(10), || receiver.count() == 1);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
    assert_eq!(receiver.count(), 1, "the rolled-back event was never sent");
}

#[test]
fn a_relay_serving_the_extension_connects_only_where_the_servers_allowed_destinations_allow() {
    let receiver = Receiver::start();
    let mut db = extension_database("outbox_t_ext_allowed", &receiver);
    // The relay's own flag allows every address; the server allows 127.0.0.2 alone.
    let _allowed = ServerSetting::set("outbox.allowed_destinations", "127.0.0.2/32");
    let relay_url = url("postgres", "outbox_t_ext_allowed");
    let mut relay = Relay::start(&["--database-url", &relay_url, "--poll-interval", "100ms"]);
    db.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    relay.wait_until("the attempt is refused", Duration::from_secs(20), || {
        count(
            &mut db,
            "SELECT count(*) FROM outbox.outbox_deliveries WHERE last_error = 'destination not allowed by outbox.allowed_destinations'",
        ) == 1
    });
    assert_eq!(receiver.count(), 0, "nothing reached the receiver the server does not allow");
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}

/// The server's clock now, as text: a mark to compare the relay's connections with.
fn mark(db: &mut postgres::Client) -> String {
    db.query_one("SELECT clock_timestamp()::text", &[]).unwrap().get(0)
}

/// Whether the relay connected after `mark`: while outbox.relay is off it connects again at
/// each poll to look, and it connects anew once it found it turned off.
fn connected_after(db: &mut postgres::Client, mark: &str) -> bool {
    count(
        db,
        &format!(
            "SELECT count(*) FROM pg_stat_activity
              WHERE application_name = 'outbox relay' AND datname = current_database() AND backend_start > '{mark}'"
        ),
    ) > 0
}

#[test]
fn a_relay_serving_the_extension_delivers_nothing_while_outbox_relay_is_off_when_it_starts_or_later() {
    let receiver = Receiver::start();
    let mut db = extension_database("outbox_t_ext_relay_off", &receiver);
    let relay_url = url("postgres", "outbox_t_ext_relay_off");
    // A restored copy: turned off before any relay connects.
    db.batch_execute("ALTER DATABASE outbox_t_ext_relay_off SET outbox.relay = off").unwrap();
    db.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 1}')").unwrap();
    let mut relay = Relay::start(&["--database-url", &relay_url, "--poll-interval", "100ms"]);
    for look in ["the relay has looked", "the relay has looked again"] {
        let since = mark(&mut db);
        relay.wait_until(look, Duration::from_secs(20), || connected_after(&mut db, &since));
    }
    assert_eq!(receiver.count(), 0, "nothing is delivered while outbox.relay is off");
    assert_eq!(count(&mut db, "SELECT count(*) FROM outbox.outbox_relays"), 0, "the relay does not start serving");

    db.batch_execute("ALTER DATABASE outbox_t_ext_relay_off RESET outbox.relay").unwrap();
    relay.wait_until("the event is delivered once outbox.relay is on", Duration::from_secs(20), || receiver.count() == 1);

    // Turned off while the relay serves: it stops at its next poll, and looks again at each.
    let turned_off = mark(&mut db);
    db.batch_execute("ALTER DATABASE outbox_t_ext_relay_off SET outbox.relay = off").unwrap();
    relay.wait_until("the relay stops serving", Duration::from_secs(20), || connected_after(&mut db, &turned_off));
    db.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 2}')").unwrap();
    let enqueued = mark(&mut db);
    relay.wait_until("the relay has looked since", Duration::from_secs(20), || connected_after(&mut db, &enqueued));
    assert_eq!(receiver.count(), 1, "nothing more is delivered once outbox.relay is off again");
    db.batch_execute("ALTER DATABASE outbox_t_ext_relay_off RESET outbox.relay").unwrap();
    relay.wait_until("the second event is delivered", Duration::from_secs(20), || receiver.count() == 2);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
    assert!(said.contains("outbox.relay is off for this database"), "{said}");
}

#[test]
fn a_relay_serving_the_extension_sends_the_endpoint_default_to_the_servers_webhook_url() {
    let receiver = Receiver::start();
    let mut db = fresh_database("outbox_t_ext_webhook_url");
    // The endpoint default as CREATE EXTENSION makes it: no URL of its own.
    db.batch_execute("CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox").unwrap();
    let _url = ServerSetting::set("outbox.webhook_url", &receiver.url);
    let relay_url = url("postgres", "outbox_t_ext_webhook_url");
    let mut relay = Relay::start(&["--database-url", &relay_url, "--poll-interval", "100ms"]);
    db.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    relay.wait_until("the event reaches outbox.webhook_url", Duration::from_secs(20), || receiver.count() == 1);
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}
