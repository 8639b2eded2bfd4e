//! The worker's statements against the extension's tables (SPI, main thread only). Each function is
//! one short transaction; none is open while a request is in flight, and an ERROR in one
//! comes back as an `Err` (see `transaction`).

use std::ffi::CStr;
use std::time::{Duration, Instant};

use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};

use super::transaction::{self, TransactionError};
use crate::catalog::Installation;
use outbox_core::endpoints::EndpointRow;
use outbox_core::log::batch::Deferrals;
use outbox_core::log::routes::TopicRoute;
use outbox_core::queue::{
    millis, AttemptColumns, ClaimArguments, ClaimedRow, DeadDelivery, EndpointsRead, FailureColumns, LogLease, LogRows, Queue, QueueError,
};
use outbox_core::settings::defaults;
use outbox_core::statements::{
    CLAIM_BATCH, DELETE_EMPTIED_EVENTS, DELETE_EXPIRED, DISABLE_FAILING_ENDPOINTS, ENDPOINTS_VERSION, LOAD_ENDPOINTS, LOG_CONFIRM,
    LOG_DEFER, LOG_LEASE, LOG_MAINTAIN, LOG_MAKE_SLOT, LOG_READ, LOG_RECOVER, LOG_ROUTE, MARK_SENT, NOTE_UNUSABLE_ENDPOINTS,
    RECORD_FAILURES, SEQUENCE, SESSION_SETTINGS, UNCOUNT_ABANDONED,
};

/// The worker's statements, with the extension's tables named by their schema. Those run for
/// every batch are prepared once (planning the claim took longer than running it); the
/// others run at most once a poll and are planned each time, with their arguments' values.
pub struct Queries {
    pub installation: Installation,
    endpoints_version: OwnedPreparedStatement,
    sequence: OwnedPreparedStatement,
    claim_batch: OwnedPreparedStatement,
    mark_sent: OwnedPreparedStatement,
    record_failures: OwnedPreparedStatement,
    disable_failing_endpoints: String,
    load_endpoints: String,
    note_unusable_endpoints: String,
    delete_expired: String,
    delete_emptied_events: String,
    uncount_abandoned: String,
    log: LogStatements,
    /// When the reader of the log last logged the running transactions (`log_confirm`).
    log_standby_snapshot_at: Option<Instant>,
}

/// The restart position of the slot moving up costs fsyncs: the decoder saves a snapshot to
/// disk at the record, the confirmation the slot's new position. One record after each
/// confirmation paid them at every read (at 5,000 events/s, a read took 4 ms where it took 2);
/// a record this often leaves each read at most this much WAL to decode again.
const STANDBY_SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

/// Log mode's statements (sql/log.sql), run once per read of the slot: planned each time.
struct LogStatements {
    lease: String,
    make_slot: String,
    recover: String,
    read: String,
    route: String,
    defer: String,
    confirm: String,
    maintain: String,
}

/// The statements for `installation`, prepared in a transaction of their own.
pub fn prepare(installation: Installation) -> Result<Queries, TransactionError> {
    use pg_sys::{FLOAT8ARRAYOID, INT4ARRAYOID, INT4OID, INT8ARRAYOID, INT8OID, OIDOID, TEXTARRAYOID};
    let prepared = transaction::run(|| {
        Spi::connect_mut(|client| {
            let prepare = |sql: &str, types: &[pg_sys::Oid]| -> Result<OwnedPreparedStatement, pgrx::spi::SpiError> {
                let types: Vec<pg_sys::PgOid> = types.iter().map(|oid| (*oid).into()).collect();
                Ok(client.prepare_mut(installation.qualify(sql).as_str(), &types)?.keep())
            };
            Ok([
                prepare(ENDPOINTS_VERSION, &[])?,
                prepare(SEQUENCE, &[TEXTARRAYOID])?,
                prepare(CLAIM_BATCH, &[TEXTARRAYOID, INT8ARRAYOID, FLOAT8ARRAYOID, INT4ARRAYOID, INT8OID, INT4OID])?,
                prepare(MARK_SENT, &[TEXTARRAYOID, INT8ARRAYOID, INT4ARRAYOID, OIDOID])?,
                prepare(
                    RECORD_FAILURES,
                    &[
                        TEXTARRAYOID,
                        INT8ARRAYOID,
                        INT4ARRAYOID,
                        TEXTARRAYOID,
                        FLOAT8ARRAYOID,
                        INT4ARRAYOID,
                        OIDOID,
                        INT4ARRAYOID,
                        FLOAT8ARRAYOID,
                        TEXTARRAYOID,
                    ],
                )?,
            ])
        })
    })?;
    let [endpoints_version, sequence, claim_batch, mark_sent, record_failures] = prepared;
    Ok(Queries {
        endpoints_version,
        sequence,
        claim_batch,
        mark_sent,
        record_failures,
        disable_failing_endpoints: installation.qualify(DISABLE_FAILING_ENDPOINTS),
        load_endpoints: installation.qualify(LOAD_ENDPOINTS),
        note_unusable_endpoints: installation.qualify(NOTE_UNUSABLE_ENDPOINTS),
        delete_expired: installation.qualify(DELETE_EXPIRED),
        delete_emptied_events: installation.qualify(DELETE_EMPTIED_EVENTS),
        uncount_abandoned: installation.qualify(UNCOUNT_ABANDONED),
        log: LogStatements {
            lease: installation.qualify(LOG_LEASE),
            make_slot: installation.qualify(LOG_MAKE_SLOT),
            recover: installation.qualify(LOG_RECOVER),
            read: installation.qualify(LOG_READ),
            route: installation.qualify(LOG_ROUTE),
            defer: installation.qualify(LOG_DEFER),
            confirm: installation.qualify(LOG_CONFIRM),
            maintain: installation.qualify(LOG_MAINTAIN),
        },
        installation,
        log_standby_snapshot_at: None,
    })
}

