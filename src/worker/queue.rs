//! The worker's statements against the outbox table (SPI, main thread only). Each function is
//! one short transaction; none is open while a request is in flight.

use std::time::Duration;

use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use pgrx::spi::SpiError;

use crate::delivery::{retry_delay, Attempt, Event, Outcome};

const CLAIM_BATCH: &str = include_str!("../../sql/claim_batch.sql");
const MARK_SENT: &str = include_str!("../../sql/mark_sent.sql");
const RECORD_FAILURES: &str = include_str!("../../sql/record_failures.sql");
const DELETE_SENT: &str = include_str!("../../sql/delete_sent.sql");

/// An event that ran out of attempts with this failure.
pub struct DeadEvent {
    pub id: i64,
    pub topic: String,
    pub attempts: i32,
    pub last_error: String,
}

/// Points this session's search_path at the extension's schema; false while it is not installed.
pub fn use_extension_schema() -> Result<bool, SpiError> {
    BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            let Some(search_path) = crate::catalog::extension_schema(client)? else { return Ok(false) };
            client.update("SELECT pg_catalog.set_config('search_path', $1, false)", None, &[search_path.into()])?;
            Ok(true)
        })
    })
}

/// Claims with `synchronous_commit = off`: losing a claim in a crash only makes its rows
/// claimable again (they were at most in flight), and the next acknowledgement, committed
/// synchronously, flushes the claim's WAL with its own. One WAL flush per batch is saved.
pub fn claim_batch(limit: usize, lease: Duration) -> Result<Vec<Event>, SpiError> {
    BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            client.update("SET LOCAL synchronous_commit = off", None, &[])?;
            let rows = client.update(CLAIM_BATCH, None, &[(limit as i64).into(), (lease.as_millis() as i64).into()])?;
            rows.map(|row| {
                Ok(Event {
                    id: row.get(1)?.unwrap_or_default(),
                    attempts: row.get(2)?.unwrap_or_default(),
                    body: row.get(3)?.unwrap_or_default(),
                })
            })
            .collect()
        })
    })
}

/// Writes a group of finished attempts in one transaction: successes get `sent_at`, failures
/// get `last_error` and their retry time, or `dead_at` at the attempt cap.
pub fn record_attempts(finished: &[Attempt], max_attempts: i32) -> Result<Vec<DeadEvent>, SpiError> {
    let (sent, failed): (Vec<&Attempt>, Vec<&Attempt>) = finished.iter().partition(|a| a.outcome == Outcome::Delivered);
    let sent: Vec<i64> = sent.iter().map(|a| a.id).collect();
    BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            if !sent.is_empty() {
                client.update(MARK_SENT, None, &[sent.into()])?;
            }
            if failed.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<i64> = failed.iter().map(|a| a.id).collect();
            let attempts: Vec<i32> = failed.iter().map(|a| a.attempts).collect();
            let errors: Vec<String> = failed.iter().map(|a| a.outcome.last_error().unwrap_or_default()).collect();
            let retry_ms: Vec<i64> = failed
                .iter()
                .map(|a| retry_delay(a.attempts, a.outcome.retry_after(), fastrand::f64()).as_millis() as i64)
                .collect();
            let rows = client.update(
                RECORD_FAILURES,
                None,
                &[ids.into(), attempts.into(), errors.into(), retry_ms.into(), max_attempts.into()],
            )?;
            let mut dead = Vec::new();
            for row in rows {
                if row.get::<bool>(4)?.unwrap_or(false) {
                    dead.push(DeadEvent {
                        id: row.get(1)?.unwrap_or_default(),
                        topic: row.get(2)?.unwrap_or_default(),
                        attempts: row.get(3)?.unwrap_or_default(),
                        last_error: row.get(5)?.unwrap_or_default(),
                    });
                }
            }
            Ok(dead)
        })
    })
}

/// Deletes up to `limit` events sent longer than `retention` ago; returns how many went.
pub fn delete_sent(retention: Duration, limit: usize) -> Result<usize, SpiError> {
    BackgroundWorker::transaction(|| {
        Spi::connect_mut(|client| {
            let args = [(retention.as_millis() as i64).into(), (limit as i64).into()];
            Ok(client.update(DELETE_SENT, None, &args)?.len())
        })
    })
}
