//! The SQL install as a managed server has it: `outbox migrate` run by a role with nothing but
//! CREATE on the database, the relay connecting as another role, against a real cluster.

mod support;

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use support::Server::{Library, Managed};
use support::*;

const DESCRIBE: &str = include_str!("../../sql/describe.sql");
const LIBRARY_FUNCTIONS: [&str; 5] =
    ["outbox_enqueue", "outbox_load_settings", "outbox_workers", "outbox_worker_attempts", "outbox_enqueued"];

fn describe(client: &mut postgres::Client, schema: &str, members_only: bool) -> Vec<String> {
    let by_signature: Vec<String> = LIBRARY_FUNCTIONS.map(String::from).to_vec();
    client.query(DESCRIBE, &[&schema, &by_signature, &members_only]).unwrap().iter().map(|row| row.get(0)).collect()
}

#[test]
fn migrate_installs_as_a_role_with_only_create_and_says_which_version() {
    let mut sql = fresh_database("outbox_t_sql");
    let superuser: bool = sql.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_owner'", &[]).unwrap().get(0);
    assert!(!superuser, "the owner is an ordinary role");
    let said = migrate("outbox_t_sql", &[]);
    let version = env!("CARGO_PKG_VERSION");
    assert!(said.contains(&format!("installing version {version} into schema outbox")), "{said}");
    assert!(
        said.contains(&format!(" is at version {version}\n")) && !said.contains("nothing to do"),
        "a migrate that installed says so: {said}"
    );
    let owner: String =
        sql.query_one("SELECT tableowner::text FROM pg_tables WHERE schemaname = 'outbox' AND tablename = 'outbox'", &[]).unwrap().get(0);
    assert_eq!(owner, "outbox_owner");
}

#[test]
fn migrate_installs_what_create_extension_installs() {
    let mut sql = fresh_database("outbox_t_sql_beside_ext");
    migrate("outbox_t_sql_beside_ext", &[]);
    let mut extension = fresh_database("outbox_t_ext");
    extension.batch_execute("CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox").unwrap();
    let (installed, created) = (describe(&mut sql, "outbox", false), describe(&mut extension, "outbox", true));
    assert!(installed.len() > 50, "the install has its objects: {}", installed.len());
    let differences: Vec<_> =
        installed.iter().filter(|line| !created.contains(line)).chain(created.iter().filter(|line| !installed.contains(line))).collect();
    assert!(differences.is_empty(), "the SQL install differs from the extension's:\n{differences:#?}");
}

#[test]
fn enqueue_in_sql_raises_the_errors_of_the_extensions_library() {
    fresh_database("outbox_t_errors_sql");
    migrate("outbox_t_errors_sql", &[]);
    fresh_database("outbox_t_errors_ext").batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let long = "x".repeat(256);
    let cases = [
        "SELECT outbox_enqueue(NULL, '{}')".to_string(),
        "SELECT outbox_enqueue('  ', '{}')".to_string(),
        format!("SELECT outbox_enqueue('{long}', '{{}}')"),
        "SELECT outbox_enqueue('t', NULL)".to_string(),
        format!("SELECT outbox_enqueue('t', '{{}}', '{long}')"),
        "SELECT outbox_enqueue('t', '{}', NULL, 'infinity')".to_string(),
        "SELECT outbox_enqueue('t', '{}', NULL, now() + interval '1000 days')".to_string(),
        "SELECT outbox_enqueue('t', jsonb_build_object('x', repeat('y', 2000)))".to_string(),
        "SELECT outbox_enqueue('t', '{}', NULL, now() + interval '2 hours')".to_string(),
    ];
    // Limits lowered where each install keeps them: the extension's settings, the SQL
    // install's outbox_limits.
    connect("postgres", "postgres")
        .batch_execute(
            "ALTER DATABASE outbox_t_errors_ext SET outbox.max_payload_bytes = 1024;
             ALTER DATABASE outbox_t_errors_ext SET outbox.deliver_at_horizon = '1h'",
        )
        .unwrap();
    connect("outbox_owner", "outbox_t_errors_sql")
        .batch_execute(
            "SELECT outbox.outbox_limit_set('max_payload_bytes', '1kB');
             SELECT outbox.outbox_limit_set('deliver_at_horizon', '1h')",
        )
        .unwrap();
    let error = |database: &str, search_path: &str, statement: &str| {
        let mut client = connect("postgres", database);
        client.batch_execute(&format!("SET search_path = {search_path}")).unwrap();
        let e = client.batch_execute(statement).expect_err(statement);
        let e = e.as_db_error().expect("a database error");
        (e.code().code().to_string(), e.message().to_string())
    };
    let installs = [("outbox_t_errors_ext", "public"), ("outbox_t_errors_sql", "outbox")];
    for mode in ["table", "log"] {
        for (database, schema) in installs {
            connect("postgres", database).batch_execute(&format!("SELECT {schema}.outbox_set_mode('{mode}')")).unwrap();
        }
        for statement in &cases {
            let library = error("outbox_t_errors_ext", "public", statement);
            let sql = error("outbox_t_errors_sql", "outbox", statement);
            assert_eq!(sql, library, "{mode} mode: {statement}");
        }
    }
    for (database, schema) in installs {
        let written: i64 = connect("postgres", database)
            .query_one(&format!("SELECT (SELECT count(*) FROM {schema}.outbox) + (SELECT count(*) FROM {schema}.outbox_log)"), &[])
            .unwrap()
            .get(0);
        assert_eq!(written, 0, "{database}: nothing written in either mode");
    }
}

