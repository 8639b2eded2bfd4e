//! What a hostile or merely unprivileged role can do: nothing it creates runs inside the
//! workers or the extension's functions, and the GRANT recipes of docs/security.md give each
//! role exactly what it needs.

use std::time::Duration;

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

/// A fresh non-superuser `mallory`, and the table where planted objects record that they ran.
pub(super) fn mallory_and_planted_calls(db: &mut Db) {
    db.fresh_role("mallory");
    db.execute(
        "DROP TABLE IF EXISTS public.planted_calls;
         CREATE TABLE public.planted_calls (what text);
         GRANT INSERT ON public.planted_calls TO PUBLIC",
    );
}

/// No planted object recorded a call, and mallory is no superuser.
pub(super) fn assert_nothing_planted_ran(db: &mut Db) {
    let ran: Vec<String> = db.column("SELECT what FROM public.planted_calls");
    assert!(ran.is_empty(), "planted objects ran: {ran:?}");
    assert!(!db.value::<bool>("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"), "mallory became a superuser");
}

/// Plants, as the non-superuser `mallory`, objects that would win operator and function
/// resolution for the workers' statements if they looked beyond pg_catalog: a
/// `*(bigint, interval)` operator (0.1.0's claim multiplied a bigint by an interval) and a
/// `json_build_object` overload of the claim's exact argument types. Each records that it ran
/// and tries to make mallory a superuser.
pub(super) fn plant(db: &mut Db, schema: &str) {
    db.execute(&format!("GRANT USAGE, CREATE ON SCHEMA {schema} TO mallory"));
    db.execute("SET ROLE mallory");
    db.execute(&format!(
        "CREATE FUNCTION {schema}.planted_times(bigint, interval) RETURNS interval LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO public.planted_calls VALUES ('* in {schema}');
           EXECUTE 'ALTER ROLE mallory SUPERUSER';
           RETURN $1::float8 * $2;
         END $$;
         CREATE OPERATOR {schema}.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = {schema}.planted_times);
         CREATE FUNCTION {schema}.json_build_object(text, text, text, timestamptz, text, jsonb) RETURNS json
         LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO public.planted_calls VALUES ('json_build_object in {schema}');
           EXECUTE 'ALTER ROLE mallory SUPERUSER';
           RETURN pg_catalog.json_build_object($1, $2, $3, $4, $5, $6);
         END $$;"
    ));
    db.execute("RESET ROLE");
}

/// Claims, acknowledgements, failures, retention and every SQL function, run against planted
/// objects; asserts that none of them ran.
fn drive_everything_and_check_nothing_planted_ran(db: &mut Db, receiver: &Receiver) {
    db.configure(&[("outbox.webhook_url", &receiver.url), ("outbox.retention", "1h")]);
    db.insert_deliveries("old", 5, "sent_at", "now() - interval '2 hours'");

    let delivered = db.enqueue("delivered", "{}");
    wait_until("an event is delivered and acknowledged", Duration::from_secs(20), || db.is_sent(delivered));
    receiver.set_reply(Reply::Status(500));
    let failed = db.enqueue("failed", "{}");
    wait_until("a failed attempt is recorded", Duration::from_secs(20), || {
        db.count(&format!("id = {failed} AND last_error = 'HTTP 500'")) == 1
    });
    wait_until("retention deletes old sent events", Duration::from_secs(20), || db.count_events("topic = 'old'") == 0);
    receiver.set_reply(Reply::Status(204));
    db.execute(&format!(
        "SELECT outbox_requeue({failed}); SELECT * FROM outbox_stats(); SELECT outbox_mark_processed({delivered}, 'planted');
         SELECT * FROM outbox_workers()"
    ));
    wait_until("the requeued event is delivered", Duration::from_secs(20), || db.is_sent(failed));
    assert_nothing_planted_ran(db);
}

