//! The shared test cluster (booted once per test binary by pgrx's framework) and helpers to
//! drive it. The relay workers and the outbox table are shared, so end-to-end tests take a
//! lock and run one at a time, each starting from an empty outbox.

use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// No outbox.database: the relay serves every database with the extension, as by default.
/// Room for the launcher, the logical replication launcher and two relay workers in each of
/// the four databases databases::every_database… serves at once; prepared transactions on,
/// so that the test can show which ones the extension refuses.
pub const POSTGRESQL_CONF: &[&str] = &[
    "shared_preload_libraries = 'outbox_ext'",
    "outbox.workers = 2",
    "max_worker_processes = 16",
    "max_prepared_transactions = 2",
    "wal_level = logical",
];

/// The settings tests change; each test starts with them at their defaults.
const CHANGED_SETTINGS: &[&str] = &[
    "outbox.webhook_url",
    "outbox.signing_secret",
    "outbox.batch_size",
    "outbox.lease",
    "outbox.max_attempts",
    "outbox.http_timeout",
    "outbox.poll_interval",
    "outbox.retention",
    "outbox.endpoint_disable_after",
    "lock_timeout",
    "synchronous_standby_names",
];

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A connection to the test database, held while one end-to-end test runs.
pub struct Db {
    pub client: postgres::Client,
    _turn: MutexGuard<'static, ()>,
}

/// Waits for this test's turn, boots the cluster if needed, and resets the outbox and the
/// settings to their defaults, with the extension installed in `public` and the endpoint
/// `default` as CREATE EXTENSION made it.
pub fn db() -> Db {
    // A test that failed while holding the lock poisons it; the state is reset below anyway.
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    static BOOT: std::sync::Once = std::sync::Once::new();
    BOOT.call_once(|| {
        pgrx_tests::run_test("enqueue_returns_the_new_row_id", None, POSTGRESQL_CONF.to_vec()).expect("test cluster");
    });
    let (client, _) = pgrx_tests::client().expect("connect to the test cluster");
    let mut db = Db { client, _turn: turn };
    // A test that moves (or downgrades) the extension puts it back; this covers one that failed
    // midway.
    let installed = "SELECT extnamespace::regnamespace::text || ' ' || extversion FROM pg_extension WHERE extname = 'outbox_ext'";
    if db.value::<String>(installed) != format!("public {}", crate::catalog::LIBRARY_VERSION) {
        db.execute("DROP EXTENSION outbox_ext CASCADE; CREATE EXTENSION outbox_ext SCHEMA public");
    }
    for name in CHANGED_SETTINGS {
        db.execute(&format!("ALTER SYSTEM RESET {name}"));
    }
    db.reload_settings();
    // outbox_deliveries first: every worker statement that locks it locks it first, so this
    // waits for them instead of deadlocking with them.
    db.execute(
        "TRUNCATE outbox_attempts, outbox_deliveries, outbox_keys, outbox_key_arrivals, outbox_key_sequencers, outbox_delivery_counts, outbox_endpoint_secrets, outbox_unrouted, outbox, processed_events;
         DELETE FROM outbox_endpoints;
         INSERT INTO outbox_endpoints (name) VALUES ('default')",
    );
    db
}

impl Db {
    pub fn execute(&mut self, sql: &str) {
        self.client.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", e.as_db_error().map_or(e.to_string(), |e| e.to_string())));
    }

    pub fn value<T: for<'a> postgres::types::FromSql<'a>>(&mut self, sql: &str) -> T {
        self.client.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
    }

    /// The rows of a one-column query.
    pub fn column<T: for<'a> postgres::types::FromSql<'a>>(&mut self, sql: &str) -> Vec<T> {
        self.client.query(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).iter().map(|row| row.get(0)).collect()
    }

    /// Runs `sql` as `role` (SET ROLE), and returns to the superuser whatever happens.
    pub fn as_role(&mut self, role: &str, sql: &str) -> Result<Vec<postgres::Row>, postgres::Error> {
        self.execute(&format!("SET ROLE {role}"));
        let result = self.client.query(sql, &[]);
        self.execute("RESET ROLE");
        result
    }

    /// A new login role named `name`, dropped first (with what it owns) if it exists.
    pub fn fresh_role(&mut self, name: &str) {
        self.execute(&format!(
            "DO $$ BEGIN
               IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN
                 EXECUTE 'DROP OWNED BY {name}'; EXECUTE 'DROP ROLE {name}';
               END IF;
             END $$;
             CREATE ROLE {name} LOGIN"
        ));
    }

    /// Where the test cluster listens, as (host, port), for new sessions and for pg_dump.
    pub fn server_address(&mut self) -> (String, String) {
        (self.value("SELECT host(inet_server_addr())"), self.value("SELECT current_setting('port')"))
    }