#[test]
fn migrate_is_versioned_runs_once_at_a_time_and_its_dry_run_changes_nothing() {
    let mut db = fresh_database("outbox_t_versions");
    let printed = migrate("outbox_t_versions", &["--dry-run"]);
    assert!(
        printed.contains("BEGIN;\nSELECT pg_catalog.pg_advisory_xact_lock") && printed.contains("CREATE TABLE outbox.outbox_deliveries"),
        "{printed}"
    );
    let schemas: i64 = db.query_one("SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'", &[]).unwrap().get(0);
    assert_eq!(schemas, 0, "a dry run creates nothing");

    let url = url("outbox_owner", "outbox_t_versions");
    let both: Vec<_> = (0..2)
        .map(|_| {
            let mut migrate = std::process::Command::new(BINARY);
            migrate.args(["migrate", "--database-url", &url]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            migrate.spawn().unwrap()
        })
        .collect();
    for output in both.into_iter().map(|child| child.wait_with_output().unwrap()) {
        assert!(output.status.success(), "{}", text(&output));
    }
    let versions: Vec<String> = db.query("SELECT version FROM outbox.outbox_migrations", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, [env!("CARGO_PKG_VERSION")], "two migrates at once apply the step once");
    assert!(migrate("outbox_t_versions", &[]).contains("nothing to do"));
}

/// Every row of the tables a 0.2.0 user fills, as JSON.
const ROWS: &str = "
    SELECT (SELECT jsonb_agg(to_jsonb(o) ORDER BY o.id) FROM outbox.outbox AS o)::text
        || (SELECT jsonb_agg(to_jsonb(d) - 'claimed_by' ORDER BY d.endpoint, d.event_id) FROM outbox.outbox_deliveries AS d)::text
        || (SELECT jsonb_agg(to_jsonb(e) ORDER BY e.name) FROM outbox.outbox_endpoints AS e)::text
        || (SELECT count(*) FROM outbox.outbox_endpoint_secrets)::text
        || (SELECT jsonb_agg(to_jsonb(p) ORDER BY p.event_id) FROM outbox.processed_events AS p)::text";

#[test]
fn migrate_upgrades_every_released_sql_install_keeping_every_row_to_what_a_fresh_install_is() {
    // Every release that `outbox migrate --to` installs (the SQL install came with 0.3.0, and
    // installs 0.2.0's tables as its first step).
    for released in ["0.2.0", "0.3.0"] {
        upgrade_keeps_every_row(released);
    }
}

fn upgrade_keeps_every_row(released: &str) {
    let mut db = fresh_database("outbox_t_upgrade");
    migrate("outbox_t_upgrade", &["--to", released]);
    let mut owner = connect("outbox_owner", "outbox_t_upgrade");
    owner
        .batch_execute(
            "SET search_path = outbox;
             SELECT outbox_endpoint_set('hooks', 'http://127.0.0.1:9/h', '{order.*}');
             SELECT outbox_endpoint_rotate_secret('hooks');
             SELECT outbox_endpoint_set('jobs', NULL, '{order.*}', kind => 'pull', ordered => true);
             -- 0.2.0 had no SQL install, so no SQL outbox_enqueue: its rows, as the library wrote them
             -- (the same rows for each release).
             INSERT INTO outbox (topic, payload, key) SELECT 'order.placed', jsonb_build_object('n', n), 'k' || (n % 3) FROM generate_series(1, 30) AS n;
             INSERT INTO outbox_deliveries (event_id, endpoint, key, waiting) SELECT id, 'hooks', NULL, false FROM outbox;
             INSERT INTO outbox_deliveries (event_id, endpoint, key, waiting) SELECT id, 'jobs', key, id > 3 FROM outbox;
             UPDATE outbox_deliveries SET sent_at = now(), attempts = 1 WHERE endpoint = 'hooks' AND event_id <= 10;
             UPDATE outbox_deliveries SET dead_at = now(), attempts = 10, last_error = 'HTTP 500' WHERE endpoint = 'hooks' AND event_id = 11;
             SELECT outbox_mark_processed(id, 'billing') FROM generate_series(1, 5) AS id;",
        )
        .unwrap();
    let before: String = db.query_one(ROWS, &[]).unwrap().get(0);
    let said = migrate("outbox_t_upgrade", &[]);
    assert!(said.contains(&format!("upgrading schema outbox from {released} to ")), "{said}");
    assert!(said.contains(&format!(" is at version {}\n", env!("CARGO_PKG_VERSION"))), "{said}");
    let after: String = db.query_one(ROWS, &[]).unwrap().get(0);
    assert_eq!(after, before, "every row is kept");
    let doctor = outbox(&["doctor", "--database-url", &url("outbox_owner", "outbox_t_upgrade")]);
    assert!(doctor.status.success(), "{released} upgraded is what this version installs: {}", text(&doctor));
}

#[test]
fn the_sql_install_and_the_extension_each_refuse_a_database_that_has_the_other() {
    fresh_database("outbox_t_refuse_ext").batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let output = outbox(&["migrate", "--database-url", &url("outbox_owner", "outbox_t_refuse_ext")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output).contains("this database has the outbox_ext extension"), "{}", text(&output));

    let mut db = fresh_database("outbox_t_refuse_sql");
    migrate("outbox_t_refuse_sql", &[]);
    let error = db.batch_execute("CREATE EXTENSION outbox_ext").expect_err("CREATE EXTENSION beside the SQL install");
    let message = error.as_db_error().expect("a database error").message().to_string();
    assert!(message.contains("installed as plain SQL in schema outbox"), "{message}");
}

#[test]
fn doctor_passes_the_extension_as_created() {
    fresh_database("outbox_t_doctor_ext").batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    let output = outbox(&["doctor", "--database-url", &url("postgres", "outbox_t_doctor_ext")]);
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn doctor_passes_the_sql_install_and_names_each_drift() {
    let mut db = fresh_database("outbox_t_doctor");
    migrate("outbox_t_doctor", &[]);
    let url = url("outbox_owner", "outbox_t_doctor");
    assert!(outbox(&["doctor", "--database-url", &url]).status.success());
    db.batch_execute(
        "DROP INDEX outbox.outbox_deliveries_pending;
         GRANT EXECUTE ON FUNCTION outbox.outbox_requeue(bigint, text) TO PUBLIC;",
    )
    .unwrap();
    let output = outbox(&["doctor", "--database-url", &url]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("missing: index CREATE INDEX outbox_deliveries_pending"), "{said}");
    assert!(said.contains("function outbox_requeue") && said.contains("found:    PUBLIC may execute: true"), "{said}");
}

#[test]
fn the_relay_delivers_from_the_sql_install_woken_by_listen_and_refuses_a_newer_schema() {
    let mut db = fresh_database("outbox_t_relay");
    migrate("outbox_t_relay", &[]);
    let receiver = Receiver::start();
    let mut owner = connect("outbox_owner", "outbox_t_relay");
    owner
        .batch_execute(&format!(
            "SELECT outbox.outbox_endpoint_set('default', '{}');
             GRANT USAGE ON SCHEMA outbox TO app;
             GRANT EXECUTE ON FUNCTION outbox.outbox_enqueue(text, jsonb, text, timestamptz) TO app;",
            receiver.url
        ))
        .unwrap();
    let relay_url = url("outbox_relay", "outbox_t_relay");
    // A poll a minute away: only the commit's NOTIFY can bring the event within the deadline.
    let relay = Relay::start(&["--database-url", &relay_url, "--listen-url", &relay_url, "--poll-interval", "60s"]);
    let mut app = connect("app", "outbox_t_relay");
    wait_until("the relay listens", Duration::from_secs(20), || {
        db.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox relay listener' AND datname = 'outbox_t_relay' AND wait_event = 'ClientRead'", &[])
            .unwrap()
            .get::<_, i64>(0)
            == 1
    });
    app.batch_execute("BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 1}'); COMMIT;").unwrap();
    app.batch_execute("BEGIN; SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 2}'); ROLLBACK;").unwrap();
    wait_until("the event is delivered", Duration::from_secs(10), || receiver.count() == 1);
    let (id, body) = receiver.received.lock().unwrap()[0].clone();
    assert_eq!(id, "1");
    assert!(body.contains("\"data\" : {\"n\": 1}"), "{body}");
    wait_until("its delivery is marked sent", Duration::from_secs(10), || {
        db.query_one("SELECT count(*) FROM outbox.outbox_deliveries WHERE sent_at IS NOT NULL", &[]).unwrap().get::<_, i64>(0) == 1
    });
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");

    db.batch_execute("INSERT INTO outbox.outbox_migrations (version) VALUES ('9.9.9')").unwrap();
    let output = std::process::Command::new(BINARY).args(["relay", "--database-url", &relay_url]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output).contains(&format!("is version 9.9.9, newer than this relay ({})", env!("CARGO_PKG_VERSION"))),
        "{}",
        text(&output)
    );
    assert_eq!(receiver.count(), 1, "the rolled-back event was never sent");
}

#[test]
fn migrate_makes_no_endpoint_default_and_a_relay_names_its_own_remedy_for_one_without_a_url() {
    let mut db = fresh_database("outbox_t_default");
    migrate("outbox_t_default", &[]);
    let mut owner = connect("outbox_owner", "outbox_t_default");
    let endpoints: i64 = owner.query_one("SELECT count(*) FROM outbox.outbox_endpoints", &[]).unwrap().get(0);
    assert_eq!(endpoints, 0, "no endpoint default: its URL would be a setting the SQL install has not got");
    owner.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    let (pending, unrouted): (i64, i64) =
        owner.query_one("SELECT pending, unrouted FROM outbox.outbox_stats()", &[]).map(|row| (row.get(0), row.get(1))).unwrap();
    assert_eq!((pending, unrouted), (0, 1), "an event no endpoint takes is kept as unrouted, waiting for no one");

    // Made by hand with no URL, and no --webhook-url: the relay says what fixes it, in its terms.
    owner.batch_execute("SELECT outbox.outbox_endpoint_set('default', NULL)").unwrap();
    let relay = Relay::start(&["--database-url", &url("outbox_relay", "outbox_t_default")]);
    let mut last_error =
        || -> Option<String> { db.query_one("SELECT last_error FROM outbox.outbox_endpoints WHERE name = 'default'", &[]).unwrap().get(0) };
    wait_until("the relay records why default cannot be sent to", Duration::from_secs(20), || last_error().is_some());
    let said = last_error().unwrap();
    assert!(said.contains("set --webhook-url (OUTBOX_WEBHOOK_URL)") && said.contains("outbox_endpoint_drop('default')"), "{said}");
    assert!(!said.contains("outbox.webhook_url"), "no setting the SQL install has not got: {said}");
    let (status, logged) = relay.stop();
    assert_eq!(status, 0, "{logged}");
    assert!(logged.contains("not delivering to endpoint default") && !logged.contains("outbox.webhook_url"), "{logged}");
}

/// Operators and functions a non-superuser plants in `evil`, each an exact match for a lookup
/// that outbox_enqueue would make if it named something without its schema; each records that
/// it ran (as whoever called it: outbox_enqueue's owner, had it been redirected).
const PLANTS: [(&str, &str, &str, &str); 11] = [
    ("FUNCTION", "now()", "timestamptz", "pg_catalog.now()"),
    ("FUNCTION", "octet_length(text)", "integer", "pg_catalog.octet_length($1)"),
    ("FUNCTION", "btrim(text)", "text", "pg_catalog.btrim($1)"),
    ("FUNCTION", "current_setting(text, boolean)", "text", "pg_catalog.current_setting($1, $2)"),
    ("FUNCTION", "pg_notify(text, text)", "void", "pg_catalog.pg_notify($1, $2)"),
    ("OPERATOR", "=(text, text)", "boolean", "$1 OPERATOR(pg_catalog.=) $2"),
    ("OPERATOR", "<>(text, text)", "boolean", "$1 OPERATOR(pg_catalog.<>) $2"),
    ("OPERATOR", ">(integer, integer)", "boolean", "$1 OPERATOR(pg_catalog.>) $2"),
    ("OPERATOR", "=(bigint, integer)", "boolean", "$1 OPERATOR(pg_catalog.=) $2"),
    ("OPERATOR", "&&(text[], text[])", "boolean", "$1 OPERATOR(pg_catalog.&&) $2"),
    ("OPERATOR", "||(text, text)", "text", "$1 OPERATOR(pg_catalog.||) $2"),
];

fn plant(db: &mut postgres::Client) {
    db.batch_execute(
        "DO $$ BEGIN CREATE ROLE mallory LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         CREATE TABLE public.planted_calls (what text); GRANT INSERT ON public.planted_calls TO PUBLIC;
         CREATE SCHEMA evil AUTHORIZATION mallory; SET ROLE mallory;
         -- Visible to every role, outbox_enqueue's owner included.
         GRANT USAGE ON SCHEMA evil TO PUBLIC",
    )
    .unwrap();
    for (index, (kind, signature, returns, body)) in PLANTS.iter().enumerate() {
        let (name, arguments) = signature.split_once('(').unwrap();
        let arguments = arguments.trim_end_matches(')');
        let function = if *kind == "FUNCTION" { name.to_string() } else { format!("planted_{index}") };
        let returned = if *returns == "void" { format!("PERFORM {body}; RETURN") } else { format!("RETURN {body}") };
        db.batch_execute(&format!(
            "CREATE FUNCTION evil.{function}({arguments}) RETURNS {returns} LANGUAGE plpgsql AS $plant$
             BEGIN INSERT INTO public.planted_calls VALUES ('{signature}'); {returned}; END $plant$"
        ))
        .unwrap();
        if *kind == "OPERATOR" {
            let (left, right) = arguments.split_once(", ").unwrap();
            db.batch_execute(&format!("CREATE OPERATOR evil.{name} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = evil.{function})"))
                .unwrap();
        }
    }
    db.batch_execute("RESET ROLE").unwrap();
}

/// What the enqueues wrote, with the times as whether they are an hour ahead.
const WRITTEN: &str = "
    SELECT jsonb_build_array(
        (SELECT jsonb_agg(jsonb_build_array(o.id, o.topic, o.payload, o.key) ORDER BY o.id) FROM outbox AS o),
        (SELECT jsonb_agg(jsonb_build_array(d.event_id, d.endpoint, d.key, d.waiting, d.available_at > now() + interval '30 minutes')
                          ORDER BY d.event_id, d.endpoint) FROM outbox_deliveries AS d),
        (SELECT jsonb_agg(jsonb_build_array(a.endpoint, a.key) ORDER BY a.endpoint, a.key) FROM outbox_key_arrivals AS a),
        (SELECT jsonb_agg(u.event_id ORDER BY u.event_id) FROM outbox_unrouted AS u))::text";

/// Runs every path of outbox_enqueue in `database` as mallory, whose search_path puts the
/// plants first; returns what was written, the notifications a listener got, and the error
/// of an enqueue whose routed endpoint changed after its snapshot was taken.
fn enqueue_every_way(database: &str, schema: &str, raise_limit: &str, lower_limit: &str) -> (String, Vec<String>, String) {
    let mut db = connect("postgres", database);
    plant(&mut db);
    db.batch_execute(&format!(
        "SET search_path = {schema};
         GRANT USAGE ON SCHEMA {schema} TO mallory;
         GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, timestamptz) TO mallory;
         SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name = 'default';
         SELECT outbox_endpoint_set('hooks', 'http://127.0.0.1:9/h', '{{order.*}}');
         SELECT outbox_endpoint_set('jobs', NULL, '{{order.*}}', kind => 'pull', ordered => true, notify => true);"
    ))
    .unwrap();
    let mut listener = connect("postgres", database);
    listener.batch_execute("LISTEN \"outbox.jobs\"; LISTEN outbox_enqueued").unwrap();

    let mut caller = connect("mallory", database);
    caller.batch_execute(&format!("SET search_path = evil, pg_catalog, {schema}")).unwrap();
    caller
        .batch_execute(
            "SELECT outbox_enqueue('order.placed', '{\"n\": 1}');
             SELECT outbox_enqueue('order.placed', '{\"n\": 2}', 'k1');
             SELECT outbox_enqueue('nobody.listens', '{}');
             SELECT outbox_enqueue('order.later', '{}', NULL, pg_catalog.now() OPERATOR(pg_catalog.+) interval '1 hour');",
        )
        .unwrap();
    caller.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    caller.batch_execute("SELECT outbox_enqueue('order.placed', '{\"n\": 3}', 'k1'); COMMIT").unwrap();
    // A limit raised where the install keeps it.
    db.batch_execute(&format!(
        "{raise_limit}; SET search_path = evil, pg_catalog, {schema};
         SELECT outbox_enqueue('order.large', jsonb_build_object('x', repeat('y', 1500000)));
         SET search_path = {schema}; {lower_limit}"
    ))
    .unwrap();
    caller.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ").unwrap();
    caller.batch_execute("SELECT 1").unwrap();
    db.batch_execute("SELECT outbox_endpoint_set('hooks', 'http://127.0.0.1:9/moved', '{order.*}')").unwrap();
    let changed = caller.batch_execute("SELECT outbox_enqueue('order.placed', '{}')").expect_err("the endpoint changed after the snapshot");
    caller.batch_execute("ROLLBACK").unwrap();
    let changed = changed.as_db_error().map(|e| e.code().code().to_string()).unwrap_or_default();

    let mut heard: Vec<String> =
        listener.notifications().timeout_iter(Duration::from_secs(2)).map(|n| Ok(n.channel().to_string())).collect().unwrap();
    heard.sort();
    heard.dedup();

    let planted: Vec<String> = db.query("SELECT what FROM public.planted_calls", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert!(planted.is_empty(), "planted objects ran in {database}: {planted:?}");
    let superuser: bool = db.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'", &[]).unwrap().get(0);
    assert!(!superuser);
    (db.query_one(WRITTEN, &[]).unwrap().get(0), heard, changed)
}

#[test]
fn enqueue_in_sql_writes_what_the_extensions_library_writes_whatever_the_callers_search_path() {
    fresh_database("outbox_t_enqueue_sql");
    migrate("outbox_t_enqueue_sql", &[]);
    fresh_database("outbox_t_enqueue_ext").batch_execute("CREATE EXTENSION outbox_ext").unwrap();
    // A relay that waits for work, as `outbox relay` records itself when its queue is empty.
    connect("postgres", "outbox_t_enqueue_sql")
        .batch_execute("INSERT INTO outbox.outbox_relays (host, pid, version, listening) VALUES ('test', 1, '0.3.0', true)")
        .unwrap();

    let (library, library_heard, library_changed) = enqueue_every_way(
        "outbox_t_enqueue_ext",
        "public",
        // A superuser's session may: the extension's limits are the superuser's to set.
        "SET outbox.max_payload_bytes = '2MB'",
        "RESET outbox.max_payload_bytes",
    );
    let (sql, sql_heard, sql_changed) = enqueue_every_way(
        "outbox_t_enqueue_sql",
        "outbox",
        "SELECT outbox.outbox_limit_set('max_payload_bytes', '2MB')",
        "SELECT outbox.outbox_limit_set('max_payload_bytes', NULL)",
    );
    assert!(library.contains("[2, \"jobs\", \"k1\", true, false]") && library.contains("[\"jobs\", \"k1\"]"), "{library}");
    assert_eq!(sql, library, "the same rows");
    assert_eq!(library_heard, ["outbox.jobs"]);
    assert_eq!(sql_heard, ["outbox.jobs", "outbox_enqueued"], "the pull endpoint's and the waiting relay's notifications");
    assert_eq!((sql_changed.as_str(), library_changed.as_str()), ("40001", "40001"), "a changed endpoint fails the enqueue");
}

/// The SQL block of docs/security.md (the GRANT recipes) that holds `marker`, as written.
fn recipe_sql_with(marker: &str) -> String {
    let page = include_str!("../../docs/security.md");
    let at = page.find(marker).unwrap_or_else(|| panic!("docs/security.md has no {marker:?}"));
    let start = page[..at].rfind("```sql\n").expect("a sql block holds it") + "```sql\n".len();
    let end = at + page[at..].find("```").expect("the block ends");
    page[start..end].to_string()
}

/// Runs `sql` as `role`; the SQLSTATE if it fails.
fn as_role(database: &str, role: &str, sql: &str) -> Result<(), String> {
    as_role_on(Library, database, role, sql)
}

fn as_role_on(server: Server, database: &str, role: &str, sql: &str) -> Result<(), String> {
    connect_on(server, role, database)
        .batch_execute(sql)
        .map_err(|e| e.code().map(|c| c.code().to_string()).unwrap_or_else(|| e.to_string()))
}

#[test]
fn the_grant_recipes_as_written_give_each_role_of_the_sql_install_what_it_needs_and_nothing_more() {
    let mut db = fresh_database("outbox_t_recipes");
    migrate("outbox_t_recipes", &[]);
    for role in ["app_producer", "app_consumer", "ops", "monitor"] {
        db.batch_execute(&format!("DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")).unwrap();
    }
    // The owner of the SQL install grants, as the GRANT recipes ask, on the schema the
    // install recipe names (`outbox`, as `outbox migrate` does by default).
    let mut owner = connect("outbox_owner", "outbox_t_recipes");
    owner
        .batch_execute(
            "GRANT USAGE ON SCHEMA outbox TO app_producer, app_consumer, ops, monitor;
             SELECT outbox.outbox_endpoint_set('mailer', NULL, '{mail.*}', kind => 'pull');",
        )
        .unwrap();
    owner.batch_execute(&recipe_sql_with("-- producer: enqueues in its own transactions")).expect("the GRANT recipes run as written");
    owner.batch_execute(&recipe_sql_with("-- the exporter's role")).expect("the monitoring recipe runs as written");
    let database = "outbox_t_recipes";
    let allowed = |role: &str, sql: &str| as_role(database, role, sql).unwrap_or_else(|e| panic!("{role} may run {sql}: {e}"));
    let refused = |role: &str, sql: &str| assert_eq!(as_role(database, role, sql), Err("42501".to_string()), "{role} may not run {sql}");

    allowed("app_producer", "SELECT outbox.outbox_enqueue('mail.welcome', '{\"to\": \"a@example.com\"}')");
    for sql in
        ["SELECT * FROM outbox.outbox", "SELECT outbox.outbox_requeue(1)", "INSERT INTO outbox.outbox (topic, payload) VALUES ('x', '{}')"]
    {
        refused("app_producer", sql);
    }
    allowed(
        "app_consumer",
        "CREATE TEMP TABLE claimed AS SELECT * FROM outbox.outbox_claim('mailer', 10, '30 seconds');
         SELECT outbox.outbox_ack('mailer', event_id, attempt) FROM claimed;
         SELECT outbox.outbox_mark_processed(event_id, 'mailer') FROM claimed;
         SELECT * FROM outbox.outbox_leases()",
    );
    let sent: i64 = db.query_one("SELECT count(*) FROM outbox.outbox_deliveries WHERE sent_at IS NOT NULL", &[]).unwrap().get(0);
    assert_eq!(sent, 1, "the consumer's claim and ack went through");
    for sql in ["SELECT outbox.outbox_enqueue('t', '{}')", "SELECT * FROM outbox.outbox_deliveries", "SELECT outbox.outbox_requeue(1)"] {
        refused("app_consumer", sql);
    }
    allowed(
        "ops",
        "SELECT * FROM outbox.outbox_stats(); SELECT * FROM outbox.outbox_endpoint_stats(); SELECT outbox.outbox_requeue(1);
         SELECT name, last_error FROM outbox.outbox_endpoints; SELECT count(*) FROM outbox.outbox_deliveries;
         SELECT count(*) FROM outbox.outbox_attempts; SELECT * FROM outbox.outbox_relay_processes()",
    );
    for sql in [
        "SELECT url FROM outbox.outbox_endpoints",
        "SELECT * FROM outbox.outbox_endpoint_secrets",
        "SELECT outbox.outbox_enqueue('t', '{}')",
    ] {
        refused("ops", sql);
    }
    for sql in [
        "SELECT outbox.outbox_stats()",
        "SELECT outbox.outbox_enqueued()",
        "SELECT * FROM outbox.outbox_endpoint_stats()",
        "SELECT * FROM outbox.outbox_workers()",
        "SELECT * FROM outbox.outbox_worker_attempts()",
        "SELECT * FROM outbox.outbox_relay_processes()",
    ] {
        allowed("monitor", sql);
    }
    for sql in ["SELECT * FROM outbox.outbox", "SELECT outbox.outbox_requeue(1)", "SELECT outbox.outbox_enqueue('t', '{}')"] {
        refused("monitor", sql);
    }
}

#[test]
fn the_relay_holds_no_transaction_or_row_lock_while_a_request_is_in_flight() {
    let mut db = fresh_database("outbox_t_no_locks");
    migrate("outbox_t_no_locks", &[]);
    // A receiver that holds each request until the test lets it answer.
    let server = tiny_http::Server::http("127.0.0.1:0").expect("listen on 127.0.0.1");
    let hook = format!("http://{}/hook", server.server_addr().to_ip().expect("an IP address"));
    let (arrived, requests) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            arrived.send(request).ok();
        }
    });
    db.batch_execute(&format!("SELECT outbox.outbox_endpoint_set('default', '{hook}')")).unwrap();
    db.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{}')").unwrap();
    let relay_url = url("outbox_relay", "outbox_t_no_locks");
    let relay = Relay::start(&["--database-url", &relay_url]);
    let request = requests.recv_timeout(Duration::from_secs(20)).expect("the relay sends the event");

    // While the request is in flight the relay's connections come to hold no transaction and
    // no lock on a table (one held across the request would hold until it is answered).
    wait_until("the relay holds no transaction and no lock", Duration::from_secs(5), || {
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM pg_stat_activity AS a
                          WHERE a.datname = 'outbox_t_no_locks' AND a.application_name LIKE 'outbox relay%' AND a.xact_start IS NOT NULL),
                        (SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
                          WHERE a.datname = 'outbox_t_no_locks' AND a.application_name LIKE 'outbox relay%'
                            AND l.relation IS NOT NULL)",
                &[],
            )
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1)) == (0, 0)
    });
    let leased: i64 = db
        .query_one("SELECT count(*) FROM outbox.outbox_deliveries WHERE sent_at IS NULL AND claimed_by < 0 AND available_at > now()", &[])
        .unwrap()
        .get(0);
    assert_eq!(leased, 1, "the delivery is held by its lease, which the claim committed");

    request.respond(tiny_http::Response::empty(204)).unwrap();
    wait_until("the delivery is marked sent", Duration::from_secs(10), || {
        db.query_one("SELECT count(*) FROM outbox.outbox_deliveries WHERE sent_at IS NOT NULL", &[]).unwrap().get::<_, i64>(0) == 1
    });
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}