#[test]
fn nothing_a_non_superuser_plants_runs_in_the_workers_or_the_functions() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    mallory_and_planted_calls(&mut db);

    // The extension in public, as most install it; on PostgreSQL 15 the database owner may
    // create there.
    plant(&mut db, "public");
    drive_everything_and_check_nothing_planted_ran(&mut db, &receiver);

    // The extension in a schema of its own, where mallory may create too, with the planted
    // objects of public still there. The running workers pick the re-created extension up by
    // themselves, preparing their statements again with the planted objects around (dropped
    // and created in one transaction, they never find it missing, and stay).
    let pids = db.worker_pids();
    db.execute(
        "DROP EXTENSION outbox_ext; DROP SCHEMA IF EXISTS outbox_own CASCADE; CREATE SCHEMA outbox_own;
         CREATE EXTENSION outbox_ext SCHEMA outbox_own",
    );
    db.execute("SET search_path = outbox_own, public");
    plant(&mut db, "outbox_own");
    drive_everything_and_check_nothing_planted_ran(&mut db, &receiver);
    assert_eq!(db.worker_pids(), pids, "the same workers served the re-created extension");

    db.execute("DROP EXTENSION outbox_ext; DROP SCHEMA outbox_own CASCADE; RESET search_path; CREATE EXTENSION outbox_ext SCHEMA public");
    db.execute("DROP TABLE public.planted_calls; DROP OWNED BY mallory");
}

/// The extension's functions with PUBLIC among the grantees of EXECUTE (a null ACL means the
/// default, which includes PUBLIC).
const FUNCTIONS_PUBLIC_MAY_RUN: &str = "
    SELECT p.oid::regprocedure::text
      FROM pg_proc AS p
      JOIN pg_depend AS d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
      JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'outbox_ext'
     WHERE p.pronamespace <> 'tests'::regnamespace
       AND (p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) AS a WHERE a.grantee = 0))
     ORDER BY 1";

#[test]
fn create_extension_grants_nothing_to_public() {
    let mut db = db();
    let open: Vec<String> = db.column(FUNCTIONS_PUBLIC_MAY_RUN);
    assert!(open.is_empty(), "PUBLIC may execute {open:?}");
    let tables: Vec<String> = db.column(
        "SELECT c.relname::text FROM pg_class AS c
          WHERE c.relnamespace = 'public'::regnamespace AND c.relname IN ('outbox', 'outbox_id_seq', 'processed_events', 'outbox_endpoints', 'outbox_endpoint_secrets', 'outbox_deliveries', 'outbox_unrouted', 'outbox_delivery_counts')
            AND EXISTS (SELECT FROM aclexplode(c.relacl) AS a WHERE a.grantee = 0)",
    );
    assert!(tables.is_empty(), "PUBLIC has privileges on {tables:?}");
    db.fresh_role("nobody_special");
    for call in ["SELECT outbox_enqueue('t', '{}')", "SELECT * FROM outbox_stats()", "SELECT * FROM outbox_workers()"] {
        let error = db.as_role("nobody_special", call).expect_err("a role with no grants is refused");
        assert_eq!(error.code().map(|c| c.code()), Some("42501"), "{call}: {error}");
    }
}

/// Expects `sql`, run as `role`, to be refused for lack of privilege.
fn refused(db: &mut Db, role: &str, sql: &str) {
    let error = db.as_role(role, sql).expect_err(&format!("{role} must not be able to run {sql}"));
    assert_eq!(error.code().map(|c| c.code()), Some("42501"), "{role}: {sql}: {error}");
}

#[test]
fn the_producer_recipe_enqueues_and_can_neither_read_change_nor_forge_rows() {
    let mut db = db();
    db.fresh_role("producer");
    db.execute("GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, timestamptz) TO producer"); // the producer recipe

    let id: i64 = db.as_role("producer", "SELECT outbox_enqueue('order.placed', '{\"order_id\": 1}')").unwrap()[0].get(0);
    assert_eq!(db.count(&format!("id = {id} AND topic = 'order.placed'")), 1);
    let error = db.as_role("producer", "SELECT outbox_enqueue('', '{}')").expect_err("checks still apply");
    assert_eq!(error.code().map(|c| c.code()), Some("22023"));
    for sql in [
        "SELECT * FROM outbox",
        "SELECT id FROM outbox",
        "INSERT INTO outbox (topic, payload) VALUES ('forged', '{}')",
        "INSERT INTO outbox_deliveries (event_id, endpoint, sent_at) VALUES (1, 'default', now())",
        "INSERT INTO outbox (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (1000000, 'forged', '{}')",
        "UPDATE outbox SET topic = 'forged'",
        "DELETE FROM outbox",
        "SELECT * FROM outbox_deliveries",
        "UPDATE outbox_deliveries SET sent_at = now()",
        "SELECT * FROM outbox_endpoint_secrets",
        "SELECT outbox_endpoint_set('evil', 'http://127.0.0.1:9/')",
        "SELECT outbox_endpoint_rotate_secret('default')",
        "SELECT nextval('outbox_id_seq')",
        "SELECT * FROM processed_events",
        "SELECT outbox_mark_processed(1)",
        "SELECT outbox_requeue(1)",
        "SELECT * FROM outbox_stats()",
    ] {
        refused(&mut db, "producer", sql);
    }
}

