//! End-to-end tests against a real cluster with the extension preloaded, two real relay
//! workers and a real HTTP receiver on 127.0.0.1. Compiled into the crate's own test binary
//! (`src/lib.rs` names this file) because `cargo pgrx test` boots its cluster from there
//! (see docs/contributing.md, "Tests").

pub mod cluster;
mod receiver;

mod bad_settings;
mod budgets;
mod consumer;
mod databases;
mod dead;
mod delivery;
mod destinations;
mod dump_restore;
mod endpoints;
mod enqueue;
mod hostile;
mod log;
mod ordering;
mod pull;
mod retention;
mod retries;
mod security;
mod settings;
mod upgrade;
mod workers;
