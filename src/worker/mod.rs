//! The relay workers: background processes that claim due events, send them with no
//! transaction open, and record each outcome as it arrives.

pub mod launcher;
mod queue;
pub mod registry;
mod transaction;
pub mod utility_hook;
pub mod wake;

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;

pub use queue::Queries;
use registry::Found;

use crate::catalog::LIBRARY_VERSION;
use crate::majors;
use crate::settings::{self, Settings};
use outbox_core::delivery::{Attempt, Outcome};
use outbox_core::relay::{Asked, Commits, Ended, Level, Relay, Report, Wake};

#[pg_guard]
// SAFETY: an exported name of this library's own, which PostgreSQL looks up by name.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_relay_main(arg: pg_sys::Datum) {
    // SAFETY: the postmaster passes the int4 datum the launcher set: this worker's slot.
    let index = unsafe { i32::from_datum(arg, false) }.unwrap_or(0) as usize;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // "<database OID> <number>", as the launcher started it. By OID, which a RENAME keeps.
    let mut extra = BackgroundWorker::get_extra().split(' ').map(|part| part.parse::<u32>().unwrap_or(0));
    let (database, number) = (pg_sys::Oid::from(extra.next().unwrap_or(0)), extra.next().unwrap_or(0) as usize);
    // Read before connecting, which reads the database's settings (outbox.relay).
    let connected_as_of = registry::serving_changes();
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(database), None);
    let Some(slot) = registry::claim_slot(index, database, number) else {
        log!("outbox_ext relay {number}: not started: its slot went to another worker");
        // SAFETY: no transaction is open.
        unsafe { majors::exit_process(0) };
    };
    let mut worker = Worker {
        number,
        database,
        database_name: transaction::run(database_name).unwrap_or_default(),
        connected_as_of,
        slot,
        settings: settings::read(),
    };
    worker.note_settings_loaded();
    worker.run();
    // The launcher starts a stopped worker again, unless the server is shutting down, the
    // database is going away or has no outbox_ext.
    // SAFETY: no transaction is open; proc_exit runs PostgreSQL's exit callbacks.
    unsafe { majors::exit_process(0) };
}

/// One relay worker: finds the extension in its database, then runs the relay loop of
/// `outbox_core` on it, with SPI for the queue, its latch for waking and its registry slot
/// for the counters.
struct Worker {
    /// The worker's number within its database, from 1.
    number: usize,
    database: pg_sys::Oid,
    /// As it was named when the worker started, for the log.
    database_name: String,
    /// `registry::serving_changes()` before the worker connected.
    connected_as_of: u64,
    slot: &'static registry::WorkerSlot,
    settings: Settings,
}

impl Worker {
    fn run(&mut self) {
        if let Err(e) = queue::prepare_session() {
            error!("outbox_ext relay {}: cannot set up its session: {e}", self.number);
        }
        let mut served = false;
        while let Some(queries) = self.wait_for_extension(served) {
            if !served {
                log!("outbox_ext relay {} started in database \"{}\"", self.number, self.database_name);
                served = true;
            }
            // Only worker 1 deletes what retention expired; the others only deliver.
            let wake = WorkerWake {
                number: self.number,
                database: self.database,
                connected_as_of: self.connected_as_of,
                slot: self.slot,
                waiting: wake::DoorbellWait::new(),
            };
            let report = WorkerReport { number: self.number, slot: self.slot };
            let relay = Relay::new(queries, wake, report, self.settings.clone(), self.number == 1)
                .unwrap_or_else(|e| error!("outbox_ext relay {}: {e}", self.number));
            match relay.run() {
                Ended::Asked => return,
                Ended::Gone => {
                    // What was in flight belonged to rows that are gone: it was dropped.
                    self.slot.in_flight.store(0, Ordering::Relaxed);
                    // A reload read in the loop that just ended is in effect from here on.
                    self.settings = settings::read();
                    self.note_settings_loaded();
                }
            }
        }
    }

    /// Finds the extension in this database. Without it, or with `outbox.relay` off for this
    /// database, the worker reports so to the launcher
    /// and leaves (`None`; the launcher sends one again after a CREATE EXTENSION outbox_ext);
    /// saying so in the log only if it `served` the database before, since the launcher looks
    /// into every database. While the installed schema waits for ALTER EXTENSION UPDATE, or
    /// cannot be prepared, it waits quietly, saying once why. `None` on SIGTERM, or when the
    /// database is being dropped or renamed.
    fn wait_for_extension(&mut self, served: bool) -> Option<Queries> {
        if !settings::relay() {
            self.slot.report(Found::NoExtension, self.connected_as_of);
            // The launcher looks again every few minutes: at DEBUG1, not a line each time.
            debug1!("outbox_ext relay {}: not serving database \"{}\": outbox.relay is off there", self.number, self.database_name);
            return None;
        }
        let mut said = String::new();
        loop {
            if registry::leaving(self.database) {
                return None;
            }
            // Read before the lookup: a CREATE EXTENSION that commits after it counts above it.
            let as_of = registry::serving_changes();
            let reason = match queue::find_installation() {
                Ok(Some(installation)) => {
                    self.slot.report(Found::Extension, as_of);
                    if !installation.is_current() {
                        format!(
                            "waiting for ALTER EXTENSION outbox_ext UPDATE (its schema is version {}, this library {LIBRARY_VERSION})",
                            installation.version
                        )
                    } else {
                        let (version, schema) = (installation.version.clone(), installation.schema.clone());
                        match queue::prepare(installation) {
                            Ok(queries) => {
                                if !said.is_empty() {
                                    log!("outbox_ext relay {}: outbox_ext {version} found in schema {schema}", self.number);
                                }
                                return Some(queries);
                            }
                            Err(e) => format!("cannot prepare its statements: {e}"),
                        }
                    }
                }
                Ok(None) => {
                    self.slot.report(Found::NoExtension, as_of);
                    if served {
                        log!("outbox_ext relay {}: leaving database \"{}\", where outbox_ext was dropped", self.number, self.database_name);
                    }
                    return None;
                }
                Err(e) => format!("cannot look up the extension: {e}"),
            };
            if reason != said {
                log!("outbox_ext relay {}: {reason}", self.number);
                said = reason;
            }
            // A commit ends the wait: the first enqueue after ALTER EXTENSION UPDATE.
            self.slot.set_wakes_on_commit(true);
            wake::wait(self.settings.poll_interval);
            if BackgroundWorker::sigterm_received() {
                return None;
            }
            if BackgroundWorker::sighup_received() {
                reload_configuration();
                self.settings = settings::read();
                self.note_settings_loaded();
            }
        }
    }