/// Sets up the worker's session for its statements (`SESSION_SETTINGS`), in one statement
/// that names everything by schema, since the search_path is not pinned yet.
pub fn prepare_session() -> Result<(), TransactionError> {
    let (names, values): (Vec<&str>, Vec<&str>) = SESSION_SETTINGS.iter().copied().unzip();
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update(
                "SELECT pg_catalog.set_config(s.name, s.value, false)
                   FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS s (name, value)",
                None,
                &[names.clone().into(), values.clone().into()],
            )?;
            Ok(())
        })
    })
}

/// The extension as installed in this database now, or `None`.
pub fn find_installation() -> Result<Option<Installation>, TransactionError> {
    transaction::run(|| Spi::connect(Installation::find))
}

/// Who claims, as `claimed_by` records it: the worker's process id.
fn claimer() -> i32 {
    // SAFETY: set once when the process starts.
    unsafe { pg_sys::MyProcPid }
}

/// `outbox_endpoints_version`, which every change to an endpoint moves on as it commits.
fn endpoints_version(client: &mut SpiClient<'_>, queries: &Queries) -> Result<i64, pgrx::spi::SpiError> {
    Ok(client.update(&queries.endpoints_version, None, &[])?.first().get_one::<i64>()?.unwrap_or(0))
}

/// Each read and advance of the log's slot starts logical decoding, which PostgreSQL 15 says
/// in two LOG lines: hundreds a second, gigabytes of server log a day. Only for this
/// transaction, so that the worker's own lines are still logged; `fatal`, since
/// log_min_messages ranks LOG above ERROR.
fn decode_quietly() {
    set_local(c"log_min_messages", Some(c"fatal"), pg_sys::GucContext::PGC_SUSET);
}

/// This transaction commits as the server is configured to, not with the session's
/// synchronous_commit = off (`prepare_session`): for what must be on disk before the worker
/// goes on.
fn commit_durably() {
    set_local(c"synchronous_commit", None, pg_sys::GucContext::PGC_USERSET);
}

/// Sets `name` for this transaction only, to `value` or (`None`) to the server's own value,
/// as SET LOCAL does; directly rather than by a statement, which would give the transaction
/// an id (a slot cannot be made in one that has). An ERROR here comes back to the relay, which
/// logs it.
fn set_local(name: &CStr, value: Option<&CStr>, context: pg_sys::GucContext::Type) {
    // SAFETY: main thread, inside a transaction; the strings are NUL-terminated and outlive
    // the call (the value is copied).
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.map_or(std::ptr::null(), CStr::as_ptr),
            context,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            PgLogLevel::ERROR as i32,
            false,
        )
    };
}

impl Queries {
    /// What a failed statement means to the loop: `Gone` if the extension was dropped,
    /// re-created or updated since these statements were prepared (also when even that lookup
    /// fails, the error is what is reported).
    fn failure(&self, error: TransactionError) -> QueueError {
        match find_installation() {
            Ok(Some(installation)) if installation == self.installation => QueueError::Failed(error.to_string()),
            Ok(_) => QueueError::Gone,
            Err(_) => QueueError::Failed(error.to_string()),
        }
    }
}