#[test]
fn the_consumer_recipe_claims_acks_and_records_processed_events_and_nothing_else() {
    let mut db = db();
    db.fresh_role("consumer");
    db.execute(
        "GRANT EXECUTE ON FUNCTION outbox_claim(text, integer, interval), outbox_ack(text, bigint, integer), outbox_ack_batch(text, bigint[], integer[]),
               outbox_nack(text, bigint, integer, text, interval), outbox_extend(text, bigint, integer, interval),
               outbox_mark_processed(bigint, text) TO consumer",
    );
    db.execute("SELECT outbox_endpoint_set('jobs', NULL, kind => 'pull'); SELECT outbox_endpoint_grant('jobs', 'consumer')");
    let id = db.enqueue("job", "{}");

    let claimed = db.as_role("consumer", "SELECT event_id, attempt FROM outbox_claim('jobs')").unwrap();
    assert_eq!((claimed[0].get::<_, i64>(0), claimed[0].get::<_, i32>(1)), (id, 1));
    let extended: bool = db.as_role("consumer", &format!("SELECT outbox_extend('jobs', {id}, 1, '1 minute')")).unwrap()[0].get(0);
    let first: bool = db.as_role("consumer", &format!("SELECT outbox_mark_processed({id}, 'billing')")).unwrap()[0].get(0);
    let again: bool = db.as_role("consumer", &format!("SELECT outbox_mark_processed({id}, 'billing')")).unwrap()[0].get(0);
    assert!(extended && first && !again, "true the first time, false for the duplicate");
    let acked: bool = db.as_role("consumer", &format!("SELECT outbox_ack('jobs', {id}, 1)")).unwrap()[0].get(0);
    assert!(acked);
    for sql in [
        "SELECT * FROM processed_events",
        "DELETE FROM processed_events",
        "SELECT outbox_enqueue('t', '{}')",
        "SELECT * FROM outbox",
        "UPDATE outbox_deliveries SET sent_at = now()",
        "SELECT * FROM outbox_stats()",
        "SELECT outbox_requeue(1)",
        "SELECT outbox_pull_endpoint('jobs', 'x')",
        "SELECT outbox_sequence('jobs')",
        "SELECT outbox_skip('jobs', 1)",
        "SELECT * FROM outbox_keys",
    ] {
        refused(&mut db, "consumer", sql);
    }
}