/// Gives `app`, an ordinary role, the producer's and the consumer's grants on the outbox in
/// `schema`, and the pull endpoint `jobs`.
fn producer_and_consumer(db: &mut postgres::Client, schema: &str) {
    db.batch_execute(&format!(
        "GRANT USAGE ON SCHEMA {schema} TO app;
         GRANT EXECUTE ON FUNCTION {schema}.outbox_enqueue(text, jsonb, text, timestamptz), {schema}.outbox_claim(text, integer, interval),
               {schema}.outbox_nack(text, bigint, integer, text, interval) TO app;
         -- The extension's endpoint default would take a delivery of every event too.
         SELECT {schema}.outbox_endpoint_drop(e.name) FROM {schema}.outbox_endpoints AS e WHERE e.name = 'default';
         SELECT {schema}.outbox_endpoint_set('jobs', NULL, '{{*}}', kind => 'pull');
         SELECT {schema}.outbox_endpoint_grant('jobs', 'app');"
    ))
    .unwrap();
}

/// The SQLSTATE `sql` fails with, run as `role` after `session` (its own SETs).
fn refusal(server: Server, database: &str, role: &str, session: &str, sql: &str) -> String {
    let mut client = connect_on(server, role, database);
    client.batch_execute(session).unwrap_or_else(|e| panic!("{role}: {session}: {e}"));
    let error = client.batch_execute(sql).expect_err(sql);
    error.code().map(|c| c.code().to_string()).unwrap_or_else(|| error.to_string())
}

