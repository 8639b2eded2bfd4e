//! `ALTER EXTENSION outbox_ext UPDATE` from every released version keeps every row, keeps
//! working setups working, and ends with exactly the objects a fresh install has.

use super::cluster::db;

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

/// The rows as JSON, to compare before and after.
const ALL_ROWS: &str = "
    SELECT (SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.id), '[]') FROM outbox AS o)::text
        || (SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY p.consumer, p.event_id), '[]') FROM processed_events AS p)::text";

fn describe(client: &mut postgres::Client) -> Vec<String> {
    client.query(DESCRIBE_EXTENSION, &[]).unwrap().iter().map(|row| row.get(0)).collect()
}

#[test]
fn updating_from_0_1_0_keeps_every_row_and_ends_as_a_fresh_install() {
    let mut db = db();
    for statement in [
        "DROP DATABASE IF EXISTS outbox_upgrade",
        "CREATE DATABASE outbox_upgrade",
        "DROP DATABASE IF EXISTS outbox_fresh",
        "CREATE DATABASE outbox_fresh",
    ] {
        db.execute(statement);
    }
    db.fresh_role("legacy_producer");

    let mut old = db.connect("outbox_upgrade", "postgres");
    old.batch_execute(
        "CREATE EXTENSION outbox_ext VERSION '0.1.0';
         -- 0.1.0's recipe for a producer: table privileges and PUBLIC's EXECUTE.
         GRANT INSERT, SELECT (id) ON outbox TO legacy_producer;
         SELECT outbox_enqueue('order.placed', jsonb_build_object('n', n)) FROM generate_series(1, 50) AS n;
         UPDATE outbox SET sent_at = now(), attempts = 1 WHERE id <= 20;
         UPDATE outbox SET dead_at = now(), attempts = 10, last_error = 'HTTP 500' WHERE id BETWEEN 21 AND 25;
         UPDATE outbox SET attempts = 2, available_at = now() + interval '1 minute', last_error = 'timeout' WHERE id BETWEEN 26 AND 30;
         SELECT outbox_mark_processed(id, 'billing') FROM generate_series(1, 20) AS id;",
    )
    .unwrap();
    let before: String = old.query_one(ALL_ROWS, &[]).unwrap().get(0);
    old.batch_execute("SET ROLE legacy_producer; SELECT outbox_enqueue('legacy', '{}'); RESET ROLE").expect("0.1.0's producer recipe works under 0.1.0");
    old.batch_execute("DELETE FROM outbox WHERE topic = 'legacy'").unwrap();

    old.batch_execute("ALTER EXTENSION outbox_ext UPDATE").unwrap();
    let version: String = old.query_one("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'", &[]).unwrap().get(0);
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let after: String = old.query_one(ALL_ROWS, &[]).unwrap().get(0);
    assert_eq!(after, before, "every row is kept as it was");
    // The update takes PUBLIC's EXECUTE away; CHANGELOG.md tells the DBA to grant it to each
    // producer (grants made by an extension script would not survive a dump and restore).
    let refused = old.batch_execute("SET ROLE legacy_producer; SELECT outbox_enqueue('legacy', '{}')");
    assert_eq!(refused.expect_err("PUBLIC may no longer enqueue").code().map(|c| c.code()), Some("42501"));
    old.batch_execute("RESET ROLE; GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb) TO legacy_producer").unwrap();
    old.batch_execute("SET ROLE legacy_producer; SELECT outbox_enqueue('legacy', '{}'); RESET ROLE")
        .expect("with the CHANGELOG's GRANT, a role that enqueued under 0.1.0 still can");
    let next: i64 = old.query_one("SELECT outbox_enqueue('after.update', '{}')", &[]).unwrap().get(0);
    assert!(next > 51, "ids go on from where 0.1.0 left them ({next})");

    let mut fresh = db.connect("outbox_fresh", "postgres");
    fresh.batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let (updated, installed) = (describe(&mut old), describe(&mut fresh));
    assert!(installed.len() > 5, "the description covers the objects: {installed:#?}");
    assert_eq!(updated, installed, "0.1.0 updated has exactly the objects of a fresh install");
    drop((old, fresh));
    db.execute("DROP DATABASE outbox_upgrade");
    db.execute("DROP DATABASE outbox_fresh");
    db.execute("DROP OWNED BY legacy_producer; DROP ROLE legacy_producer");
}
