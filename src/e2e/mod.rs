//! End-to-end tests against a real cluster with the extension preloaded, two real relay
//! workers and a real HTTP receiver on 127.0.0.1. They live inside the crate because
//! `cargo pgrx test` boots its cluster from here (see the README, "Tests").

pub mod cluster;
mod receiver;

mod bad_settings;
mod consumer;
mod delivery;
mod dump_restore;
mod endpoints;
mod enqueue;
mod hostile;
mod ordering;
mod pull;
mod retention;
mod retries;
mod security;
mod settings;
mod upgrade;
mod workers;
