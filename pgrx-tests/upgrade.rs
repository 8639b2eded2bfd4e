//! `ALTER EXTENSION outbox_ext UPDATE` from every released version keeps every row, keeps
//! working setups working, and ends with exactly the objects a fresh install has.

use std::time::Duration;

use super::cluster::{db, wait_until};
use super::receiver::{Receiver, Reply};
use crate::catalog::LIBRARY_VERSION;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Every object of the installed extension, described with what matters to a user: function
/// definitions (security, search_path, body) and who may run them, columns, defaults,
/// indexes, comments, privileges and what pg_dump keeps. The pg_test schema `tests` exists
/// only in test builds of a fresh install and is left out.
const DESCRIBE_EXTENSION: &str = "
    WITH members AS (
        SELECT d.classid, d.objid
          FROM pg_depend AS d
          JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'outbox_ext'
         WHERE d.deptype = 'e' AND d.refclassid = 'pg_extension'::regclass
    )
    SELECT 'function ' || p.oid::regprocedure || E'\\n' || pg_get_functiondef(p.oid)
           || E'\\nexecute: ' || coalesce((SELECT string_agg(a.grantee::regrole::text, ',' ORDER BY a.grantee::regrole::text)
                                           FROM aclexplode(p.proacl) AS a
                                          WHERE a.grantee::regrole::text NOT LIKE 'legacy%'), 'PUBLIC (default)')
      FROM members AS m JOIN pg_proc AS p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
     WHERE p.pronamespace::regnamespace::text <> 'tests'
    UNION ALL
    SELECT 'relation ' || c.oid::regclass || ' kind ' || c.relkind::text
           || ' granted to others: ' || coalesce((SELECT string_agg(a.grantee::regrole || ' ' || a.privilege_type, ',' ORDER BY a.grantee::regrole || ' ' || a.privilege_type)
                                                  FROM aclexplode(c.relacl) AS a
                                                 WHERE a.grantee <> c.relowner
                                                   AND a.grantee::regrole::text NOT LIKE 'legacy%'), 'nobody')
           || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '')
           || coalesce(' index ' || pg_get_indexdef(c.oid), '')
           || coalesce((SELECT string_agg(format(E'\\n  %s %s%s%s%s %s', a.attname, format_type(a.atttypid, a.atttypmod),
                                                 CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                                                 coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''),
                                                 CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END,
                                                 coalesce(col_description(c.oid, a.attnum), '')), '' ORDER BY a.attnum)
                          FROM pg_attribute AS a
                          LEFT JOIN pg_attrdef AS ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
      FROM members AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
    UNION ALL
    SELECT 'indexes of ' || i.indrelid::regclass || ': ' || pg_get_indexdef(i.indexrelid)
      FROM members AS m JOIN pg_index AS i ON m.classid = 'pg_class'::regclass AND i.indrelid = m.objid
    UNION ALL
    SELECT 'pg_dump keeps the rows of ' || (SELECT string_agg(c::regclass::text, ', ' ORDER BY c::regclass::text) FROM unnest(e.extconfig) AS c)
      FROM pg_extension AS e WHERE e.extname = 'outbox_ext'
    ORDER BY 1";

/// 0.1.0's rows as JSON: each event with its delivery state, read from 0.1.0's outbox before
/// the update and from the default endpoint's deliveries after it; and processed_events.
const ROWS_0_1_0: &str = "
    SELECT (SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.id), '[]')
              FROM (SELECT id, topic, payload, created_at, available_at, attempts, sent_at, dead_at, last_error, claimed_by
                      FROM outbox) AS o)::text
        || (SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.consumer, p.event_id), '[]') FROM processed_events AS p)::text";
const ROWS_0_2_0: &str = "
    SELECT (SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.id), '[]')
              FROM (SELECT o.id, o.topic, o.payload, o.created_at, d.available_at, d.attempts, d.sent_at, d.dead_at, d.last_error, d.claimed_by
                      FROM outbox AS o JOIN outbox_deliveries AS d ON d.event_id = o.id AND d.endpoint = 'default') AS o)::text
        || (SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.consumer, p.event_id), '[]') FROM processed_events AS p)::text";

fn describe(client: &mut postgres::Client) -> Vec<String> {
    client.query(DESCRIBE_EXTENSION, &[]).unwrap().iter().map(|row| row.get(0)).collect()
}

