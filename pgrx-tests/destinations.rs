//! `outbox.allowed_destinations`: the relay connects only where it allows, checked on the
//! address a URL's host parses or resolves to, whatever the URL's spelling; a refused
//! destination gets one `last_error`, whatever listens there, and no connection. Only loopback
//! addresses are used: 127.0.0.1 allowed, 127.0.0.2 not (the resolver's filter of link-local
//! and other addresses is unit-tested in core/src/delivery/destinations.rs).

use std::net::TcpListener;
use std::time::Duration;

use super::cluster::{db, Db};
use super::receiver::{Receiver, Reply};

const REFUSED: &str = "destination not allowed by outbox.allowed_destinations";

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|rest| rest.split('/').next()).and_then(|port| port.parse().ok()).expect("a URL with a port")
}

/// Creates an endpoint per URL (one attempt each), enqueues one event to them all and waits
/// until every delivery is sent or dead; returns each endpoint's (sent, last_error).
fn deliver_once(db: &mut Db, prefix: &str, urls: &[String]) -> Vec<(String, bool, Option<String>)> {
    for (n, url) in urls.iter().enumerate() {
        db.execute(&format!("SELECT outbox_endpoint_set('{prefix}-{n}', '{url}', '{{{prefix}}}', max_attempts => 1)"));
    }
    let id = db.enqueue(prefix, "{}");
    db.wait_for("every delivery is sent or dead", Duration::from_secs(30), |db| {
        db.value::<i64>(&format!(
            "SELECT count(*) FROM outbox_deliveries
              WHERE event_id = {id} AND endpoint LIKE '{prefix}-%' AND sent_at IS NULL AND dead_at IS NULL"
        )) == 0
    });
    let rows = db
        .client
        .query(
            "SELECT endpoint, sent_at IS NOT NULL, last_error FROM outbox_deliveries
              WHERE event_id = $1 AND endpoint LIKE $2 || '-%' ORDER BY length(endpoint), endpoint",
            &[&id, &prefix],
        )
        .expect("the deliveries");
    for n in 0..urls.len() {
        db.execute(&format!("SELECT outbox_endpoint_drop('{prefix}-{n}')"));
    }
    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect()
}

#[test]
fn the_relay_connects_only_to_allowed_destinations_however_the_url_spells_the_address() {
    let mut db = db();
    let allowed = Receiver::start(Reply::Status(204));
    let other = Receiver::start_on("127.0.0.2", Reply::Status(204));
    let (port, allowed_port) = (port_of(&other.url), port_of(&allowed.url));
    // A port of 127.0.0.2 where nothing listens: refused the same way, so last_error tells no
    // one which ports are open.
    let closed = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2").local_addr().unwrap().port();
    db.configure(&[("outbox.allowed_destinations", "127.0.0.1/32")]);

    let spellings: Vec<String> = [
        format!("127.0.0.2:{port}"),
        format!("2130706434:{port}"),
        format!("0x7f000002:{port}"),
        format!("0x7f.0.0.2:{port}"),
        format!("127.2:{port}"),
        format!("0177.0.0.2:{port}"),
        format!("[::ffff:127.0.0.2]:{port}"),
        format!("[::ffff:7f00:2]:{port}"),
        format!("127.0.0.2:{closed}"),
    ]
    .iter()
    .map(|authority| format!("http://{authority}/events"))
    .chain([format!("http://127.0.0.1:{allowed_port}/events"), format!("http://localhost:{allowed_port}/events")])
    .collect();
    let outcomes = deliver_once(&mut db, "spelled", &spellings);
    let refused = &outcomes[..9];
    assert!(
        refused.iter().all(|(_, sent, error)| !sent && error.as_deref() == Some(REFUSED)),
        "every spelling of 127.0.0.2 is refused alike: {outcomes:?}"
    );
    assert_eq!(other.connections(), 0, "nothing connected to 127.0.0.2");
    assert!(outcomes[9..].iter().all(|(_, sent, _)| *sent), "127.0.0.1, as an address and as localhost, is allowed: {outcomes:?}");
    assert_eq!(allowed.deliveries().len(), 2);

    // A name is checked on what it resolves to: localhost is 127.0.0.1 (and ::1), neither of
    // which is allowed now.
    db.configure(&[("outbox.allowed_destinations", "127.0.0.3/32")]);
    let connections = allowed.connections();
    let outcomes = deliver_once(&mut db, "resolved", &[format!("http://localhost:{allowed_port}/events")]);
    assert_eq!(outcomes[0].2.as_deref(), Some(REFUSED), "{outcomes:?}");
    assert_eq!(allowed.connections(), connections, "no connection to what localhost resolves to");
    let health: Option<String> = db.value("SELECT last_error FROM outbox_endpoints WHERE name = 'default'");
    assert_ne!(health.as_deref(), Some(REFUSED), "another endpoint's health is its own");

    // A list that does not parse never takes effect: it is refused where it is written.
    for bad in ["localhost", "10.0.0.0/33", "127.0.0.1:0", "[::1"] {
        let error = db.client.batch_execute(&format!("ALTER SYSTEM SET outbox.allowed_destinations = '{bad}'")).expect_err(bad);
        let error = error.as_db_error().expect("a database error");
        assert_eq!(error.code().code(), "22023", "{bad}: {error}");
        assert!(error.detail().is_some_and(|detail| detail.contains(bad)), "{bad}: the detail names the entry: {error}");
    }
    db.execute("ALTER SYSTEM RESET outbox.allowed_destinations");
    db.configure(&[]);
}