const TWO_MB: &str = "SELECT outbox.outbox_enqueue('t', jsonb_build_object('x', repeat('y', 2000000)))";
const FIFTY_YEARS: &str = "SELECT outbox.outbox_enqueue('t', '{}', NULL, now() + interval '50 years')";

/// Claims the delivery of `event` as `app` and nacks it, until the nack makes it dead; how
/// many attempts that took (`None` if it is not dead after `most`).
fn nack_until_dead(server: Server, database: &str, session: &str, event: i64, most: i32) -> Option<i32> {
    let mut app = connect_on(server, "app", database);
    app.batch_execute(session).unwrap();
    for _ in 0..most {
        let claimed = app.query("SELECT attempt FROM outbox.outbox_claim('jobs', 1, '30 seconds')", &[]).unwrap();
        let Some(claim) = claimed.first() else { break };
        let attempt: i32 = claim.get(0);
        app.execute("SELECT outbox.outbox_nack('jobs', $1, $2, 'failed', interval '0')", &[&event, &attempt]).unwrap();
    }
    let mut admin = connect_on(server, "postgres", database);
    let row = admin.query_one("SELECT attempts, dead_at IS NOT NULL FROM outbox.outbox_deliveries WHERE event_id = $1", &[&event]).unwrap();
    row.get::<_, bool>(1).then(|| row.get(0))
}