#[test]
fn the_operator_recipe_watches_and_requeues_and_cannot_forge() {
    let mut db = db();
    db.fresh_role("operator");
    db.execute(
        "GRANT EXECUTE ON FUNCTION outbox_stats(), outbox_endpoint_stats(), outbox_workers(), outbox_requeue(bigint, text),
               outbox_replay(text, timestamptz, timestamptz), outbox_endpoint_set(text, text, text[], text, jsonb, interval, integer, integer, boolean, boolean),
               outbox_endpoint_rotate_secret(text, text, interval), outbox_endpoint_disable(text, text), outbox_endpoint_enable(text),
               outbox_endpoint_drop(text), outbox_skip(text, bigint), outbox_endpoint_grant(text, regrole),
               outbox_endpoint_revoke(text, regrole), outbox_dead(text, text, text, timestamptz, timestamptz, integer),
               outbox_requeue_dead(text, text, text, timestamptz, timestamptz, boolean),
               outbox_skip_dead(text, text, text, timestamptz, timestamptz, boolean) TO operator;
         GRANT SELECT ON outbox, outbox_deliveries TO operator;
         GRANT SELECT (name, kind, topics, timeout, max_attempts, max_in_flight, ordered, notify, failing_since,
                       last_success_at, last_error, disabled_at, disabled_reason) ON outbox_endpoints TO operator",
    );
    let id = db.enqueue("stuck", "{}");
    db.execute(&format!("UPDATE outbox_deliveries SET dead_at = now(), attempts = 10 WHERE event_id = {id}"));

    let dead: i64 = db.as_role("operator", "SELECT dead FROM outbox_stats()").unwrap()[0].get(0);
    assert_eq!(dead, 1);
    assert_eq!(db.as_role("operator", "SELECT * FROM outbox_workers()").unwrap().len(), 2);
    let error: Option<String> =
        db.as_role("operator", &format!("SELECT last_error FROM outbox_deliveries WHERE event_id = {id}")).unwrap()[0].get(0);
    assert_eq!(error, None);
    let skipped: bool = db.as_role("operator", &format!("SELECT outbox_skip('default', {id})")).unwrap()[0].get(0);
    assert!(!skipped, "a dead delivery of an unordered endpoint blocks no key");
    let listed: i64 = db.as_role("operator", "SELECT event_id FROM outbox_dead()").unwrap()[0].get(0);
    assert_eq!(listed, id, "an operator lists the dead deliveries");
    let would: i64 = db.as_role("operator", "SELECT outbox_requeue_dead(topic => 'stuck')").unwrap()[0].get(0);
    assert_eq!(would, 1, "and counts what a bulk requeue would do");
    let requeued: i32 = db.as_role("operator", &format!("SELECT outbox_requeue({id})")).unwrap()[0].get(0);
    assert_eq!(requeued, 1);
    let secret: String = db.as_role("operator", "SELECT outbox_endpoint_rotate_secret('default')").unwrap()[0].get(0);
    assert!(secret.starts_with("whsec_"), "an operator rotates secrets and hands the new one over");
    db.as_role("operator", "SELECT outbox_endpoint_set('audit', 'http://127.0.0.1:9/audit')").expect("an operator adds endpoints");
    db.as_role("operator", "SELECT outbox_endpoint_drop('audit')").expect("and drops them");
    for call in [
        "SELECT outbox_endpoint_set('queue', NULL, kind => 'pull')",
        "SELECT outbox_endpoint_grant('queue', 'operator')",
        "SELECT outbox_endpoint_revoke('queue', 'operator')",
        "SELECT outbox_endpoint_drop('queue')",
    ] {
        db.as_role("operator", call)
            .unwrap_or_else(|e| panic!("an operator gives pull endpoints to roles and takes them back: {call}: {e:?}"));
    }
    assert_eq!(db.count(&format!("id = {id} AND dead_at IS NULL AND attempts = 0")), 1);
    for sql in [
        "SELECT outbox_enqueue('t', '{}')",
        "UPDATE outbox_deliveries SET sent_at = now()",
        "INSERT INTO outbox (topic, payload) VALUES ('forged', '{}')",
        "SELECT * FROM outbox_endpoint_secrets",
        "SELECT url FROM outbox_endpoints",
        "SELECT headers FROM outbox_endpoints",
        "SELECT outbox_mark_processed(1)",
    ] {
        refused(&mut db, "operator", sql);
    }
}

#[test]
fn the_monitoring_recipe_reads_the_numbers_and_nothing_else() {
    let mut db = db();
    db.fresh_role("monitor");
    db.execute(
        "GRANT EXECUTE ON FUNCTION outbox_stats(), outbox_endpoint_stats(), outbox_workers(), outbox_worker_attempts(),
               outbox_enqueued() TO monitor",
    );
    db.enqueue("seen", "{}");
    // What monitoring/queries.yaml asks.
    for sql in [
        "SELECT outbox_enqueued(), s.sent, s.unrouted, (SELECT count(*) FROM outbox_workers()) FROM outbox_stats() AS s",
        "SELECT endpoint, pending, waiting, dead, blocked_keys, oldest_pending_age, failing_since, disabled_at FROM outbox_endpoint_stats()",
        "SELECT worker, outcome, attempts FROM outbox_worker_attempts()",
    ] {
        db.as_role("monitor", sql).unwrap_or_else(|e| panic!("the monitoring role runs {sql}: {e}"));
    }
    let outcomes: i64 = db.as_role("monitor", "SELECT count(*) FROM outbox_worker_attempts() WHERE worker = 1").unwrap()[0].get(0);
    assert_eq!(outcomes, 6, "every outcome class of a running worker is listed, zeros included");
    for sql in ["SELECT * FROM outbox", "SELECT outbox_requeue(1)", "SELECT outbox_enqueue('t', '{}')", "SELECT * FROM outbox_deliveries"] {
        refused(&mut db, "monitor", sql);
    }
}