    /// A new session on `database` as `user`.
    pub fn connect(&mut self, database: &str, user: &str) -> postgres::Client {
        let (host, port) = self.server_address();
        postgres::Client::connect(&format!("host={host} port={port} user={user} dbname={database}"), postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to {database} as {user}: {e}"))
    }

    /// Process ids of the running relay workers, by worker number.
    pub fn worker_pids(&mut self) -> Vec<i32> {
        self.column("SELECT pid FROM outbox_workers() ORDER BY worker")
    }

    pub fn enqueue(&mut self, topic: &str, payload: &str) -> i64 {
        self.client.query_one("SELECT outbox_enqueue($1, $2::text::jsonb)", &[&topic, &payload]).expect("outbox_enqueue").get(0)
    }

    /// Applies `settings` with ALTER SYSTEM and waits until every worker has reloaded them.
    pub fn configure(&mut self, settings: &[(&str, &str)]) {
        for (name, value) in settings {
            let value = value.replace('\'', "''");
            self.execute(&format!("ALTER SYSTEM SET {name} = '{value}'"));
        }
        self.reload_settings();
    }

    fn reload_settings(&mut self) {
        wait_until("both relay workers run", Duration::from_secs(30), || self.value::<i64>("SELECT count(*) FROM outbox_workers()") == 2);
        let before: SystemTime = self.value("SELECT clock_timestamp()");
        self.execute("SELECT pg_reload_conf()");
        wait_until("every worker reloaded its settings", Duration::from_secs(10), || {
            let sql = "SELECT bool_and(settings_loaded_at > $1) FROM outbox_workers()";
            self.client.query_one(sql, &[&before]).unwrap().get::<_, bool>(0)
        });
    }

    /// Polls `condition` until it holds, as `wait_until`; on timeout the failure also shows what
    /// the relay workers were doing then, which may say why.
    pub fn wait_for(&mut self, what: &str, timeout: Duration, mut condition: impl FnMut(&mut Db) -> bool) {
        let deadline = Instant::now() + timeout;
        while !condition(self) {
            if Instant::now() >= deadline {
                let workers: Vec<String> = self.column(
                    "SELECT concat_ws(' ', worker, pid, 'in flight', in_flight, 'delivered', delivered, 'failed', failed) FROM outbox_workers()",
                );
                let activity: Vec<String> = self.column(
                    "SELECT concat_ws(' ', pid, state, wait_event_type, wait_event, left(query, 120)) FROM pg_stat_activity
                      WHERE backend_type = 'outbox_ext relay' AND datname = current_database()",
                );
                let deliveries: Vec<String> = self.column(
                    "SELECT concat_ws(' ', endpoint, 'claimed by', claimed_by, 'attempts', attempts, 'sent', sent_at IS NOT NULL, count(*))
                       FROM outbox_deliveries GROUP BY endpoint, claimed_by, attempts, sent_at IS NOT NULL ORDER BY 1",
                );
                // Log mode's state, if the outbox has it (a test of an older version may not).
                let log: Vec<String> = self.column(
                    "SELECT concat_ws(' ', 'enabled', s.enabled, 'fence', s.reader_fence, 'until', s.reader_until, 'recovering', s.recovering,
                                      'confirmed', s.confirmed_lsn, 'at', s.confirmed_at, 'recover from', s.recover_from,
                                      'slot', r.slot_name, r.confirmed_flush_lsn)
                       FROM outbox_log_state AS s LEFT JOIN pg_replication_slots AS r ON r.slot_name = s.slot
                      WHERE to_regclass('outbox_log_state') IS NOT NULL",
                );
                panic!(
                    "timed out after {timeout:?} waiting until {what}; workers {workers:?}; activity {activity:?}; deliveries {deliveries:?}; log {log:?}"
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the event's delivery to the endpoint `default` was acknowledged.
    pub fn is_sent(&mut self, id: i64) -> bool {
        self.count(&format!("id = {id} AND sent_at IS NOT NULL")) == 1
    }

    pub fn is_dead(&mut self, id: i64) -> bool {
        self.count(&format!("id = {id} AND dead_at IS NOT NULL")) == 1
    }

    /// How many deliveries to the endpoint `default` match `condition`, which may name the
    /// columns of the delivery and of its event (`id`, `topic`, ...).
    pub fn count(&mut self, condition: &str) -> i64 {
        self.count_to("default", condition)
    }

    /// The same for the deliveries to `endpoint`.
    pub fn count_to(&mut self, endpoint: &str, condition: &str) -> i64 {
        self.value(&format!(
            "SELECT count(*) FROM outbox_deliveries JOIN outbox ON id = event_id WHERE endpoint = '{endpoint}' AND {condition}"
        ))
    }

    /// How many events match `condition`, whatever their deliveries.
    pub fn count_events(&mut self, condition: &str) -> i64 {
        self.value(&format!("SELECT count(*) FROM outbox WHERE {condition}"))
    }

    /// Writes `n` events of `topic` directly, each with a delivery to `default` whose
    /// `columns` get `values` (SQL expressions): history and backlogs for tests to start from.
    pub fn insert_deliveries(&mut self, topic: &str, n: i64, columns: &str, values: &str) {
        self.insert_deliveries_to("default", topic, n, columns, values);
    }

    /// The same, with the deliveries to `endpoint`.
    pub fn insert_deliveries_to(&mut self, endpoint: &str, topic: &str, n: i64, columns: &str, values: &str) {
        self.execute(&format!(
            "WITH e AS (INSERT INTO outbox (topic, payload) SELECT '{topic}', '{{}}' FROM generate_series(1, {n}) RETURNING id)
             INSERT INTO outbox_deliveries (event_id, endpoint, {columns}) SELECT id, '{endpoint}', {values} FROM e"
        ));
    }
}

/// Polls `condition` until it holds; fails the test with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// sql/claim.sql's statement, the claim every claimer runs, prepared as `claim` (its arguments
/// by number, as outbox_claim_due names them) with the function's settings, in the transaction
/// the caller has open: for the tests that read its plan.
pub fn prepare_claim() -> String {
    let source = include_str!("../sql/claim.sql");
    let start = source.find("RETURN QUERY\n").expect("the claim's statement") + "RETURN QUERY\n".len();
    let end = start + source[start..].find(";\nEND\n").expect("the end of the claim's statement");
    format!(
        "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off;
         SET LOCAL jit = off; PREPARE claim(text, text[], bigint[], float8[], integer[], bigint, integer) AS {}",
        source[start..end].replace("@extschema@", "public")
    )
}
