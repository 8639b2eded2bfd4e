//! outbox_ext: a transactional outbox inside PostgreSQL.
//!
//! Wiring only: the schema files, the settings and the relay workers.

// Every unsafe block and impl says why it is sound (`// SAFETY:`), as pgrx itself does;
// scripts/test.sh runs clippy with -D warnings.
#![warn(clippy::undocumented_unsafe_blocks)]

use pgrx::prelude::*;

mod api;
mod catalog;
mod majors;
mod redact;
mod settings;
mod worker;

// `cargo pgrx test` calls its in-database tests as `tests.<name>()`, so that schema must exist.
#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn enqueue_returns_the_new_row_id() {
        let id = Spi::get_one::<i64>("SELECT outbox_enqueue('t', '{}')").unwrap().unwrap();
        let topic = Spi::get_one::<String>(&format!("SELECT topic FROM outbox WHERE id = {id}")).unwrap();
        assert_eq!(topic.as_deref(), Some("t"));
    }
}

// End-to-end suites, in the top-level pgrx-tests/: plain #[test]s against the cluster the
// test above boots.
#[cfg(test)]
#[path = "../pgrx-tests/mod.rs"]
mod e2e;

::pgrx::pg_module_magic!(name, version);

// The schema, in the order a fresh install runs it; sql/updates/ reuses the later files, and
// `outbox migrate` runs the same files (cli/src/script.rs), with sql/sql_install.sql in place of
// sql/library.sql. Each file requires the one before it: pgrx orders files that tie in its
// graph differently from one build to the next, and a released install script must come out
// of every build the same (scripts/package.sh).
extension_sql_file!("../sql/schema.sql", bootstrap);
extension_sql_file!("../sql/deliveries.sql", name = "deliveries");
extension_sql_file!("../sql/attempts.sql", name = "attempts", requires = ["deliveries"]);
extension_sql_file!("../sql/ordering.sql", name = "ordering", requires = ["attempts"]);
extension_sql_file!("../sql/endpoints_version.sql", name = "endpoints_version", requires = ["ordering"]);
extension_sql_file!("../sql/endpoints.sql", name = "endpoints", requires = ["endpoints_version"]);
extension_sql_file!("../sql/library_settings.sql", name = "library_settings", requires = ["endpoints"]);
extension_sql_file!("../sql/limits.sql", name = "limits", requires = ["library_settings"]);
extension_sql_file!("../sql/claim.sql", name = "claim", requires = ["limits"]);
extension_sql_file!("../sql/pull.sql", name = "pull", requires = ["claim"]);
extension_sql_file!("../sql/relays.sql", name = "relays", requires = ["pull"]);
extension_sql_file!("../sql/dead.sql", name = "dead", requires = ["relays"]);
extension_sql_file!("../sql/log.sql", name = "log", requires = ["dead"]);
extension_sql_file!("../sql/log_slot.sql", name = "log_slot", requires = ["log"]);
extension_sql_file!("../sql/library.sql", name = "library", requires = ["log_slot"]);
extension_sql_file!("../sql/api.sql", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a PostgreSQL global, read in _PG_init on the main thread.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    settings::register(preloading);
    // Workers and shared memory exist only when loaded through shared_preload_libraries;
    // CREATE EXTENSION alone still gives a working outbox_enqueue, delivered by `outbox relay`
    // (cli/tests/sql_install.rs, on the cluster that preloads nothing).
    if !preloading {
        return;
    }
    redact::install_log_hook();
    worker::utility_hook::install();
    worker::registry::init_shared_memory();
    worker::launcher::register();
}

/// Required by `cargo pgrx test`: the settings the test cluster starts with.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        crate::e2e::cluster::POSTGRESQL_CONF.to_vec()
    }
}
