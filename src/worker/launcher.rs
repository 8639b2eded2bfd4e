//! The launcher: one background worker, connected to no database, that serves every database
//! of the cluster where outbox_ext is installed (or only `outbox.database`, if set), as
//! TimescaleDB's launcher does. Each second, and whenever a relay worker stops or a CREATE
//! EXTENSION outbox_ext commits, it reads the shared catalog pg_database and:
//!
//! - sends one relay worker to each database it has not looked into yet (a probe): the worker
//!   stays and serves if it finds the extension, and leaves, saying so, if it does not;
//! - starts the other `outbox.workers - 1` workers of a database where the extension was found,
//!   and starts again any that stopped;
//! - looks again into a database it did not serve once a CREATE EXTENSION outbox_ext commits
//!   there, or an ALTER DATABASE … SET or RESET outbox.relay for it (a new database, e.g.
//!   copied from a template that has the extension, is looked into as new), and into every
//!   such database after a reload and every five minutes, for changes no hook sees;
//! - starts nothing in a database being dropped or renamed (see `utility_hook`), and forgets
//!   what it knew of a database once it is gone.
//!
//! A restriction to a database that does not exist is waited for quietly (one log line).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, DynamicBackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys::Oid;
use pgrx::prelude::*;

use super::registry::{self, Found};
use super::{transaction, wake};
use crate::{majors, settings};

/// How often the launcher looks at the databases and at its workers when nothing woke it.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A relay worker that stopped is started again, but not sooner than this after its last start.
const RESTART_AFTER: Duration = Duration::from_secs(5);
/// Databases looked into at once, so that a cluster of many databases does not take every
/// background worker slot (parallel queries use them too) when the server starts.
const PROBES_AT_ONCE: usize = 2;
/// A probe that has not reported after this long (e.g. it waits to connect to a database an
/// open transaction is renaming) no longer holds up the others.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a database found without the extension is looked into again anyway.
const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(300);

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

#[pg_guard]
// SAFETY: an exported name of this library's own, which PostgreSQL looks up by name.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher reads only the shared catalog pg_database, so it never stands
    // in the way of DROP DATABASE.
    BackgroundWorker::connect_worker_to_spi(None, None);
    // SAFETY: MyProc is this process's own PGPROC.
    registry::publish_launcher(Some(unsafe { majors::my_proc_number() }));
    let mut launcher = Launcher::new(settings::database());
    match &launcher.restriction {
        Some(name) => log!("outbox_ext launcher started for database \"{name}\" (outbox.database)"),
        None => log!("outbox_ext launcher started for every database where outbox_ext is installed"),
    }
    while !BackgroundWorker::sigterm_received() {
        if BackgroundWorker::sighup_received() {
            launcher.look_again();
        }
        if let Some(catalog) = read_pg_database() {
            launcher.look_after(&catalog);
        }
        // Woken early by a relay worker that stops (the postmaster notifies the launcher) and
        // by a commit that may make a database one to serve.
        wake::wait(CHECK_EVERY);
    }
    registry::publish_launcher(None);
    // Exit code 1: the postmaster starts a launcher stopped on its own (pg_terminate_backend)
    // again after RESTART_AFTER; at a server shutdown nothing is restarted anyway.
    // SAFETY: no transaction is open.
    unsafe { majors::exit_process(1) };
}

/// A row of pg_database, as far as the launcher cares.
struct CatalogDatabase {
    oid: Oid,
    name: String,
    /// Takes connections: not a template, connections allowed, not left invalid by an
    /// interrupted DROP DATABASE.
    servable: bool,
}

/// What the launcher knows of a database's extension.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Extension {
    /// Not looked into yet (or again): one worker goes to see.
    Unknown,
    Installed,
    /// Not installed (or `outbox.relay` is off there), as of that many `serving_changes()`,
    /// found then.
    Absent {
        as_of: u64,
        since: Instant,
    },
}

struct Launcher {
    /// `outbox.database`, if set: the only database served.
    restriction: Option<String>,
    databases: HashMap<Oid, Extension>,
    /// Workers this launcher started, by (database, number), and when.
    started: HashMap<(Oid, usize), (Option<DynamicBackgroundWorker>, Instant)>,
    /// Databases with a shared-memory entry that were missing from pg_database at the last look:
    /// forgotten if still missing now (a database created since the catalog was read would
    /// otherwise lose the entry its first commits made).
    missing_once: HashSet<Oid>,
    /// When the launcher last got a SIGHUP: a probe started before it may have read an
    /// `outbox.relay` that the reload changed.
    reloaded_at: Option<Instant>,
    said_waiting: bool,
    said_no_worker_slot: bool,
    said_no_registry_slot: bool,
}

