//! The worker's statements against the outbox table (SPI, main thread only). Each function is
//! one short transaction; none is open while a request is in flight, and an ERROR in one
//! comes back as an `Err` (see `transaction`).

use std::time::Duration;

use pgrx::prelude::*;

use super::transaction::{self, TransactionError};
use crate::catalog::Installation;
use crate::delivery::{retry_delay, Attempt, Event};

/// An event that ran out of attempts with this failure.
pub struct DeadEvent {
    pub id: i64,
    pub topic: String,
    pub attempts: i32,
    pub last_error: String,
}

/// The worker's statements, with the extension's tables named by their schema.
pub struct Queries {
    pub installation: Installation,
    claim_batch: String,
    mark_sent: String,
    record_failures: String,
    delete_sent: String,
}

impl Queries {
    pub fn new(installation: Installation) -> Queries {
        Queries {
            claim_batch: installation.qualify(include_str!("../../sql/claim_batch.sql")),
            mark_sent: installation.qualify(include_str!("../../sql/mark_sent.sql")),
            record_failures: installation.qualify(include_str!("../../sql/record_failures.sql")),
            delete_sent: installation.qualify(include_str!("../../sql/delete_sent.sql")),
            installation,
        }
    }

    /// The claim as the workers run it; the EXPLAIN test plans the same text.
    #[cfg(test)]
    pub fn claim_batch_sql(&self) -> &str {
        &self.claim_batch
    }
}

/// Pins this session's search_path to pg_catalog: every statement the worker runs then
/// resolves operators and functions there, and names the extension's tables by schema, so
/// nothing another role created (in public or in the extension's schema) runs as this worker.
pub fn pin_search_path() -> Result<(), TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)", None, &[])?;
            Ok(())
        })
    })
}

/// The extension as installed in this database now, or `None`.
pub fn find_installation() -> Result<Option<Installation>, TransactionError> {
    transaction::run(|| Spi::connect(|client| Installation::find(&client)))
}

/// Claims with `synchronous_commit = off`: losing a claim in a crash only makes its rows
/// claimable again (they were at most in flight), and the next acknowledgement, committed
/// synchronously, flushes the claim's WAL with its own. One WAL flush per batch is saved.
pub fn claim_batch(queries: &Queries, limit: usize, lease: Duration) -> Result<Vec<Event>, TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update("SET LOCAL synchronous_commit = off", None, &[])?;
            let args = [(limit as i64).into(), millis(lease).into()];
            let rows = client.update(queries.claim_batch.as_str(), None, &args)?;
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

/// Records acknowledged deliveries in a transaction of their own, so that nothing else that
/// fails can take an acknowledgement with it.
pub fn mark_sent(queries: &Queries, ids: &[i64]) -> Result<(), TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update(queries.mark_sent.as_str(), None, &[ids.to_vec().into(), queries.installation.oid.into()])?;
            Ok(())
        })
    })
}

/// Records failed attempts: `last_error` and the retry time, or `dead_at` at the attempt cap.
pub fn record_failures(queries: &Queries, failed: &[&Attempt], max_attempts: i32) -> Result<Vec<DeadEvent>, TransactionError> {
    let ids: Vec<i64> = failed.iter().map(|a| a.id).collect();
    let attempts: Vec<i32> = failed.iter().map(|a| a.attempts).collect();
    let errors: Vec<String> = failed.iter().map(|a| a.outcome.last_error().unwrap_or_default()).collect();
    let retry_ms: Vec<f64> = failed
        .iter()
        .map(|a| millis(retry_delay(a.attempts, a.outcome.retry_after(), fastrand::f64())))
        .collect();
    transaction::run(|| {
        Spi::connect_mut(|client| {
            let args = [ids.into(), attempts.into(), errors.into(), retry_ms.into(), max_attempts.into(), queries.installation.oid.into()];
            let rows = client.update(queries.record_failures.as_str(), None, &args)?;
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
pub fn delete_sent(queries: &Queries, retention: Duration, limit: usize) -> Result<usize, TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            let args = [millis(retention).into(), (limit as i64).into()];
            Ok(client.update(queries.delete_sent.as_str(), None, &args)?.len())
        })
    })
}

/// A duration as float8 milliseconds, the type the statements multiply an interval by.
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