/// The served database goes back to 0.1.0, with sent, dead, backing-off and pending events,
/// processed_events, a 0.1.0 producer and a signing secret; the update keeps every row, the
/// workers deliver what was pending (signed with the old secret) and leave the dead alone, and
/// the result has exactly the objects of a fresh install.
#[test]
fn updating_from_0_1_0_keeps_every_row_delivers_the_pending_and_ends_as_a_fresh_install() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.fresh_role("legacy_producer");
    db.execute("DROP DATABASE IF EXISTS outbox_fresh");
    db.execute("CREATE DATABASE outbox_fresh");
    db.execute("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext VERSION '0.1.0' SCHEMA public");
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.signing_secret", SECRET)]);
    db.execute(
        "-- 0.1.0's recipe for a producer: table privileges and PUBLIC's EXECUTE.
         GRANT INSERT, SELECT (id) ON outbox TO legacy_producer;
         INSERT INTO outbox (topic, payload) SELECT 'order.placed', jsonb_build_object('n', n) FROM generate_series(1, 50) AS n;
         UPDATE outbox SET sent_at = now(), attempts = 1 WHERE id <= 20;
         UPDATE outbox SET dead_at = now(), attempts = 10, last_error = 'HTTP 500' WHERE id BETWEEN 21 AND 25;
         UPDATE outbox SET attempts = 2, available_at = now() + interval '1 hour', last_error = 'timeout' WHERE id BETWEEN 26 AND 30;
         SELECT outbox_mark_processed(id, 'billing') FROM generate_series(1, 20) AS id;",
    );
    let first: i64 = db.value("SELECT min(id) FROM outbox");
    let before: String = db.value(ROWS_0_1_0);
    // Between installing the 0.2.0 library and the update, 0.1.0's outbox_enqueue says what to
    // do and writes nothing; the workers wait.
    let error = db.as_role("legacy_producer", "SELECT outbox_enqueue('legacy', '{}')").expect_err("0.1.0's enqueue on the new library");
    let error = error.as_db_error().expect("a database error");
    assert!(error.detail().unwrap_or_default().contains("ALTER EXTENSION outbox_ext UPDATE"), "{error:?}");
    assert_eq!(db.count_events("topic = 'legacy'"), 0);
    assert!(receiver.deliveries().is_empty(), "the 0.2.0 workers wait for the update");

    // The rows are read in the update's transaction: once it commits, the workers start claiming.
    let mut update = db.client.transaction().expect("begin");
    update.batch_execute("ALTER EXTENSION outbox_ext UPDATE").expect("update");
    let after: String = update.query_one(ROWS_0_2_0, &[]).expect("rows").get(0);
    update.commit().expect("commit");
    assert_eq!(db.value::<String>("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'"), LIBRARY_VERSION);
    assert_eq!(after, before, "every row is kept, its delivery state now the default endpoint's");
    assert_eq!(db.value::<i64>("SELECT sent FROM outbox_stats()"), 20, "sent rows are counted");

    // The 20 events still to deliver (31..50 of 0.1.0) arrive, signed with 0.1.0's secret.
    let pending: Vec<i64> = (first + 30..first + 50).collect();
    wait_until("the pending events are delivered after the update", Duration::from_secs(20), || {
        pending.iter().all(|id| !receiver.deliveries_of(*id).is_empty())
    });
    for delivery in receiver.deliveries() {
        assert!(pending.contains(&delivery.id), "only pending events are sent, not {}", delivery.id);
        assert!(delivery.verified_by_standardwebhooks(SECRET), "event {} is signed with 0.1.0's secret", delivery.id);
    }
    assert_eq!(db.count("dead_at IS NOT NULL"), 5, "dead events stay dead");
    assert_eq!(db.count("attempts = 2 AND sent_at IS NULL"), 5, "events backing off wait for their time");

    // The update takes PUBLIC's EXECUTE away; CHANGELOG.md tells the DBA to grant it to each
    // producer (grants made by an extension script would not survive a dump and restore).
    let refused = db.as_role("legacy_producer", "SELECT outbox_enqueue('legacy', '{}')");
    assert_eq!(refused.expect_err("PUBLIC may no longer enqueue").code().map(|c| c.code()), Some("42501"));
    let refused = db.as_role("legacy_producer", "INSERT INTO outbox (topic, payload) VALUES ('legacy', '{}')");
    assert_eq!(
        refused.expect_err("an INSERT would be an event without a delivery").code().map(|c| c.code()),
        Some("42501"),
        "the update takes 0.1.0's INSERT privilege back"
    );
    db.execute("GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, timestamptz) TO legacy_producer");
    db.as_role("legacy_producer", "SELECT outbox_enqueue('legacy', '{}')")
        .expect("with the CHANGELOG's GRANT, a 0.1.0 producer still enqueues");
    let next = db.enqueue("after.update", "{}");
    assert!(next > first + 50, "ids go on from where 0.1.0 left them ({next})");

    let mut fresh = db.connect("outbox_fresh", "postgres");
    fresh.batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let (updated, installed) = (describe(&mut db.client), describe(&mut fresh));
    assert!(installed.len() > 5, "the description covers the objects: {installed:#?}");
    assert_eq!(updated, installed, "0.1.0 updated has exactly the objects of a fresh install");
    drop(fresh);
    db.execute("DROP DATABASE outbox_fresh");
    // As a fresh install (with the test build's own objects, which 0.1.0's script lacks).
    db.execute("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext SCHEMA public");
    db.execute("DROP OWNED BY legacy_producer; DROP ROLE legacy_producer");
}

