//! The SQL functions written in Rust. The rest of the API is plain SQL in `sql/api.sql`.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::pgrx_sql_entity_graph::metadata::{ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};
use pgrx::PgSqlErrorCode::{self, ERRCODE_INVALID_PARAMETER_VALUE, ERRCODE_NULL_VALUE_NOT_ALLOWED};

use crate::catalog::{Installation, LIBRARY_VERSION};
use crate::settings::{DELIVER_AT_HORIZON_S, MAX_PAYLOAD_BYTES};
use crate::worker::{registry, wake};
use outbox_core::delivery::OutcomeClass;

/// The longest topic `outbox_enqueue` accepts, in bytes.
const MAX_TOPIC_BYTES: usize = 255;

/// Enqueues one event in the caller's transaction, with one delivery per endpoint whose topics
/// match, and returns its id. The workers are woken when (and only if) the transaction commits.
///
/// It runs as the extension's owner: a role needs only EXECUTE on it, and can write nothing
/// but a checked event through it. Declared in `sql/api.sql`; its statements are
/// `sql/enqueue.sql` (in log mode `sql/enqueue_log.sql`) and `sql/route.sql`, and when needed
/// `sql/note_unrouted.sql`, `sql/note_key_arrivals.sql`, `sql/notify_endpoints.sql` and
/// `sql/hold_routed_endpoints.sql`.
#[pg_extern(sql = false)]
fn enqueue(topic: Option<&str>, payload: Option<JsonbArg>, key: Option<&str>, deliver_at: Option<TimestampWithTimeZone>) -> i64 {
    let topic = match topic {
        None => reject(ERRCODE_NULL_VALUE_NOT_ALLOWED, "outbox_enqueue: topic must not be null".into()),
        Some(t) if t.trim().is_empty() => reject(ERRCODE_INVALID_PARAMETER_VALUE, "outbox_enqueue: topic must not be empty".into()),
        Some(t) if t.len() > MAX_TOPIC_BYTES => {
            reject(ERRCODE_INVALID_PARAMETER_VALUE, format!("outbox_enqueue: topic is {} bytes, more than {MAX_TOPIC_BYTES}", t.len()))
        }
        Some(t) => t,
    };
    let Some(payload) = payload else {
        reject(ERRCODE_NULL_VALUE_NOT_ALLOWED, "outbox_enqueue: payload must not be null (use '{}' for an event without data)".into())
    };
    let limit = MAX_PAYLOAD_BYTES.get() as usize;
    let size = payload.text_len();
    if size > limit {
        reject(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("outbox_enqueue: payload is {size} bytes of JSON text, more than outbox.max_payload_bytes ({limit} bytes)"),
        )
    }
    if key.is_some_and(|k| k.len() > MAX_TOPIC_BYTES) {
        reject(ERRCODE_INVALID_PARAMETER_VALUE, format!("outbox_enqueue: key is longer than {MAX_TOPIC_BYTES} bytes"))
    }
    if deliver_at.is_some_and(|at| !at.is_finite()) {
        reject(ERRCODE_INVALID_PARAMETER_VALUE, "outbox_enqueue: deliver_at must be a finite time (null: now)".into())
    }
    // A scheduled delivery is kept until it is due, and on an ordered endpoint holds its key.
    let horizon_s = DELIVER_AT_HORIZON_S.get();
    // SAFETY: reads the start time of the caller's transaction, which now() returns.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    if deliver_at.is_some_and(|at| pg_sys::TimestampTz::from(at) > now.saturating_add(i64::from(horizon_s) * 1_000_000)) {
        reject(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("outbox_enqueue: deliver_at is more than outbox.deliver_at_horizon ({horizon_s} s) from now"),
        )
    }
    let (id, logged) = insert_event(topic, payload, key, deliver_at);
    wake::wake_workers_at_commit(logged);
    id
}

/// 0.1.0's `outbox_enqueue(text, jsonb)` points here until `ALTER EXTENSION outbox_ext UPDATE`
/// replaces it: the caller's transaction aborts with nothing written and is told what to run.
#[pg_guard]
// SAFETY: an exported name of this library's own, which PostgreSQL looks up by name.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_enqueue_wrapper(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("outbox_enqueue: the installed library is outbox_ext {LIBRARY_VERSION}, the schema of this database is older"),
        "Run ALTER EXTENSION outbox_ext UPDATE in this database."
    );
}

// SAFETY: an exported name of this library's own, which PostgreSQL looks up by name.
#[unsafe(no_mangle)]
pub extern "C" fn pg_finfo_outbox_enqueue_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// Raises an ERROR (SQLSTATE class 22): the caller's transaction aborts with nothing written.
fn reject(code: PgSqlErrorCode, message: String) -> ! {
    ereport!(ERROR, code, message);
}

