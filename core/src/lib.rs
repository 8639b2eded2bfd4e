//! The relay's logic, with no pgrx in it: what both drivers run, the background worker inside
//! PostgreSQL and (from 0.3) the `outbox` process outside it.
//!
//! - `delivery`: sending a claimed delivery to its endpoint and classifying what came back —
//!   HTTP, signatures, outcomes, backoff, allowed destinations, the doorbell that wakes a
//!   driver when a request ends.
//! - `relay`: the relay loop, and the `Wake` and `Report` traits a driver implements for it.
//! - `queue`: the `Queue` trait, the loop's statements as a driver runs them, and their
//!   arguments and rows.
//! - `endpoints`: the endpoints a relay sends to, as it last read them, and what its next
//!   claim may take of each (the claim planner).
//! - `shares`: how a relay's requests budget is shared between the endpoints it claims for.
//! - `settings`: the relay's settings as plain data.
//! - `statements`: the relay's SQL, as the files in `sql/` hold it.
//! - `timers`: when the relay loop's next claim and retention pass are due.

pub mod delivery;
pub mod endpoints;
pub mod log;
pub mod queue;
pub mod relay;
pub mod settings;
pub mod shares;
pub mod statements;
pub mod timers;