impl Launcher {
    fn new(restriction: String) -> Launcher {
        Launcher {
            restriction: (!restriction.is_empty()).then_some(restriction),
            databases: HashMap::new(),
            started: HashMap::new(),
            missing_once: HashSet::new(),
            reloaded_at: None,
            said_waiting: false,
            said_no_worker_slot: false,
            said_no_registry_slot: false,
        }
    }

    fn look_after(&mut self, catalog: &[CatalogDatabase]) {
        self.forget_gone(catalog);
        let served: Vec<&CatalogDatabase> =
            catalog.iter().filter(|db| db.servable && self.restriction.as_ref().is_none_or(|name| *name == db.name)).collect();
        self.say_if_waiting(!served.is_empty());
        self.databases.retain(|oid, _| served.iter().any(|db| db.oid == *oid));
        let mut probes =
            self.databases.iter().filter(|(oid, extension)| **extension == Extension::Unknown && self.is_probing(**oid)).count();
        for db in served {
            if registry::leaving(db.oid) {
                continue;
            }
            let extension = self.read_reports(db.oid);
            let workers = match extension {
                Extension::Installed => settings::workers(),
                // A probe still running keeps its worker, counted or not (see is_probing).
                Extension::Unknown if self.is_running(db.oid, 1) => 1,
                Extension::Unknown if probes < PROBES_AT_ONCE => {
                    probes += 1;
                    1
                }
                Extension::Unknown | Extension::Absent { .. } => 0,
            };
            for number in 1..=workers {
                self.start_if_stopped(db, number);
            }
        }
    }

    /// Forgets databases that are gone: their shared-memory entries and worker slots.
    fn forget_gone(&mut self, catalog: &[CatalogDatabase]) {
        let exists = |oid: Oid| catalog.iter().any(|db| db.oid == oid);
        let missing: HashSet<Oid> = registry::databases_with_entries().into_iter().filter(|oid| !exists(*oid)).collect();
        for oid in missing.intersection(&self.missing_once) {
            registry::forget_database(*oid);
        }
        self.missing_once = missing;
        for slot in registry::slots() {
            let database = slot.database();
            if database != Oid::INVALID && !exists(database) && !self.is_running(database, slot.number()) {
                slot.free();
            }
        }
        self.started.retain(|(oid, _), _| exists(*oid));
    }

    /// Looks again into every database found without the extension (after a reload, which
    /// may have turned `outbox.relay` on).
    fn look_again(&mut self) {
        self.reloaded_at = Some(Instant::now());
        for extension in self.databases.values_mut() {
            if matches!(extension, Extension::Absent { .. }) {
                *extension = Extension::Unknown;
            }
        }
    }

    /// Whether a probe of `database` (its worker 1) started not long ago and runs.
    fn is_probing(&self, database: Oid) -> bool {
        self.is_running(database, 1) && self.started.get(&(database, 1)).is_none_or(|(_, at)| at.elapsed() < PROBE_TIMEOUT)
    }

    fn say_if_waiting(&mut self, found: bool) {
        match &self.restriction {
            Some(name) if !found && !self.said_waiting => {
                log!("outbox_ext launcher: waiting for database \"{name}\" (outbox.database)");
                self.said_waiting = true;
            }
            _ if found => self.said_waiting = false,
            _ => {}
        }
    }

    /// What the workers of `database` found there, folded into what the launcher knew. The
    /// slot of a worker that found no extension and left is freed, unless it counted attempts
    /// (kept for the same worker, so its counters never go backwards).
    fn read_reports(&mut self, database: Oid) -> Extension {
        let known = self.databases.entry(database).or_insert(Extension::Unknown);
        for slot in registry::slots_of(database) {
            match slot.found() {
                (Found::NoExtension, as_of) if slot.live_pid().is_none() => {
                    let started = self.started.get(&(database, slot.number())).map(|(_, at)| *at);
                    let before_reload = started.zip(self.reloaded_at).is_some_and(|(started, reloaded)| started < reloaded);
                    *known = match *known {
                        // Looked again: the reload may have turned outbox.relay on.
                        _ if before_reload => Extension::Unknown,
                        Extension::Absent { as_of: before, since } => Extension::Absent { as_of: before.min(as_of), since },
                        _ => Extension::Absent { as_of, since: Instant::now() },
                    };
                    slot.clear_found();
                    // Not a worker that failed: it may start again at once after a serving change.
                    self.started.remove(&(database, slot.number()));
                    if !slot.has_attempts() {
                        slot.free();
                    }
                }
                (Found::Extension, _) if *known == Extension::Unknown => *known = Extension::Installed,
                _ => {}
            }
        }
        if let Extension::Absent { as_of, since } = *known {
            if registry::serving_changed_in(database) > as_of || since.elapsed() >= LOOK_AGAIN_AFTER {
                *known = Extension::Unknown;
            }
        }
        *known
    }

