//! The launcher: one background worker, connected to no database, that starts the relay
//! workers once the database they serve exists, starts again any that stopped, and starts
//! none while that database is missing or being dropped. A missing database is waited for
//! quietly (one log line), not retried with a FATAL every few seconds.

use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;

use super::{registry, transaction, wake};
use crate::settings;

/// How often the launcher looks for the database and at its workers when nothing woke it.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A relay worker that stopped is started again, but not sooner than this after its last start.
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// Registers the launcher; called from `_PG_init` while shared_preload_libraries is processed.
pub fn register() {
    if settings::workers() == 0 {
        return;
    }
    BackgroundWorkerBuilder::new("outbox_ext launcher")
        .set_type("outbox_ext launcher")
        .set_library("outbox_ext")
        .set_function("outbox_launcher_main")
        .enable_spi_access()
        .set_restart_time(Some(RESTART_AFTER))
        .load();
}

/// One relay worker the launcher looks after.
struct Relay {
    handle: Option<DynamicBackgroundWorker>,
    started_at: Option<Instant>,
    /// Said that no background worker slot was free; said again only after a start succeeded.
    said_no_slot: bool,
}

#[pg_guard]
// SAFETY: an exported name of this library's own, which PostgreSQL looks up by name.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher reads only the shared catalog pg_database, so it never stands
    // in the way of DROP DATABASE.
    BackgroundWorker::connect_worker_to_spi(None, None);
    let database = settings::database();
    let mut relays: Vec<Relay> = (0..settings::workers()).map(|_| Relay { handle: None, started_at: None, said_no_slot: false }).collect();
    let mut waiting_said = false;
    log!("outbox_ext launcher started for database \"{database}\"");
    while !BackgroundWorker::sigterm_received() {
        if !database_exists(&database) {
            if !waiting_said {
                log!("outbox_ext launcher: waiting for database \"{database}\" (outbox.database)");
                waiting_said = true;
            }
        } else if !registry::leaving_database() {
            waiting_said = false;
            for (index, relay) in relays.iter_mut().enumerate() {
                start_if_stopped(relay, index + 1);
            }
        }
        // Woken early by a relay worker that stops (the postmaster notifies the launcher).
        wake::wait(None, CHECK_EVERY);
    }
    // Exit code 1: the postmaster starts a launcher stopped on its own (pg_terminate_backend)
    // again after RESTART_AFTER; at a server shutdown nothing is restarted anyway.
    // SAFETY: no transaction is open.
    unsafe { pg_sys::proc_exit(1) };
}

/// Whether the served database exists and takes connections. Read with a plain heap scan of the shared catalog
/// pg_database, as the autovacuum launcher reads it: a process connected to no database cannot
/// open its indexes before some backend has built the shared relcache file.
fn database_exists(name: &str) -> bool {
    transaction::run(|| {
        // SAFETY: inside the transaction `run` opened; the scan and the relation are closed
        // before it ends, and each tuple is read as pg_database's fixed-size part.
        unsafe {
            let relation = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
            let scan = pg_sys::table_beginscan_catalog(relation, 0, std::ptr::null_mut());
            let mut found = false;
            loop {
                let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
                if tuple.is_null() {
                    break;
                }
                let database = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
                if std::ffi::CStr::from_ptr((*database).datname.data.as_ptr()).to_bytes() == name.as_bytes() {
                    // One that refuses connections, or that an interrupted DROP DATABASE left
                    // invalid (datconnlimit -2), counts as missing: a worker could not connect.
                    found = (*database).datallowconn && (*database).datconnlimit != -2;
                    break;
                }
            }
            pg_sys::table_endscan(scan);
            pg_sys::table_close(relation, pg_sys::AccessShareLock as _);
            Ok(found)
        }
    })
    .unwrap_or(false)
}

fn start_if_stopped(relay: &mut Relay, number: usize) {
    let started_here =
        relay.handle.as_ref().is_some_and(|handle| matches!(handle.pid(), Ok(_) | Err(BackgroundWorkerStatus::NotYetStarted)));
    // A relay that an earlier launcher started (before this one was restarted) still counts.
    let running = started_here || registry::live_worker(number).is_some();
    if running || relay.started_at.is_some_and(|at| at.elapsed() < RESTART_AFTER) {
        return;
    }
    // SAFETY: reads this process's own pid.
    let launcher = unsafe { pg_sys::MyProcPid };
    relay.started_at = Some(Instant::now());
    relay.handle = BackgroundWorkerBuilder::new(&format!("outbox_ext relay {number}"))
        .set_type("outbox_ext relay")
        .set_library("outbox_ext")
        .set_function("outbox_relay_main")
        .set_argument((number as i32).into_datum())
        .enable_spi_access()
        .set_notify_pid(launcher)
        .load_dynamic()
        .ok();
    match relay.handle {
        Some(_) => relay.said_no_slot = false,
        None if !relay.said_no_slot => {
            warning!("outbox_ext launcher: cannot start relay {number}: no free background worker slot (raise max_worker_processes)");
            relay.said_no_slot = true;
        }
        None => {}
    }
}
