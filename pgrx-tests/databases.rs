//! Several databases: the launcher serves every database where outbox_ext is installed (the
//! test cluster leaves `outbox.database` unset), with `outbox.workers` relay workers in each,
//! none in a database without the extension, and lets a database go when it is dropped or
//! renamed while events flow in the others.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

const PREFIX: &str = "outbox_several";
const WAIT: Duration = Duration::from_secs(30);

/// Relay workers connected to each database whose name starts with PREFIX.
fn relays_per_database(db: &mut Db) -> HashMap<String, i64> {
    let sql = format!(
        "SELECT datname::text, count(*) FROM pg_stat_activity WHERE backend_type = 'outbox_ext relay' AND datname LIKE '{PREFIX}%' GROUP BY 1"
    );
    db.client.query(&sql, &[]).unwrap().iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// A new session on `name`, where outbox_ext delivers every topic to `url`.
fn with_extension(db: &mut Db, name: &str, url: &str) -> postgres::Client {
    let mut client = db.connect(name, "postgres");
    client
        .batch_execute(&format!(
            "CREATE EXTENSION outbox_ext;
             SELECT outbox_endpoint_drop('default');
             SELECT outbox_endpoint_set('sink', '{url}', '{{*}}')"
        ))
        .unwrap_or_else(|e| panic!("install in {name}: {e}"));
    client
}

/// Enqueues events `from..to` in `database`, ten per transaction; each payload names the
/// database it came from.
fn enqueue(client: &mut postgres::Client, database: &str, from: i64, to: i64) {
    for start in (from..to).step_by(10) {
        let end = (start + 9).min(to - 1);
        client
            .execute(
                "SELECT outbox_enqueue('several', jsonb_build_object('db', $1::text, 'n', n)) FROM generate_series($2::bigint, $3::bigint) n",
                &[&database, &start, &end],
            )
            .unwrap_or_else(|e| panic!("enqueue in {database}: {e}"));
    }
}

/// The `n`s the receiver got from `database`.
fn received_from(receiver: &Receiver, database: &str) -> BTreeSet<i64> {
    receiver
        .deliveries()
        .iter()
        .map(|delivery| delivery.json())
        .filter(|body| body["data"]["db"] == database)
        .map(|body| body["data"]["n"].as_i64().unwrap())
        .collect()
}

fn sent_in(client: &mut postgres::Client) -> i64 {
    client.query_one("SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NOT NULL", &[]).unwrap().get(0)
}

#[test]
fn every_database_with_the_extension_is_served_and_one_dropped_or_renamed_mid_run_is_let_go() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    // Requests abandoned by workers leaving a renamed database come back quickly.
    db.configure(&[("outbox.lease", "3s"), ("outbox.http_timeout", "1s")]);
    let [a, b, c, renamed, late, plain] = ["a", "b", "c", "c_renamed", "late", "plain"].map(|name| format!("{PREFIX}_{name}"));
    for name in [&a, &b, &c, &renamed, &late, &plain] {
        db.execute(&format!("DROP DATABASE IF EXISTS {name}"));
    }
    for name in [&a, &b, &c, &plain] {
        db.execute(&format!("CREATE DATABASE {name}"));
    }
    let mut clients: HashMap<&str, postgres::Client> =
        [&a, &b, &c].map(|name| (name.as_str(), with_extension(&mut db, name, &receiver.url))).into();
    let expected: HashMap<String, i64> = [(a.clone(), 2), (b.clone(), 2), (c.clone(), 2)].into();
    db.wait_for("two relay workers in each database with the extension, none in the one without", WAIT, |db| {
        relays_per_database(db) == expected
    });
    for name in [&a, &b, &c] {
        enqueue(clients.get_mut(name.as_str()).unwrap(), name, 0, 100);
    }

    // Mid-run: events keep coming in `a` while `b` is dropped and `c` renamed, each with a
    // plain command (no FORCE) once its own session closed.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (stop, mut client, name) = (stop.clone(), clients.remove(a.as_str()).unwrap(), a.clone());
        thread::spawn(move || {
            let mut next = 100;
            while !stop.load(Ordering::SeqCst) {
                enqueue(&mut client, &name, next, next + 10);
                next += 10;
            }
            next
        })
    };
    drop(clients.remove(b.as_str()));
    db.execute(&format!("DROP DATABASE {b}"));
    drop(clients.remove(c.as_str()));
    db.execute(&format!("ALTER DATABASE {c} RENAME TO {renamed}"));
    let mut renamed_client = db.connect(&renamed, "postgres");
    enqueue(&mut renamed_client, &c, 100, 200);

    // A database created and given the extension while the server runs is served within seconds.
    db.execute(&format!("CREATE DATABASE {late}"));
    let mut late_client = with_extension(&mut db, &late, &receiver.url);
    let installed = Instant::now();
    enqueue(&mut late_client, &late, 0, 100);
    wait_until("the new database's first event arrives", Duration::from_secs(10), || !received_from(&receiver, &late).is_empty());
    let picked_up = installed.elapsed();

    stop.store(true, Ordering::SeqCst);
    let produced_in_a = producer.join().unwrap();
    let mut a_client = db.connect(&a, "postgres");
    let everything = |to: i64| (0..to).collect::<BTreeSet<i64>>();
    for (name, client, events) in [(&a, &mut a_client, produced_in_a), (&c, &mut renamed_client, 200), (&late, &mut late_client, 100)] {
        wait_until(&format!("every event of {name} is sent"), WAIT, || sent_in(client) == events);
        assert_eq!(received_from(&receiver, name), everything(events), "the receiver got every event of {name}");
    }
    let mut expected: HashMap<String, i64> = [(a.clone(), 2), (renamed.clone(), 2), (late.clone(), 2)].into();
    db.wait_for("two workers in each served database, the renamed one too", WAIT, |db| relays_per_database(db) == expected);
    let enqueued: i64 = a_client.query_one("SELECT outbox_enqueued()", &[]).unwrap().get(0);
    assert_eq!(enqueued, produced_in_a, "outbox_enqueued() counts this database's events only");
    let workers: Vec<i32> =
        a_client.query("SELECT worker FROM outbox_workers() ORDER BY 1", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(workers, [1, 2], "outbox_workers() shows this database's workers");
    assert!(picked_up < Duration::from_secs(10), "picked up after {picked_up:?}");

    // Without the extension a database's workers leave, and the launcher does not look into it
    // again until a CREATE EXTENSION commits there: only that wakeup brings them back.
    a_client.batch_execute("DROP EXTENSION outbox_ext CASCADE").unwrap();
    expected.remove(&a);
    db.wait_for("the workers leave the database whose extension was dropped", WAIT, |db| relays_per_database(db) == expected);
    a_client.batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    expected.insert(a.clone(), 2);
    db.wait_for("the workers come back with the extension", Duration::from_secs(10), |db| relays_per_database(db) == expected);

    // outbox.relay = off for one database (a restored copy that must not deliver): its workers
    // stop and stay away, and its events wait; RESET brings them back and the events go.
    db.execute(&format!("ALTER DATABASE {renamed} SET outbox.relay = off"));
    expected.remove(&renamed);
    db.wait_for("the workers leave the database with outbox.relay off", WAIT, |db| relays_per_database(db) == expected);
    let mut copy = db.connect(&renamed, "postgres");
    enqueue(&mut copy, &c, 200, 210);
    db.execute(&format!("ALTER DATABASE {renamed} RESET outbox.relay"));
    expected.insert(renamed.clone(), 2);
    db.wait_for("the workers come back after RESET", Duration::from_secs(10), |db| relays_per_database(db) == expected);
    wait_until("the events that waited are sent", WAIT, || sent_in(&mut copy) == 210);
    drop(copy);
    // The same through the workers' role (they read its settings in the database too).
    db.execute(&format!("ALTER ROLE postgres IN DATABASE {renamed} SET outbox.relay = off"));
    expected.remove(&renamed);
    db.wait_for("the workers leave after ALTER ROLE … IN DATABASE", WAIT, |db| relays_per_database(db) == expected);
    db.execute(&format!("ALTER ROLE postgres IN DATABASE {renamed} RESET outbox.relay"));
    expected.insert(renamed.clone(), 2);
    db.wait_for("and come back after its RESET", Duration::from_secs(10), |db| relays_per_database(db) == expected);

    // A transaction that changed outbox.relay cannot be prepared: its COMMIT PREPARED could come
    // from a session whose callbacks never tell the relay.
    let refused = db
        .client
        .batch_execute(&format!("BEGIN; ALTER DATABASE {renamed} SET outbox.relay = off; PREPARE TRANSACTION 'outbox_relay_off'"))
        .expect_err("PREPARE TRANSACTION is refused");
    assert!(refused.as_db_error().is_some_and(|e| e.message().starts_with("outbox_ext: cannot PREPARE")), "{refused}");
    db.execute("ROLLBACK");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM pg_prepared_xacts"), 0, "nothing was prepared");

    drop((a_client, renamed_client, late_client));
    for name in [&a, &renamed, &late, &plain] {
        db.execute(&format!("DROP DATABASE {name}"));
    }
    db.wait_for("no relay worker left in the dropped databases", WAIT, |db| relays_per_database(db).is_empty());
}

#[test]
fn create_extension_refuses_a_database_that_is_not_utf8() {
    let mut db = db();
    db.execute("DROP DATABASE IF EXISTS outbox_latin1");
    db.execute("CREATE DATABASE outbox_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    let mut latin1 = db.connect("outbox_latin1", "postgres");
    let error = latin1.batch_execute("CREATE EXTENSION outbox_ext").expect_err("a LATIN1 database");
    let error = error.as_db_error().unwrap_or_else(|| panic!("{error}"));
    assert_eq!(error.code(), &postgres::error::SqlState::FEATURE_NOT_SUPPORTED, "{error}");
    assert_eq!(error.message(), "outbox_ext needs a database whose encoding is UTF8; this one is LATIN1");
    drop(latin1);
    db.execute("DROP DATABASE outbox_latin1 WITH (FORCE)");
}