impl Queue for Queries {
    /// First of all, checks that the extension is still the one the worker knows.
    fn load_endpoints(&mut self, disable_after: Option<Duration>) -> Result<EndpointsRead, QueueError> {
        let read = transaction::run(|| {
            Spi::connect_mut(|client| {
                let same = "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $1)";
                if client.select(same, None, &[self.installation.oid.into()])?.first().get_one::<bool>()? != Some(true) {
                    return Ok(None);
                }
                // Read first: a change after this makes the next claim see a newer version.
                let version = endpoints_version(client, self)?;
                let mut disabled = Vec::new();
                if let Some(after) = disable_after {
                    for row in client.update(self.disable_failing_endpoints.as_str(), None, &[millis(after).into()])? {
                        disabled.push((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default()));
                    }
                }
                let mut endpoints = Vec::new();
                for row in client.select(self.load_endpoints.as_str(), None, &[])? {
                    let names: Vec<String> = row.get(3)?.unwrap_or_default();
                    let values: Vec<String> = row.get(4)?.unwrap_or_default();
                    endpoints.push(EndpointRow {
                        name: row.get(1)?.unwrap_or_default(),
                        url: row.get(2)?,
                        headers: names.into_iter().zip(values).collect(),
                        timeout: row.get::<f64>(5)?.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)),
                        max_attempts: row.get(6)?.unwrap_or(defaults::MAX_ATTEMPTS),
                        max_in_flight: row.get(7)?,
                        secrets: row.get(8)?.unwrap_or_default(),
                        ordered: row.get(9)?.unwrap_or(false),
                    });
                }
                Ok(Some(EndpointsRead { disabled, endpoints, version }))
            })
        });
        read.map_err(|e| self.failure(e))?.ok_or(QueueError::Gone)
    }

    /// With `synchronous_commit = off`: losing a claim in a crash only makes its deliveries
    /// claimable again (they were at most in flight), and the next acknowledgement, committed
    /// synchronously, flushes the claim's WAL with its own. One WAL flush per batch is saved.
    /// (A sequencing lost the same way is done again: its arrivals come back with it.)
    fn claim_batch(&mut self, claim: &ClaimArguments, version: i64) -> Result<Option<Vec<ClaimedRow>>, QueueError> {
        let claimed = transaction::run(|| {
            Spi::connect_mut(|client| {
                if endpoints_version(client, self)? != version {
                    return Ok(None);
                }
                if !claim.ordered.is_empty() {
                    client.update(&self.sequence, None, &[claim.ordered.clone().into()])?;
                }
                let args = [
                    claim.endpoints.clone().into(),
                    claim.limits.clone().into(),
                    claim.leases.clone().into(),
                    claim.caps.clone().into(),
                    claim.bytes.into(),
                    claimer().into(),
                ];
                let mut rows = Vec::new();
                for row in client.update(&self.claim_batch, None, &args)? {
                    rows.push(ClaimedRow {
                        endpoint: row.get(1)?,
                        event_id: row.get(2)?.unwrap_or_default(),
                        attempts: row.get(3)?.unwrap_or_default(),
                        body: row.get(4)?,
                        last_error: row.get(5)?,
                        fence: row.get(6)?.unwrap_or_default(),
                    });
                }
                Ok(Some(rows))
            })
        });
        claimed.map_err(|e| self.failure(e))
    }

    /// In a transaction of its own, so that nothing else that fails can take an
    /// acknowledgement with it.
    fn mark_sent(&mut self, acks: &AttemptColumns) -> Result<i64, QueueError> {
        let released = transaction::run(|| {
            Spi::connect_mut(|client| {
                // An acknowledged delivery is not sent again after a crash.
                commit_durably();
                let args = [
                    acks.endpoints.clone().into(),
                    acks.ids.clone().into(),
                    acks.fences.clone().into(),
                    self.installation.deliveries.into(),
                ];
                let mut released = 0;
                for row in client.update(&self.mark_sent, None, &args)? {
                    released += i64::from(row.get::<i32>(2)?.unwrap_or(0));
                }
                Ok(released)
            })
        });
        released.map_err(|e| self.failure(e))
    }

    fn record_failures(&mut self, failures: &FailureColumns) -> Result<Vec<DeadDelivery>, QueueError> {
        let dead = transaction::run(|| {
            Spi::connect_mut(|client| {
                let attempts = &failures.attempts;
                let args = [
                    attempts.endpoints.clone().into(),
                    attempts.ids.clone().into(),
                    attempts.fences.clone().into(),
                    failures.errors.clone().into(),
                    failures.retry_ms.clone().into(),
                    failures.caps.clone().into(),
                    self.installation.deliveries.into(),
                    failures.statuses.clone().into(),
                    failures.took_ms.clone().into(),
                    failures.responses.clone().into(),
                ];
                let mut dead = Vec::new();
                for row in client.update(&self.record_failures, None, &args)? {
                    if row.get::<bool>(4)?.unwrap_or(false) {
                        dead.push(DeadDelivery {
                            endpoint: row.get(1)?.unwrap_or_default(),
                            event_id: row.get(2)?.unwrap_or_default(),
                            attempts: row.get(3)?.unwrap_or_default(),
                            last_error: row.get(5)?.unwrap_or_default(),
                        });
                    }
                }
                Ok(dead)
            })
        });
        dead.map_err(|e| self.failure(e))
    }

    fn uncount_abandoned(&mut self, abandoned: &AttemptColumns) -> Result<(), QueueError> {
        let done = transaction::run(|| {
            Spi::connect_mut(|client| {
                // A stopping worker must exit within seconds: if a row is locked, the attempt counts.
                client.update("SET LOCAL lock_timeout = '500ms'", None, &[])?;
                let args = [
                    abandoned.endpoints.clone().into(),
                    abandoned.ids.clone().into(),
                    abandoned.fences.clone().into(),
                    self.installation.deliveries.into(),
                    claimer().into(),
                ];
                client.update(self.uncount_abandoned.as_str(), None, &args)?;
                Ok(())
            })
        });
        done.map_err(|e| self.failure(e))
    }

    fn note_unusable_endpoints(&mut self, names: &[String], reasons: &[String]) -> Result<(), QueueError> {
        let done = transaction::run(|| {
            Spi::connect_mut(|client| {
                client.update(self.note_unusable_endpoints.as_str(), None, &[names.to_vec().into(), reasons.to_vec().into()])?;
                Ok(())
            })
        });
        done.map_err(|e| self.failure(e))
    }

    fn delete_expired(&mut self, retention: Option<Duration>, dead_retention: Option<Duration>, limit: usize) -> Result<usize, QueueError> {
        let deleted = transaction::run(|| {
            Spi::connect_mut(|client| {
                let args = [retention.map(millis).into(), (limit as i64).into(), dead_retention.map(millis).into()];
                let (deleted, events) = client.update(self.delete_expired.as_str(), None, &args)?.first().get_two::<i64, Vec<i64>>()?;
                let events = events.unwrap_or_default();
                if !events.is_empty() {
                    client.update(self.delete_emptied_events.as_str(), None, &[events.into()])?;
                }
                Ok(deleted.unwrap_or(0) as usize)
            })
        });
        deleted.map_err(|e| self.failure(e))
    }

    fn log_lease(&mut self, fence: i64, lease: Duration) -> Result<Option<LogLease>, QueueError> {
        let leased = transaction::run(|| {
            Spi::connect_mut(|client| {
                let rows = client.update(self.log.lease.as_str(), None, &[fence.into(), millis(lease).into()])?;
                if rows.is_empty() {
                    return Ok(None);
                }
                let (fence, state) = rows.first().get_two::<i64, String>()?;
                Ok(fence.map(|fence| LogLease { fence, slot_ready: state.as_deref() == Some("ready") }))
            })
        });
        leased.map_err(|e| self.failure(e))
    }

    /// `select`, not `update`: pgrx gives the transaction an id before an update, and a slot
    /// cannot be made (nor, to be safe, read) in a transaction that has one.
    ///
    /// Durable before the slot is read: the slot is on disk as soon as it is made, and were
    /// the commit that marks it recovering lost in a crash, what it does not hold would never
    /// be recovered.
    fn log_make_slot(&mut self, fence: i64) -> Result<bool, QueueError> {
        let made = transaction::run(|| {
            commit_durably();
            Spi::connect(|client| client.select(self.log.make_slot.as_str(), None, &[fence.into()])?.first().get_one::<bool>())
        });
        made.map(|made| made.unwrap_or(false)).map_err(|e| self.failure(e))
    }

    fn log_recover(&mut self, fence: i64) -> Result<i64, QueueError> {
        let made = transaction::run(|| {
            Spi::connect_mut(|client| client.update(self.log.recover.as_str(), None, &[fence.into()])?.first().get_one::<i64>())
        });
        made.map(|made| made.unwrap_or(0)).map_err(|e| self.failure(e))
    }

    fn log_read(&mut self, fence: i64, max_changes: i32, _after: u64) -> Result<Option<LogRows>, QueueError> {
        let read = transaction::run(|| {
            Spi::connect(|client| {
                decode_quietly();
                let mut messages = Vec::new();
                for row in client.select(self.log.read.as_str(), None, &[fence.into(), max_changes.into()])? {
                    match row.get::<Vec<u8>>(1)? {
                        Some(message) => messages.push(message),
                        // The last row, with no message, says where the read began; none: not
                        // the reader.
                        None => {
                            let (oldest, began_at, flushed_at, endpoints_version) =
                                (row.get(2)?.unwrap_or(0), row.get(3)?.unwrap_or(0), row.get(4)?.unwrap_or(0), row.get(5)?.unwrap_or(0));
                            let log_relation = row.get::<i64>(6)?.unwrap_or(0) as u32;
                            return Ok(Some(LogRows { messages, oldest, began_at, flushed_at, endpoints_version, log_relation }));
                        }
                    }
                }
                Ok(None)
            })
        });
        read.map_err(|e| self.failure(e))
    }

    fn log_route(&mut self, topics: &[String]) -> Result<Vec<TopicRoute>, QueueError> {
        let routes = transaction::run(|| {
            Spi::connect(|client| {
                let mut routes = Vec::new();
                for row in client.select(self.log.route.as_str(), None, &[topics.to_vec().into()])? {
                    routes.push(TopicRoute {
                        topic: row.get(1)?.unwrap_or_default(),
                        endpoint: row.get(2)?.unwrap_or_default(),
                        sendable: row.get(3)?.unwrap_or(false),
                        ordered: row.get(4)?.unwrap_or(false),
                    });
                }
                Ok(routes)
            })
        });
        routes.map_err(|e| self.failure(e))
    }

    /// Durable before the slot is confirmed past these events: a slot's position is written to
    /// disk apart from the WAL, and would outlast a copy lost in a crash.
    fn log_defer(&mut self, deferrals: &Deferrals) -> Result<i64, QueueError> {
        let made = transaction::run(|| {
            commit_durably();
            Spi::connect_mut(|client| {
                let args = [
                    deferrals.ids.clone().into(),
                    deferrals.topics.clone().into(),
                    deferrals.payloads.clone().into(),
                    deferrals.keys.clone().into(),
                    deferrals.created.clone().into(),
                    deferrals.endpoints.clone().into(),
                    deferrals.attempts.clone().into(),
                    deferrals.errors.clone().into(),
                    deferrals.due_in_ms.clone().into(),
                ];
                client.update(self.log.defer.as_str(), None, &args)?.first().get_one::<i64>()
            })
        });
        made.map(|made| made.unwrap_or(0)).map_err(|e| self.failure(e))
    }

    /// Then logs the running transactions, as the bgwriter does every 15 s, but at most once per
    /// `STANDBY_SNAPSHOT_EVERY`: each read decodes the WAL from the slot's restart position,
    /// which moves up only past such a record, so without it every read would decode up to
    /// 15 s of WAL again.
    fn log_confirm(&mut self, fence: i64, end: u64, oldest: i64) -> Result<bool, QueueError> {
        let confirmed = transaction::run(|| {
            Spi::connect(|client| {
                decode_quietly();
                let args = [fence.into(), (end as i64).into(), oldest.into()];
                // select, not update, although it writes: pgrx's update gives the transaction an
                // id before the statement runs, and back in table mode outbox_log_confirm takes
                // its own only after looking at the other sessions' snapshots.
                client.select(self.log.confirm.as_str(), None, &args)?.first().get_one::<bool>()
            })
        });
        let confirmed = confirmed.map(|confirmed| confirmed.unwrap_or(false)).map_err(|e| self.failure(e))?;
        if confirmed && self.log_standby_snapshot_at.is_none_or(|at| at.elapsed() >= STANDBY_SNAPSHOT_EVERY) {
            self.log_standby_snapshot_at = Some(Instant::now());
            // In a transaction of its own, so that an ERROR comes back here.
            transaction::run(|| {
                // SAFETY: writes one WAL record of the running transactions, as the bgwriter
                // and CHECKPOINT do.
                unsafe { pg_sys::LogStandbySnapshot() };
                Ok(())
            })
            .map_err(|e| self.failure(e))?;
        }
        Ok(confirmed)
    }

    fn log_maintain(&mut self) -> Result<i32, QueueError> {
        let changed =
            transaction::run(|| Spi::connect_mut(|client| client.update(self.log.maintain.as_str(), None, &[])?.first().get_one::<i32>()));
        changed.map(|changed| changed.unwrap_or(0)).map_err(|e| self.failure(e))
    }
}