#[test]
fn no_session_lifts_a_limit_of_the_sql_install_which_only_its_owner_sets() {
    let database = "outbox_t_limits";
    let mut db = fresh_database_on(Managed, database);
    migrate_on(Managed, database, &[]);
    let mut owner = connect_on(Managed, "outbox_owner", database);
    producer_and_consumer(&mut owner, "outbox");
    // Placeholders set every way a role or a database's owner can: none is a limit.
    db.batch_execute(&format!(
        "ALTER ROLE app IN DATABASE {database} SET outbox.max_payload_bytes = '10MB';
         ALTER DATABASE {database} SET outbox.deliver_at_horizon = '100 years';
         ALTER DATABASE {database} SET outbox.max_attempts = 1000"
    ))
    .unwrap();
    let lifted = "SET outbox.max_payload_bytes = '10MB'; SET outbox.deliver_at_horizon = '100 years'; SET outbox.max_attempts = 1000";
    assert_eq!(refusal(Managed, database, "app", lifted, TWO_MB), "22023", "a 2 MB payload, over the default 1MB");
    assert_eq!(refusal(Managed, database, "app", lifted, FIFTY_YEARS), "22023", "a deliver_at 50 years ahead, over the default 90 days");
    assert_eq!(refusal(Managed, database, "outbox_owner", lifted, TWO_MB), "22023", "the owner's session lifts nothing either");
    let written: i64 = db.query_one("SELECT count(*) FROM outbox.outbox", &[]).unwrap().get(0);
    assert_eq!(written, 0, "nothing written");

    // max_attempts: the default cap, then the owner's, whatever the session says.
    let enqueue = |db: &mut postgres::Client| -> i64 { db.query_one("SELECT outbox.outbox_enqueue('t', '{}')", &[]).unwrap().get(0) };
    let event = enqueue(&mut db);
    assert_eq!(nack_until_dead(Managed, database, lifted, event, 20), Some(10), "dead at the default cap of 10");
    owner.batch_execute("SELECT outbox.outbox_limit_set('max_attempts', '3')").unwrap();
    let event = enqueue(&mut db);
    assert_eq!(nack_until_dead(Managed, database, lifted, event, 20), Some(3), "dead at the owner's cap of 3");

    // Only the owner writes the limits.
    for sql in [
        "SELECT outbox.outbox_limit_set('max_payload_bytes', '10MB')",
        "SELECT * FROM outbox.outbox_limits",
        "INSERT INTO outbox.outbox_limits (max_payload_bytes) VALUES (10485760)",
        "UPDATE outbox.outbox_limits SET max_attempts = 1000",
    ] {
        assert_eq!(as_role_on(Managed, database, "app", sql), Err("42501".to_string()), "app may not run {sql}");
    }
    // The owner's limits take effect, raised or lowered.
    owner
        .batch_execute(
            "SELECT outbox.outbox_limit_set('max_payload_bytes', '3MB');
             SELECT outbox.outbox_limit_set('deliver_at_horizon', '60 years')",
        )
        .unwrap();
    as_role_on(Managed, database, "app", TWO_MB).expect("a 2 MB payload within the owner's 3MB");
    as_role_on(Managed, database, "app", FIFTY_YEARS).expect("50 years ahead within the owner's 60 years");
    owner.batch_execute("SELECT outbox.outbox_limit_set('max_payload_bytes', '1kB')").unwrap();
    let small = "SELECT outbox.outbox_enqueue('t', jsonb_build_object('x', repeat('y', 2000)))";
    assert_eq!(refusal(Managed, database, "app", lifted, small), "22023", "2,000 bytes over the owner's 1kB");
    let limits: String = db.query_one("SELECT to_jsonb(l)::text FROM outbox.outbox_limits AS l", &[]).unwrap().get(0);
    assert_eq!(limits, r#"{"one": true, "max_attempts": 3, "max_payload_bytes": 1024, "deliver_at_horizon": "60 years"}"#);
    owner.batch_execute("SELECT outbox.outbox_limit_set('max_payload_bytes', NULL)").unwrap();
    as_role_on(Managed, database, "app", small).expect("null: back to the default 1MB");

    // Bad values are class 22 and change nothing.
    for (name, value) in [
        ("max_payload_bytes", "lots"),
        ("max_payload_bytes", "0"),
        ("max_payload_bytes", "4GB"),
        ("deliver_at_horizon", "soon"),
        ("deliver_at_horizon", "-1 day"),
        ("deliver_at_horizon", "100 years"),
        ("max_attempts", "0"),
        ("max_attempts", "1001"),
        ("max_attempts", "ten"),
        ("retention", "1d"),
    ] {
        let sql = format!("SELECT outbox.outbox_limit_set('{name}', '{value}')");
        let code = as_role_on(Managed, database, "outbox_owner", &sql).expect_err(&sql);
        assert!(code.starts_with("22"), "{sql}: {code}");
    }
    let unchanged: String = db.query_one("SELECT to_jsonb(l)::text FROM outbox.outbox_limits AS l", &[]).unwrap().get(0);
    assert_eq!(unchanged, r#"{"one": true, "max_attempts": 3, "max_payload_bytes": null, "deliver_at_horizon": "60 years"}"#);
}

#[test]
fn the_relay_caps_attempts_at_the_owners_limit_as_outbox_nack_does() {
    let database = "outbox_t_relay_cap";
    fresh_database_on(Managed, database);
    migrate_on(Managed, database, &[]);
    let mut owner = connect_on(Managed, "outbox_owner", database);
    // Nothing listens on port 9: every attempt fails.
    owner
        .batch_execute(
            "SELECT outbox.outbox_endpoint_set('default', 'http://127.0.0.1:9/hook');
             SELECT outbox.outbox_limit_set('max_attempts', '2');
             SELECT outbox.outbox_enqueue('order.placed', '{}')",
        )
        .unwrap();
    let mut relay = Relay::start(&["--database-url", &url_on(Managed, "outbox_relay", database)]);
    let dead = || {
        connect_on(Managed, "postgres", database)
            .query_one("SELECT attempts FROM outbox.outbox_deliveries WHERE dead_at IS NOT NULL", &[])
            .ok()
            .map(|row| row.get::<_, i32>(0))
    };
    relay.wait_until("the delivery is dead", Duration::from_secs(30), || dead().is_some());
    assert_eq!(dead(), Some(2), "dead after the owner's 2 attempts");
    let (status, said) = relay.stop();
    assert_eq!(status, 0, "{said}");
}

#[test]
fn on_the_extension_install_no_session_sets_a_limit() {
    let database = "outbox_t_limits_ext";
    let mut db = fresh_database(database);
    db.batch_execute("CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox").unwrap();
    producer_and_consumer(&mut db, "outbox");
    // The library's settings: outbox.max_payload_bytes and outbox.deliver_at_horizon are a
    // superuser's (42501 for anyone else), outbox.max_attempts the server configuration's
    // (55P02, for every session).
    let for_itself = format!("ALTER ROLE app IN DATABASE {database} SET outbox.max_payload_bytes = '10MB'");
    for (set, code) in [
        ("SET outbox.max_payload_bytes = '10MB'", "42501"),
        ("SET outbox.deliver_at_horizon = '18250d'", "42501"),
        ("SET outbox.max_attempts = 1000", "55P02"),
        (for_itself.as_str(), "42501"),
    ] {
        assert_eq!(refusal(Library, database, "app", "SELECT 1", set), code, "{set}");
    }
    assert_eq!(as_role(database, "postgres", "SET outbox.max_attempts = 1000"), Err("55P02".to_string()), "not even a superuser's session");
    assert_eq!(refusal(Library, database, "app", "SELECT 1", TWO_MB), "22023");
    assert_eq!(refusal(Library, database, "app", "SELECT 1", FIFTY_YEARS), "22023");
    let event: i64 = db.query_one("SELECT outbox.outbox_enqueue('t', '{}')", &[]).unwrap().get(0);
    assert_eq!(nack_until_dead(Library, database, "SELECT 1", event, 20), Some(10), "dead at outbox.max_attempts, 10");
    // Its limits are the server's settings: outbox_limit_set says so.
    assert_eq!(as_role(database, "postgres", "SELECT outbox.outbox_limit_set('max_attempts', '1000')"), Err("55000".to_string()));
    assert_eq!(as_role(database, "app", "SELECT outbox.outbox_limit_set('max_attempts', '1000')"), Err("42501".to_string()));
}

#[test]
fn on_the_extension_install_without_its_library_preloaded_no_session_sets_a_limit_and_the_relay_reads_the_servers_settings() {
    // The managed cluster loads no outbox library at start: a session has placeholders for the
    // outbox.* names until something loads it.
    let database = "outbox_t_limits_unloaded";
    let mut db = fresh_database_on(Managed, database);
    db.batch_execute(&format!(
        "CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox;
         ALTER DATABASE {database} SET outbox.relay = off"
    ))
    .unwrap();
    producer_and_consumer(&mut db, "outbox");
    let event: i64 = db.query_one("SELECT outbox.outbox_enqueue('t', '{}')", &[]).unwrap().get(0);
    assert_eq!(
        nack_until_dead(Managed, database, "SET outbox.max_attempts = 1000", event, 20),
        Some(10),
        "dead at outbox.max_attempts, 10, not at the session's placeholder"
    );
    // A new session, which has not loaded the library either, as `outbox relay` starts.
    let server = connect_on(Managed, "postgres", database).query("SELECT serves FROM outbox.outbox_relay_server_settings()", &[]).unwrap();
    assert_eq!(server.iter().map(|row| row.get::<_, bool>(0)).collect::<Vec<_>>(), vec![false], "outbox.relay is off here");
}
