//! One short transaction of a relay worker, with PostgreSQL's ERRORs caught.
//!
//! pgrx's `BackgroundWorker::transaction` lets an ERROR unwind out of the worker, which then
//! exits and takes everything else that transaction did with it. Here an ERROR (bad values,
//! lock or statement timeouts, a table dropped under us, a failing commit) rolls the
//! transaction back and comes back as an `Err`, as PostgreSQL's own workers do it
//! (autovacuum.c, worker_spi.c): the loop logs it and goes on.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::spi::SpiError;

use crate::majors;

#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    /// An ERROR raised by PostgreSQL (or by pgrx on our behalf).
    #[error("{message} (SQLSTATE {sqlstate})")]
    Postgres { sqlstate: String, message: String },
    /// SPI refused the call before PostgreSQL ran it.
    #[error("SPI: {0}")]
    Spi(#[from] SpiError),
}

/// Runs `body` in its own transaction and commits it; on any error the transaction is rolled
/// back, nothing of it stays, and the worker carries on.
pub fn run<T>(body: impl FnOnce() -> Result<T, SpiError> + std::panic::UnwindSafe) -> Result<T, TransactionError> {
    let result = PgTryBuilder::new(|| {
        // SAFETY: called on the worker's main thread between transactions, as PostgreSQL's
        // own background workers start theirs.
        unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let value = body()?;
        // SAFETY: the snapshot pushed above is still the active one; the commit can raise an
        // ERROR too (deferred checks), which the catch below turns into an Err.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(value)
    })
    .catch_others(|caught| Err(postgres_error(caught)))
    .execute();
    if result.is_err() {
        // SAFETY: the error (if any) was copied and flushed by the catch; aborting releases
        // the transaction's locks, snapshots, SPI state and memory, and leaves the worker in
        // TopMemoryContext with no transaction, as before the call.
        unsafe { pg_sys::AbortCurrentTransaction() };
        // SAFETY: as PostgresMain does after an ERROR, which aborting leaves to it: a slot
        // this worker was making or reading (log mode) is let go, and a half-made one dropped.
        unsafe {
            if !pg_sys::MyReplicationSlot.is_null() {
                pg_sys::ReplicationSlotRelease();
            }
            majors::drop_temporary_slots();
        }
    }
    result
}

fn postgres_error(caught: CaughtError) -> TransactionError {
    let report = match &caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => report,
        CaughtError::RustPanic { ereport, .. } => ereport,
    };
    // SAFETY: unpack_sql_state only formats the code into a static buffer.
    let sqlstate = unsafe { std::ffi::CStr::from_ptr(pg_sys::unpack_sql_state(report.sql_error_code() as i32)) };
    TransactionError::Postgres { sqlstate: sqlstate.to_string_lossy().into_owned(), message: report.message().to_string() }
}