/// One row per relay worker running in this database: what an operator checks after a reload
/// or when deliveries stall. Counters start from zero when the worker (re)starts.
/// Declared in `sql/api.sql`.
#[pg_extern(sql = false)]
fn outbox_workers() -> TableIterator<
    'static,
    (
        name!(worker, i32),
        name!(pid, i32),
        name!(settings_loaded_at, TimestampWithTimeZone),
        name!(in_flight, i64),
        name!(delivered, i64),
        name!(failed, i64),
    ),
> {
    use std::sync::atomic::Ordering::Relaxed;
    let rows: Vec<_> = registry::slots_of(registry::my_database())
        .filter(|slot| slot.running_procno().is_some())
        .map(|slot| {
            // SAFETY: the slot holds a PostgreSQL timestamp written by GetCurrentTimestamp; a
            // timestamptz datum is that int64 by value.
            let loaded_at = unsafe { TimestampWithTimeZone::from_datum(slot.settings_loaded_at.load(Relaxed).into(), false) };
            (
                slot.number() as i32,
                slot.pid.load(Relaxed),
                loaded_at.unwrap_or_else(|| error!("outbox_workers: bad timestamp")),
                slot.in_flight.load(Relaxed),
                slot.delivered.load(Relaxed),
                slot.failed.load(Relaxed),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Attempts per relay worker of this database and outcome class since the server started,
/// for monitoring: counters that never go backwards while the server runs (a worker that
/// restarts keeps its slot's counts). Every class of every worker that ran is listed, zeros
/// included, so that a series exists before its first attempt. Declared in `sql/api.sql`.
#[pg_extern(sql = false)]
fn outbox_worker_attempts() -> TableIterator<'static, (name!(worker, i32), name!(outcome, String), name!(attempts, i64))> {
    use std::sync::atomic::Ordering::Relaxed;
    let rows: Vec<_> = registry::slots_of(registry::my_database())
        .filter(|slot| slot.running_procno().is_some() || slot.attempts.iter().any(|n| n.load(Relaxed) > 0))
        .flat_map(|slot| {
            OutcomeClass::ALL
                .iter()
                .map(move |class| (slot.number() as i32, class.label().to_string(), slot.attempts[*class as usize].load(Relaxed)))
        })
        .collect();
    TableIterator::new(rows)
}

/// Events enqueued in this database by transactions that committed, since the server started. Declared in
/// `sql/api.sql`.
#[pg_extern(sql = false)]
fn outbox_enqueued() -> i64 {
    registry::enqueued(registry::my_database())
}

/// The statements of `outbox_enqueue`, prepared once per session against the extension's own
/// tables, whatever the caller's search_path.
struct EnqueueStatements {
    /// The `outbox` table and the schema they were prepared for: after DROP and CREATE
    /// EXTENSION (perhaps in another schema) the table is another, and they are prepared
    /// again. Checked in the system cache; finding the extension each call took a catalog
    /// scan.
    outbox: pg_sys::Oid,
    namespace: pg_sys::Oid,
    /// outbox_log_state's, or InvalidOid in a schema from before log mode (0.2.0, until ALTER
    /// EXTENSION UPDATE): they are prepared again once it has log mode.
    log_state: pg_sys::Oid,
    insert_event: OwnedPreparedStatement,
    /// None in a schema from before log mode.
    insert_logged: Option<OwnedPreparedStatement>,
    route: OwnedPreparedStatement,
    note_unrouted: OwnedPreparedStatement,
    note_key_arrivals: OwnedPreparedStatement,
    notify_endpoints: OwnedPreparedStatement,
    hold_routed_endpoints: OwnedPreparedStatement,
}

impl EnqueueStatements {
    fn prepare(client: &mut SpiClient<'_>) -> EnqueueStatements {
        let installation = Installation::find(client)
            .ok()
            .flatten()
            .unwrap_or_else(|| error!("outbox_enqueue: the outbox_ext extension is not installed in this database"));
        let prepare = |sql: &str, types: &[pg_sys::PgOid]| {
            client
                .prepare_mut(installation.qualify(sql).as_str(), types)
                .unwrap_or_else(|e| error!("outbox_enqueue: cannot prepare its statements: {e}"))
                .keep()
        };
        let (text, jsonb, bigint, timestamptz, text_array) = (
            pg_sys::TEXTOID.into(),
            pg_sys::JSONBOID.into(),
            pg_sys::INT8OID.into(),
            pg_sys::TIMESTAMPTZOID.into(),
            pg_sys::TEXTARRAYOID.into(),
        );
        // SAFETY: system cache look-ups by name, inside the caller's transaction.
        let (outbox, log_state) = unsafe {
            (
                pg_sys::get_relname_relid(c"outbox".as_ptr(), installation.namespace),
                pg_sys::get_relname_relid(c"outbox_log_state".as_ptr(), installation.namespace),
            )
        };
        let (insert_event, insert_logged) = if log_state == pg_sys::InvalidOid {
            (ENQUEUE_BEFORE_LOG_MODE, None)
        } else {
            (include_str!("../sql/enqueue.sql"), Some(prepare(include_str!("../sql/enqueue_log.sql"), &[text, jsonb, text, timestamptz])))
        };
        EnqueueStatements {
            insert_event: prepare(insert_event, &[text, jsonb, text, timestamptz, pg_sys::BOOLOID.into()]),
            insert_logged,
            route: prepare(include_str!("../sql/route.sql"), &[bigint, text, text, timestamptz]),
            note_unrouted: prepare(include_str!("../sql/note_unrouted.sql"), &[bigint]),
            note_key_arrivals: prepare(include_str!("../sql/note_key_arrivals.sql"), &[text_array, text]),
            notify_endpoints: prepare(include_str!("../sql/notify_endpoints.sql"), &[text_array]),
            hold_routed_endpoints: prepare(include_str!("../sql/hold_routed_endpoints.sql"), &[text_array]),
            outbox,
            namespace: installation.namespace,
            log_state,
        }
    }

    fn are_current(&self) -> bool {
        // SAFETY: system cache look-ups, inside the caller's transaction; an OID that names
        // no relation gives InvalidOid.
        self.outbox != pg_sys::InvalidOid
            && unsafe { pg_sys::get_rel_namespace(self.outbox) } == self.namespace
            && (self.log_state != pg_sys::InvalidOid
                || unsafe { pg_sys::get_relname_relid(c"outbox_log_state".as_ptr(), self.namespace) } == pg_sys::InvalidOid)
    }
}

/// sql/enqueue.sql for a schema from before log mode: the event into outbox, always. It is
/// prepared with sql/enqueue.sql's arguments and leaves the last two unused.
const ENQUEUE_BEFORE_LOG_MODE: &str = "INSERT INTO @extschema@.outbox (topic, payload, key) VALUES ($1, $2, $3) RETURNING id";

thread_local! {
    static ENQUEUE: std::cell::RefCell<Option<EnqueueStatements>> = const { std::cell::RefCell::new(None) };
    /// Where this session's last event went (true: the log). Its next one is tried there
    /// first, so that an enqueue runs one statement in either mode.
    static LAST_LOGGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Writes the event and its deliveries; returns the event's id, and whether it went into the
/// log (log mode: no deliveries written). Each step after the first runs
/// only when it has something to do: an event that matched no endpoint is noted as unrouted,
/// waiting deliveries of ordered endpoints are made known to the sequencer, endpoints with
/// `notify` are notified, and a transaction that reads from one snapshot locks the endpoints it
/// routed to, failing if they were dropped or changed since that snapshot.
fn insert_event(topic: &str, payload: JsonbArg, key: Option<&str>, deliver_at: Option<TimestampWithTimeZone>) -> (i64, bool) {
    let fail = |what: &str, e: pgrx::spi::SpiError| -> ! { error!("outbox_enqueue: {what}: {e}") };
    ENQUEUE.with(|cell| {
        let mut cached = cell.borrow_mut();
        Spi::connect_mut(|client| {
            if !cached.as_ref().is_some_and(EnqueueStatements::are_current) {
                *cached = Some(EnqueueStatements::prepare(client));
            }
            let statements = cached.as_ref().expect("prepared above");
            // Each statement reads the mode itself and writes nothing in the other; the table
            // takes the event whatever the mode once the log did not.
            // The id, and whether an outbox relay listens for the commit (a schema from before
            // log mode has none).
            let first_id = |inserted: Result<pgrx::spi::SpiTupleTable, _>| -> Option<(i64, bool)> {
                let rows = inserted.unwrap_or_else(|e| fail("insert failed", e));
                if rows.is_empty() {
                    return None;
                }
                let row = rows.first();
                let id = row.get::<i64>(1).unwrap_or_else(|e| fail("insert failed", e))?;
                Some((id, row.get::<bool>(2).ok().flatten() == Some(true)))
            };
            let into_table = |client: &mut SpiClient<'_>, whatever_the_mode: bool| {
                let args = [topic.into(), payload.into(), key.into(), deliver_at.into(), whatever_the_mode.into()];
                first_id(client.update(&statements.insert_event, None, &args))
            };
            let into_log = |client: &mut SpiClient<'_>| {
                let logged = statements.insert_logged.as_ref()?;
                first_id(client.update(logged, None, &[topic.into(), payload.into(), key.into(), deliver_at.into()]))
            };
            let first_try = if LAST_LOGGED.get() {
                into_log(client).map(|inserted| (inserted, true))
            } else {
                into_table(client, false).map(|inserted| (inserted, false)).or_else(|| into_log(client).map(|inserted| (inserted, true)))
            };
            let ((id, relay_listens), logged) = first_try
                .unwrap_or_else(|| (into_table(client, true).unwrap_or_else(|| error!("outbox_enqueue: insert returned no id")), false));
            LAST_LOGGED.set(logged);
            if relay_listens {
                notify_relays();
            }
            if logged {
                // Log mode: the relay routes the event when it reads it from the slot.
                return (id, true);
            }
            let routed = client
                .update(&statements.route, None, &[id.into(), topic.into(), key.into(), deliver_at.into()])
                .unwrap_or_else(|e| fail("routing failed", e));
            let deliveries = routed.len();
            let one_snapshot = uses_one_snapshot();
            let (mut waiting, mut notify, mut routed_to) = (Vec::new(), Vec::new(), Vec::new());
            for row in routed {
                let endpoint =
                    || row.get::<String>(1).ok().flatten().unwrap_or_else(|| error!("outbox_enqueue: a delivery without an endpoint"));
                if row.get::<bool>(2).ok().flatten() == Some(true) {
                    waiting.push(endpoint());
                }
                if row.get::<bool>(3).ok().flatten() == Some(true) {
                    notify.push(endpoint());
                }
                if one_snapshot {
                    routed_to.push(endpoint());
                }
            }
            if deliveries == 0 {
                client
                    .update(&statements.note_unrouted, None, &[id.into()])
                    .unwrap_or_else(|e| fail("cannot note the event as unrouted", e));
            }
            if !waiting.is_empty() {
                client
                    .update(&statements.note_key_arrivals, None, &[waiting.into(), key.into()])
                    .unwrap_or_else(|e| fail("cannot note the key for the sequencer", e));
            }
            if !notify.is_empty() {
                client.update(&statements.notify_endpoints, None, &[notify.into()]).unwrap_or_else(|e| fail("cannot notify", e));
            }
            if !routed_to.is_empty() {
                client
                    .update(&statements.hold_routed_endpoints, None, &[routed_to.into()])
                    .unwrap_or_else(|e| fail("cannot hold the endpoints it routed to", e));
            }
            (id, false)
        })
    })
}

/// Wakes the `outbox relay` processes that listen (cli/src/wake.rs) when the transaction
/// commits, as the SQL install's outbox_enqueue does: they cannot be woken through shared
/// memory as the workers are. A notification repeated in a transaction is sent once.
fn notify_relays() {
    // SAFETY: pg_notify(text, text), called with two text datums, as SQL would call it.
    unsafe {
        pgrx::fcinfo::direct_function_call_as_datum(pg_sys::pg_notify, &["outbox_enqueued".into_datum(), "".into_datum()]);
    }
}

/// Whether the caller's transaction reads from one snapshot (REPEATABLE READ or SERIALIZABLE):
/// then the locks of outbox_endpoint_drop and outbox_endpoint_set do not keep it from routing
/// by an endpoint as it was before they committed.
fn uses_one_snapshot() -> bool {
    // SAFETY: a backend global, set for the current transaction.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// A jsonb argument passed through as the caller gave it: enqueue stores the datum without
/// turning it into a Rust value and back.
#[derive(Clone, Copy)]
pub struct JsonbArg(pg_sys::Datum);

impl JsonbArg {
    /// Length of the payload's JSON text, the form the receiver gets.
    fn text_len(&self) -> usize {
        // SAFETY: self.0 is the caller's non-null jsonb argument, valid for this call; jsonb_out
        // returns a palloc'd NUL-terminated string in the current memory context.
        let text = unsafe { pgrx::fcinfo::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(self.0)]) };
        text.map(|t| t.to_bytes().len()).unwrap_or(0)
    }
}

impl FromDatum for JsonbArg {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<JsonbArg> {
        (!is_null).then_some(JsonbArg(datum))
    }
}

impl IntoDatum for JsonbArg {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: the SQL type named is jsonb, the type of the datum JsonbArg carries.
unsafe impl SqlTranslatable for JsonbArg {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbArg);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin = pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

// SAFETY: both methods read the argument through FromDatum, as pgrx's own types do.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbArg {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: the caller (pgrx's generated wrapper) passes an argument of this function.
        unsafe { arg.unbox_arg_using_from_datum().unwrap_or_else(|| panic!("argument {index} must not be null")) }
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: as above.
        unsafe { arg.unbox_arg_using_from_datum().into() }
    }
}