#[test]
fn a_callers_search_path_cannot_redirect_outbox_enqueue() {
    let mut db = db();
    db.fresh_role("mallory");
    db.execute(
        "DROP TABLE IF EXISTS public.planted_calls; CREATE TABLE public.planted_calls (what text);
         GRANT INSERT ON public.planted_calls TO PUBLIC;
         GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, timestamptz) TO mallory;
         DROP SCHEMA IF EXISTS evil CASCADE; CREATE SCHEMA evil AUTHORIZATION mallory",
    );
    // An exact match for the lookups outbox_enqueue makes when it first runs in a session, found
    // before pg_catalog's because the caller puts its schema first. It would run as the owner.
    db.execute(
        "SET ROLE mallory;
         CREATE FUNCTION evil.name_eq(name, name) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO public.planted_calls VALUES ('= in evil');
           EXECUTE 'ALTER ROLE mallory SUPERUSER';
           RETURN $1::text = $2::text;
         END $$;
         CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = name, FUNCTION = evil.name_eq);
         RESET ROLE",
    );
    // A new session, so that outbox_enqueue plans its statements under the caller's path.
    let (mut caller, _) = pgrx_tests::client().expect("a new session");
    caller.batch_execute("SET ROLE mallory; SET search_path = evil, pg_catalog, public").unwrap();
    let id: i64 = caller.query_one("SELECT public.outbox_enqueue('t', '{}'::jsonb)", &[]).unwrap().get(0);
    drop(caller);

    assert_eq!(db.count(&format!("id = {id}")), 1, "the event was enqueued");
    let ran: Vec<String> = db.column("SELECT what FROM public.planted_calls");
    assert!(ran.is_empty(), "planted objects ran: {ran:?}");
    assert!(!db.value::<bool>("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"), "mallory became a superuser");
    db.execute("DROP SCHEMA evil CASCADE; DROP TABLE public.planted_calls; DROP OWNED BY mallory");
}