    fn note_settings_loaded(&self) {
        note_settings_loaded(self.slot);
    }
}

/// The worker's way of waiting: its latch, which enqueuing commits set, and its signals.
struct WorkerWake {
    number: usize,
    database: pg_sys::Oid,
    connected_as_of: u64,
    slot: &'static registry::WorkerSlot,
    waiting: wake::DoorbellWait,
}

impl Wake for WorkerWake {
    /// Setting a latch costs a committer next to nothing: backlog or not.
    /// Commits into the table path that did not wake the worker are noted in its slot: a
    /// claim is due at once only if there were any (in log mode, mostly none).
    fn listen(&mut self, can_claim: bool, _backlog: bool, reads_log: bool) -> bool {
        self.slot.set_wakes_on_log(reads_log);
        self.slot.set_wakes_on_commit(can_claim) && self.slot.table_commit_noted()
    }

    fn wait(&mut self, doorbell: RawFd, timeout: Duration) -> Commits {
        // Background workers must report their table statistics themselves; without this,
        // autovacuum never learns of the dead rows that claims and acknowledgements leave.
        // SAFETY: main thread, no transaction open.
        unsafe { pg_sys::pgstat_report_stat(false) };
        self.waiting.wait(doorbell, timeout);
        let wrote = self.slot.take_commits();
        Commits { table: wrote & registry::COMMITTED_TABLE != 0, log: wrote & registry::COMMITTED_LOG != 0 }
    }

    /// SIGTERM; a DROP DATABASE or RENAME of this database waiting for the workers; or
    /// `outbox.relay` turned off, or perhaps changed for this database since the worker
    /// connected (it reads a database's settings only then): exit, and let the launcher start
    /// a worker that reads them afresh. Then SIGHUP.
    fn asked(&mut self) -> Asked {
        if registry::leaving(self.database) {
            log!("outbox_ext relay {}: leaving its database, which is being dropped or renamed", self.number);
            return Asked::Leave;
        }
        if BackgroundWorker::sigterm_received() || !settings::relay() {
            return Asked::Stop;
        }
        if registry::settings_changed_in(self.database) > self.connected_as_of {
            log!("outbox_ext relay {}: outbox.relay was set for its database; restarting to read it", self.number);
            return Asked::Stop;
        }
        if BackgroundWorker::sighup_received() {
            reload_configuration();
            return Asked::Reload(Box::new(settings::read()));
        }
        Asked::Nothing
    }
}

/// What the worker counts goes to its registry slot, which `outbox_workers()` and the
/// monitoring functions read; what it says goes to the server log.
struct WorkerReport {
    number: usize,
    slot: &'static registry::WorkerSlot,
}

impl Report for WorkerReport {
    fn finished(&mut self, attempts: &[Attempt]) {
        let delivered = attempts.iter().filter(|a| a.outcome == Outcome::Delivered).count();
        self.slot.delivered.fetch_add(delivered as i64, Ordering::Relaxed);
        self.slot.failed.fetch_add((attempts.len() - delivered) as i64, Ordering::Relaxed);
        for attempt in attempts {
            self.slot.attempts[attempt.outcome.class() as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn in_flight(&mut self, requests: usize) {
        self.slot.in_flight.store(requests as i64, Ordering::Relaxed);
    }

    fn claimed(&mut self, _took: Duration) {}

    fn settings_loaded(&mut self) {
        note_settings_loaded(self.slot);
    }

    fn log(&mut self, level: Level, text: &str) {
        match level {
            Level::Log => log!("outbox_ext relay {}: {text}", self.number),
            Level::Warning => warning!("outbox_ext relay {}: {text}", self.number),
        }
    }
}

/// Publishes when the worker's settings were read.
fn note_settings_loaded(slot: &registry::WorkerSlot) {
    // SAFETY: reads the clock; no PostgreSQL state involved.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    slot.settings_loaded_at.store(now, Ordering::Relaxed);
}

fn reload_configuration() {
    // SAFETY: main thread, outside a transaction, as PostgreSQL's own SIGHUP handling does.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// The name of the worker's database.
fn database_name() -> Result<String, pgrx::spi::SpiError> {
    // SAFETY: inside a transaction, as get_database_name's catalog lookup needs; it returns a
    // palloc'd copy or null.
    let name = unsafe { pg_sys::get_database_name(pg_sys::MyDatabaseId) };
    Ok(if name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string, just returned.
        unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
    })
}
