//! The relay's logic, with no pgrx in it: what both drivers run, the background worker inside
//! PostgreSQL and (from 0.3) the `outbox` process outside it.
//!
//! - `delivery`: sending a claimed delivery to its endpoint and classifying what came back —
//!   HTTP, signatures, outcomes, backoff, allowed destinations, the doorbell that wakes a
//!   driver when a request ends.
//! - `shares`: how a worker's requests budget is shared between the endpoints it claims for.

pub mod delivery;
pub mod shares;