#[test]
fn a_drop_database_that_postgresql_would_refuse_does_not_make_the_workers_leave() {
    let mut db = db();
    db.fresh_role("mallory");
    let pids = db.worker_pids();

    // Not the owner: PostgreSQL refuses, and the workers must not have left for it.
    let refused = db.connect("postgres", "mallory").batch_execute("DROP DATABASE pgrx_tests").expect_err("only the owner may drop it");
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"), "{refused}");
    let refused = db.connect("postgres", "mallory").batch_execute("ALTER DATABASE pgrx_tests RENAME TO taken").expect_err("nor rename it");
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"), "{refused}");
    // The owner, but inside a transaction block, where DROP DATABASE cannot run.
    let mut superuser = db.connect("postgres", "postgres");
    let refused = superuser.batch_execute("BEGIN; DROP DATABASE pgrx_tests").expect_err("not in a transaction block");
    assert_eq!(refused.code().map(|c| c.code()), Some("25001"), "{refused}");
    superuser.batch_execute("ROLLBACK").unwrap();

    assert_eq!(db.worker_pids(), pids, "no worker left its database");
    let receiver = super::receiver::Receiver::start(super::receiver::Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    let id = db.enqueue("still.served", "{}");
    wait_until("the workers still deliver", Duration::from_secs(10), || db.is_sent(id));
    assert_eq!(db.worker_pids(), pids, "no worker left its database");
}

#[test]
fn a_pull_endpoint_is_consumed_only_by_the_roles_granted_it() {
    let mut db = db();
    for role in ["tenant_a", "tenant_b", "tenant_b_worker"] {
        db.fresh_role(role);
        db.execute(&format!(
            "GRANT EXECUTE ON FUNCTION outbox_claim(text, integer, interval), outbox_ack(text, bigint, integer),
                   outbox_ack_batch(text, bigint[], integer[]), outbox_nack(text, bigint, integer, text, interval),
                   outbox_extend(text, bigint, integer, interval) TO {role}"
        ));
    }
    db.execute(
        "GRANT tenant_b TO tenant_b_worker;
         SELECT outbox_endpoint_set('a-jobs', NULL, '{a.*}', kind => 'pull');
         SELECT outbox_endpoint_set('b-jobs', NULL, '{b.*}', kind => 'pull');
         SELECT outbox_endpoint_grant('a-jobs', 'tenant_a');
         SELECT outbox_endpoint_grant('b-jobs', 'tenant_b')",
    );
    let (a, b) = (db.enqueue("a.job", "{}"), db.enqueue("b.job", "{}"));
    let claimed = db.as_role("tenant_a", "SELECT event_id, attempt FROM outbox_claim('a-jobs')").unwrap();
    assert_eq!((claimed[0].get::<_, i64>(0), claimed[0].get::<_, i32>(1)), (a, 1), "a granted role claims");
    let state = |db: &mut Db| -> Vec<String> {
        db.column(
            "SELECT concat_ws(' ', endpoint, event_id, attempts, fence, available_at, sent_at, dead_at, last_error)
                     FROM outbox_deliveries WHERE endpoint IN ('a-jobs', 'b-jobs') ORDER BY endpoint",
        )
    };
    let before = state(&mut db);
    // tenant_b knows (or guesses) a's event id and attempt: every call is refused, and nothing changes.
    for call in [
        "SELECT * FROM outbox_claim('a-jobs')".to_string(),
        format!("SELECT outbox_ack('a-jobs', {a}, 1)"),
        format!("SELECT * FROM outbox_ack_batch('a-jobs', ARRAY[{a}], ARRAY[1])"),
        format!("SELECT outbox_nack('a-jobs', {a}, 1, 'stolen')"),
        format!("SELECT outbox_extend('a-jobs', {a}, 1, '1 day')"),
        "SELECT * FROM outbox_claim('no-such-endpoint')".to_string(),
    ] {
        refused(&mut db, "tenant_b", &call);
    }
    assert_eq!(state(&mut db), before, "the refused calls changed nothing");
    // A member of a granted role consumes for it; taking the grant back refuses the next call.
    let claimed = db.as_role("tenant_b_worker", "SELECT event_id FROM outbox_claim('b-jobs')").unwrap();
    assert_eq!(claimed[0].get::<_, i64>(0), b);
    db.execute("SELECT outbox_endpoint_revoke('b-jobs', 'tenant_b')");
    refused(&mut db, "tenant_b_worker", &format!("SELECT outbox_ack('b-jobs', {b}, 1)"));
    let acked: bool = db.as_role("tenant_a", &format!("SELECT outbox_ack('a-jobs', {a}, 1)")).unwrap()[0].get(0);
    assert!(acked);
    // Only pull endpoints are consumed by roles, and a grant names a role that exists.
    let error = db.client.batch_execute("SELECT outbox_endpoint_grant('default', 'tenant_a')").expect_err("a webhook endpoint");
    assert_eq!(error.code().map(|c| c.code()), Some("22023"), "{error}");
    let error = db.client.batch_execute("SELECT outbox_endpoint_grant('a-jobs', 'no_such_role')").expect_err("no such role");
    assert_eq!(error.code().map(|c| c.code()), Some("42704"), "{error}");
    db.execute("SELECT outbox_endpoint_drop('a-jobs'); SELECT outbox_endpoint_drop('b-jobs')");
    assert_eq!(db.value::<i64>("SELECT count(*) FROM outbox_endpoint_consumers"), 0, "a dropped endpoint's grants go with it");
}

/// The pages that hold the install recipe and the GRANT recipes, which the tests below run.
const INSTALLATION: &str = include_str!("../docs/installation.md");
const SECURITY: &str = include_str!("../docs/security.md");

/// The SQL block of a documentation page (its text) that follows `marker`, as written there.
fn sql_after(page: &str, marker: &str) -> String {
    let after = &page[page.find(marker).unwrap_or_else(|| panic!("the page has no {marker:?}"))..];
    let start = after.find("```sql\n").expect("a sql block follows") + "```sql\n".len();
    let end = after[start..].find("```").expect("the block ends");
    after[start..start + end].to_string()
}

#[test]
fn the_install_recipe_as_written_calls_no_function_another_role_planted() {
    let mut db = db();
    db.execute("DROP DATABASE IF EXISTS outbox_recipe WITH (FORCE)");
    for role in ["app_producer", "app_consumer", "ops", "monitor", "planter"] {
        db.fresh_role(role);
    }
    db.execute("CREATE DATABASE outbox_recipe");
    let mut admin = db.connect("outbox_recipe", "postgres");
    admin.batch_execute(&sql_after(INSTALLATION, "<!-- the install recipe:")).expect("the install recipe runs as written");
    admin
        .batch_execute(
            "SELECT outbox.outbox_endpoint_set('mailer', NULL, '{order.*}', kind => 'pull');
             CREATE TABLE public.captured (what text);
             GRANT INSERT ON public.captured TO PUBLIC;
             GRANT CREATE ON SCHEMA public TO planter",
        )
        .unwrap();
    admin.batch_execute(&sql_after(SECURITY, "### GRANT recipes")).expect("the GRANT recipes run as written");
    // planter may create in public (as a database's owner may, and on PostgreSQL 14 and older
    // everyone): it plants functions of our names, exact matches for calls whose arguments are
    // text or varchar (as JDBC sends strings), hoping to catch secrets and events.
    let mut planter = db.connect("outbox_recipe", "planter");
    planter
        .batch_execute(
            "CREATE FUNCTION public.outbox_endpoint_rotate_secret(name text, secret text DEFAULT NULL, grace interval DEFAULT '1 day')
               RETURNS text LANGUAGE sql AS $$ INSERT INTO public.captured VALUES ('secret ' || name) RETURNING 'whsec_planted' $$;
             CREATE FUNCTION public.outbox_endpoint_rotate_secret(name varchar, secret varchar)
               RETURNS text LANGUAGE sql AS $$ INSERT INTO public.captured VALUES ('secret ' || secret) RETURNING 'whsec_planted' $$;
             CREATE FUNCTION public.outbox_enqueue(topic varchar, payload jsonb)
               RETURNS bigint LANGUAGE sql AS $$ INSERT INTO public.captured VALUES ('event ' || topic) RETURNING -1::bigint $$;
             CREATE FUNCTION public.outbox_ack(endpoint varchar, event_id bigint, attempt integer)
               RETURNS boolean LANGUAGE sql AS $$ INSERT INTO public.captured VALUES ('ack ' || event_id) RETURNING true $$;",
        )
        .unwrap();
    let captured = |admin: &mut postgres::Client| -> Vec<String> {
        admin.query("SELECT what FROM public.captured ORDER BY what", &[]).unwrap().iter().map(|row| row.get(0)).collect()
    };

    // The calls of the documentation's examples, by the recipes' roles, with varchar arguments too.
    let mut producer = db.connect("outbox_recipe", "app_producer");
    let id: i64 = producer
        .query_one("SELECT outbox.outbox_enqueue($1::varchar, '{\"order_id\": 1}')", &[&"order.placed"])
        .expect("the producer enqueues")
        .get(0);
    let mut ops = db.connect("outbox_recipe", "ops");
    let secret: String = ops.query_one("SELECT outbox.outbox_endpoint_rotate_secret('default')", &[]).unwrap().get(0);
    let supplied = "whsec_c3VwcGxpZWQtc3VwcGxpZWQtc3VwcGxpZWQ=";
    let echoed: String =
        ops.query_one("SELECT outbox.outbox_endpoint_rotate_secret($1::varchar, $2::varchar)", &[&"default", &supplied]).unwrap().get(0);
    let mut consumer = db.connect("outbox_recipe", "app_consumer");
    let claimed = consumer.query_one("SELECT event_id, attempt FROM outbox.outbox_claim('mailer')", &[]).expect("the consumer claims");
    let acked: bool = consumer
        .query_one("SELECT outbox.outbox_ack($1::varchar, $2, $3)", &[&"mailer", &claimed.get::<_, i64>(0), &claimed.get::<_, i32>(1)])
        .unwrap()
        .get(0);
    assert!(id > 0 && secret.starts_with("whsec_") && secret != "whsec_planted" && echoed == supplied && acked);
    assert_eq!(captured(&mut admin), Vec::<String>::new(), "a planted function caught a call");
    // The plant is live: a call that relies on the search_path instead is caught.
    producer.query_one("SELECT outbox_enqueue($1::varchar, '{}')", &[&"order.placed"]).unwrap();
    assert_eq!(captured(&mut admin), vec!["event order.placed".to_string()]);

    drop((admin, planter, producer, ops, consumer));
    db.execute("DROP DATABASE outbox_recipe WITH (FORCE)");
}