/// The released versions whose update to this one the chain test starts from: every install
/// script listed in sql/released.sha256 from 0.2.0 on (0.1.0 has its own test above: its rows
/// change shape in the update).
fn released_since_0_2_0() -> Vec<&'static str> {
    include_str!("../sql/released.sha256")
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1)?.strip_prefix("sql/outbox_ext--")?.strip_suffix(".sql"))
        .filter(|version| !version.contains("--") && *version != "0.1.0")
        .collect()
}

/// What a 0.2.0 user has: a webhook endpoint with headers and a secret (disabled, so the
/// workers leave its deliveries as they are), an ordered pull endpoint granted to a consumer,
/// with a job acknowledged, one dead, one in flight under an hour's lease and the rest
/// waiting behind their keys, and processed_events.
const ROWS_OF_A_0_2_0_USER: &str = "
    SELECT outbox_endpoint_drop('default');
    SELECT outbox_endpoint_set('hooks', 'http://127.0.0.1:9/hooks', '{order.*}', headers => '{\"X-Team\": \"billing\"}');
    SELECT outbox_endpoint_rotate_secret('hooks');
    SELECT outbox_endpoint_disable('hooks');
    SELECT outbox_endpoint_set('jobs', NULL, '{job.*}', kind => 'pull', ordered => true, max_attempts => 1);
    SELECT outbox_endpoint_grant('jobs', 'chain_consumer');
    SELECT outbox_enqueue('order.placed', jsonb_build_object('n', n)) FROM generate_series(1, 3) AS n;
    SELECT outbox_enqueue('job.run', jsonb_build_object('n', n), 'k' || (n % 3)) FROM generate_series(1, 6) AS n;
    SELECT outbox_ack('jobs', event_id, attempt) FROM outbox_claim('jobs', 1);
    SELECT outbox_nack('jobs', event_id, attempt, 'failed on purpose') FROM outbox_claim('jobs', 1);
    SELECT count(*) FROM outbox_claim('jobs', 1, '1 hour');
    SELECT outbox_mark_processed(min(id), 'billing') FROM outbox;";

/// Each table of the extension with its rows as a JSON array.
fn rows_by_table(db: &mut super::cluster::Db) -> Vec<(String, i64, String)> {
    let tables = db.column::<String>(
        "SELECT c.oid::regclass::text
           FROM pg_depend AS d
           JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'outbox_ext'
           JOIN pg_class AS c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid AND c.relkind = 'r'
          WHERE d.deptype = 'e'
          ORDER BY 1",
    );
    tables
        .into_iter()
        .map(|table| {
            let row = db
                .client
                .query_one(&format!("SELECT count(*), coalesce(jsonb_agg(to_jsonb(t)), '[]')::text FROM {table} AS t"), &[])
                .unwrap();
            (table, row.get(0), row.get(1))
        })
        .collect()
}

/// From every version released since 0.2.0, with a user's rows in every table: the update
/// keeps each row (a later version may add columns, never drop what a row had) and ends with
/// exactly the objects of a fresh install.
#[test]
fn updating_from_every_release_since_0_2_0_keeps_every_row_and_ends_as_a_fresh_install() {
    let versions = released_since_0_2_0();
    assert!(versions.contains(&"0.2.0"), "sql/released.sha256 lists 0.2.0's install script: {versions:?}");
    let mut db = db();
    db.fresh_role("chain_consumer");
    db.execute("DROP DATABASE IF EXISTS outbox_fresh");
    db.execute("CREATE DATABASE outbox_fresh");
    let mut fresh = db.connect("outbox_fresh", "postgres");
    fresh.batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let installed = describe(&mut fresh);
    drop(fresh);
    db.execute("DROP DATABASE outbox_fresh");
    for version in versions {
        db.execute(&format!("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext VERSION '{version}' SCHEMA public"));
        db.execute(ROWS_OF_A_0_2_0_USER);
        let before = rows_by_table(&mut db);
        assert!(before.iter().filter(|(_, rows, _)| *rows > 0).count() >= 8, "a user's rows fill the tables: {before:#?}");

        db.execute("ALTER EXTENSION outbox_ext UPDATE");
        assert_eq!(db.value::<String>("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'"), LIBRARY_VERSION);
        for (table, rows, json) in &before {
            let kept: bool = db
                .client
                .query_one(
                    &format!("SELECT count(*) = $1 AND coalesce(jsonb_agg(to_jsonb(t)), '[]') @> $2::text::jsonb FROM {table} AS t"),
                    &[rows as &(dyn postgres::types::ToSql + Sync), json],
                )
                .unwrap()
                .get(0);
            assert!(kept, "updating from {version} keeps the {rows} rows of {table}: {json}");
        }
        assert_eq!(describe(&mut db.client), installed, "{version} updated has exactly the objects of a fresh install");
    }
    db.execute("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext SCHEMA public");
    db.execute("DROP OWNED BY chain_consumer; DROP ROLE chain_consumer");
}
