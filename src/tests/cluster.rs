pub const POSTGRESQL_CONF: &[&str] = &[
    "shared_preload_libraries = 'outbox_ext'",
    "outbox.database = 'pgrx_tests'",
    "outbox.workers = 2",
];