    /// Whether worker `number` of `database` runs (or is starting): one this launcher started,
    /// or one an earlier launcher started before this one was restarted.
    fn is_running(&self, database: Oid, number: usize) -> bool {
        let started_here = self
            .started
            .get(&(database, number))
            .and_then(|(handle, _)| handle.as_ref())
            .is_some_and(|handle| matches!(handle.pid(), Ok(_) | Err(BackgroundWorkerStatus::NotYetStarted)));
        started_here || registry::slots_of(database).any(|slot| slot.number() == number && slot.live_pid().is_some())
    }

    fn start_if_stopped(&mut self, db: &CatalogDatabase, number: usize) {
        let recently = self.started.get(&(db.oid, number)).is_some_and(|(_, at)| at.elapsed() < RESTART_AFTER);
        if recently || self.is_running(db.oid, number) {
            return;
        }
        // The worker's own slot if it had one (its counters go on), else a free one, else one
        // kept for a worker of a database found without the extension.
        let slots = registry::slots();
        let kept_for_absent = |slot: &registry::WorkerSlot| {
            matches!(self.databases.get(&slot.database()), Some(Extension::Absent { .. }))
                && !self.is_running(slot.database(), slot.number())
        };
        let index = slots.iter().position(|slot| slot.serves(db.oid) && slot.number() == number).or_else(|| {
            let free = slots.iter().position(|slot| slot.database() == Oid::INVALID).or_else(|| slots.iter().position(kept_for_absent))?;
            slots[free].assign(db.oid, number);
            Some(free)
        });
        let Some(index) = index else {
            if !std::mem::replace(&mut self.said_no_registry_slot, true) {
                warning!(
                    "outbox_ext launcher: cannot start relay {number} in database \"{}\": all {} relay slots are taken",
                    db.name,
                    registry::WORKER_SLOTS
                );
            }
            return;
        };
        // SAFETY: reads this process's own pid.
        let launcher = unsafe { pg_sys::MyProcPid };
        let handle = BackgroundWorkerBuilder::new(&format!("outbox_ext relay {number} in {}", db.name))
            .set_type("outbox_ext relay")
            .set_library("outbox_ext")
            .set_function("outbox_relay_main")
            .set_argument((index as i32).into_datum())
            .set_extra(&format!("{} {number}", db.oid.to_u32()))
            .enable_spi_access()
            .set_notify_pid(launcher)
            .load_dynamic()
            .ok();
        match handle {
            Some(_) => {
                self.said_no_worker_slot = false;
                self.said_no_registry_slot = false;
            }
            None if !self.said_no_worker_slot => {
                warning!(
                    "outbox_ext launcher: cannot start relay {number} in database \"{}\": no free background worker slot (raise max_worker_processes)",
                    db.name
                );
                self.said_no_worker_slot = true;
            }
            None => {}
        }
        self.started.insert((db.oid, number), (handle, Instant::now()));
    }
}

/// The rows of pg_database, read with a plain heap scan of the shared catalog, as the
/// autovacuum launcher reads it: a process connected to no database cannot open its indexes
/// before some backend has built the shared relcache file. `None` if the read failed.
fn read_pg_database() -> Option<Vec<CatalogDatabase>> {
    transaction::run(|| {
        // SAFETY: inside the transaction `run` opened; the scan and the relation are closed
        // before it ends, and each tuple is read as pg_database's fixed-size part.
        unsafe {
            let relation = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as _);
            let scan = pg_sys::table_beginscan_catalog(relation, 0, std::ptr::null_mut());
            let mut rows = Vec::new();
            loop {
                let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
                if tuple.is_null() {
                    break;
                }
                let row = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
                rows.push(CatalogDatabase {
                    oid: row.oid,
                    name: std::ffi::CStr::from_ptr(row.datname.data.as_ptr()).to_string_lossy().into_owned(),
                    // datconnlimit -2: an interrupted DROP DATABASE left it invalid.
                    servable: row.datallowconn && !row.datistemplate && row.datconnlimit != -2,
                });
            }
            pg_sys::table_endscan(scan);
            pg_sys::table_close(relation, pg_sys::AccessShareLock as _);
            Ok(rows)
        }
    })
    .ok()
}
