//! outbox_ext: a transactional outbox inside PostgreSQL.
//!
//! Wiring only: the schema files, the settings and the relay workers.

use pgrx::prelude::*;

mod api;
mod delivery;
mod settings;
mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", bootstrap);
extension_sql_file!("../sql/api.sql", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::register();
    // Workers and shared memory exist only when loaded through shared_preload_libraries;
    // CREATE EXTENSION alone still gives a working outbox_enqueue (delivered by nobody).
    if unsafe { !pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    worker::wake::init_shared_memory();
    worker::register_workers();
}

/// Required by `cargo pgrx test`: the settings the test cluster starts with.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        crate::tests::cluster::POSTGRESQL_CONF.to_vec()
    }
}
