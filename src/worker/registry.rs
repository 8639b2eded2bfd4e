//! What the launcher, the relay workers and every backend share in memory: one slot per relay
//! worker (how commits find a worker's latch, what `outbox_workers()` shows, and what the
//! worker found in its database), one entry per database (committed enqueues, and whether a
//! DROP or RENAME of it is waiting for its workers), and the launcher's latch.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};

use pgrx::pg_sys::Oid;
use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use pgrx::{pg_shmem_init, PgAtomic};

use outbox_core::delivery::OutcomeClass;

use crate::majors;

/// Relay workers running at once, over every database.
pub const WORKER_SLOTS: usize = 128;
/// Databases the launcher looks after at once (served, probed or being dropped).
pub const DATABASE_SLOTS: usize = 256;

const NO_PROC: i32 = -1;
/// What a commit that woke a worker wrote: deliveries into the table path, or events into the
/// log (WorkerSlot::committed).
pub const COMMITTED_TABLE: u8 = 1;
pub const COMMITTED_LOG: u8 = 2;
const NO_DATABASE: u32 = 0;

/// What a relay worker found in its database, for the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing yet (the worker is starting).
    Nothing = 0,
    /// outbox_ext is installed (perhaps waiting for ALTER EXTENSION UPDATE).
    Extension = 1,
    /// outbox_ext is not installed: the worker left.
    NoExtension = 2,
}

pub struct WorkerSlot {
    /// The database this slot's worker serves (its OID), NO_DATABASE while the slot is free.
    /// Written by the launcher only.
    database: AtomicU32,
    /// The worker's number within its database, from 1.
    number: AtomicI32,
    /// PGPROC number while the worker runs, NO_PROC otherwise.
    procno: AtomicI32,
    pub pid: AtomicI32,
    found: AtomicI32,
    /// `serving_changes()` as the worker read it before it connected: a later change may make
    /// the database one to serve.
    absent_as_of: AtomicU64,
    /// When the worker began working with the settings it last read (PostgreSQL timestamp, µs).
    pub settings_loaded_at: AtomicI64,
    pub in_flight: AtomicI64,
    /// Whether a commit should wake the worker: only while it can claim something. A worker
    /// with every request slot taken, or with no endpoint it can send to, would only wake,
    /// find nothing to do and sleep again, at the cost of a signal per commit.
    wakes_on_commit: AtomicBool,
    /// Whether a commit that wrote into the log should wake the worker: only while it holds
    /// the lease on reading the log's slot.
    wakes_on_log: AtomicBool,
    /// What the commits since the worker last looked wrote, whether they woke it or not:
    /// bits of `COMMITTED_TABLE` and `COMMITTED_LOG`.
    committed: AtomicU8,
    pub delivered: AtomicI64,
    pub failed: AtomicI64,
    /// Attempts by outcome class (indexed by `OutcomeClass as usize`) since the launcher gave
    /// the slot to this database and number: kept when the worker restarts, so they never go
    /// backwards (monitoring counters).
    pub attempts: [AtomicI64; OutcomeClass::ALL.len()],
}

// SAFETY: only atomics, no pointers: valid in every process that maps the segment.
unsafe impl PGRXSharedMemory for WorkerSlot {}

impl WorkerSlot {
    fn empty() -> WorkerSlot {
        WorkerSlot {
            database: AtomicU32::new(NO_DATABASE),
            number: AtomicI32::new(0),
            procno: AtomicI32::new(NO_PROC),
            pid: AtomicI32::new(0),
            found: AtomicI32::new(Found::Nothing as i32),
            absent_as_of: AtomicU64::new(0),
            settings_loaded_at: AtomicI64::new(0),
            in_flight: AtomicI64::new(0),
            wakes_on_commit: AtomicBool::new(false),
            wakes_on_log: AtomicBool::new(false),
            committed: AtomicU8::new(0),
            delivered: AtomicI64::new(0),
            failed: AtomicI64::new(0),
            attempts: std::array::from_fn(|_| AtomicI64::new(0)),
        }
    }

    pub fn running_procno(&self) -> Option<usize> {
        let procno = self.procno.load(Ordering::SeqCst);
        (procno != NO_PROC).then_some(procno as usize)
    }

    pub fn database(&self) -> Oid {
        Oid::from(self.database.load(Ordering::SeqCst))
    }

    pub fn number(&self) -> usize {
        self.number.load(Ordering::SeqCst) as usize
    }

    pub fn serves(&self, database: Oid) -> bool {
        self.database() == database && database != Oid::INVALID
    }

    /// The pid of a live process holding the slot, if any: a launcher that was restarted
    /// finds the workers its predecessor started.
    pub fn live_pid(&self) -> Option<i32> {
        let pid = self.pid.load(Ordering::SeqCst);
        // SAFETY: signal 0 only asks whether the process exists.
        (pid > 0 && unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
    }

    /// Whether commits wake the worker now.
    pub fn wakes_on_commit(&self) -> bool {
        self.wakes_on_commit.load(Ordering::SeqCst)
    }

    /// Publishes whether commits should wake the worker: whether it could claim now. True
    /// when it could not before: the commits made meanwhile woke nobody, so the worker must
    /// claim once before it sleeps. (Published before that claim, which then sees every
    /// commit that did not wake it.)
    pub fn set_wakes_on_commit(&self, can_claim: bool) -> bool {
        let before = self.wakes_on_commit.swap(can_claim, Ordering::SeqCst);
        can_claim && !before
    }

    pub fn wakes_on_log(&self) -> bool {
        self.wakes_on_log.load(Ordering::SeqCst)
    }

    /// Publishes whether commits into the log should wake the worker: whether it reads the
    /// log now.
    pub fn set_wakes_on_log(&self, reads_log: bool) {
        self.wakes_on_log.store(reads_log, Ordering::SeqCst);
    }

    /// Notes what a commit wrote (`COMMITTED_*`), before it decides whether to set the
    /// worker's latch: a commit that does not wake the worker is still seen at its next wait.
    pub fn note_commit(&self, wrote: u8) {
        self.committed.fetch_or(wrote, Ordering::SeqCst);
    }

    /// Whether a commit into the table path was noted since the worker last took them.
    pub fn table_commit_noted(&self) -> bool {
        self.committed.load(Ordering::SeqCst) & COMMITTED_TABLE != 0
    }

    /// What the commits since the last call wrote (`COMMITTED_*` bits).
    pub fn take_commits(&self) -> u8 {
        self.committed.swap(0, Ordering::SeqCst)
    }

    /// What the worker last found, and (for `NoExtension`) as of which `serving_changes()`.
    pub fn found(&self) -> (Found, u64) {
        let found = match self.found.load(Ordering::SeqCst) {
            1 => Found::Extension,
            2 => Found::NoExtension,
            _ => Found::Nothing,
        };
        (found, self.absent_as_of.load(Ordering::SeqCst))
    }

    /// Tells the launcher what the worker found; woken when it is news, so that the other
    /// workers of a database where the extension was found start at once.
    pub fn report(&self, found: Found, as_of: u64) {
        self.absent_as_of.store(as_of, Ordering::SeqCst);
        if self.found.swap(found as i32, Ordering::SeqCst) != found as i32 {
            wake_launcher();
        }
    }

    /// The launcher read the report.
    pub fn clear_found(&self) {
        self.found.store(Found::Nothing as i32, Ordering::SeqCst);
    }

    /// Whether the slot ever counted an attempt (its counters must then not go backwards).
    pub fn has_attempts(&self) -> bool {
        self.attempts.iter().any(|n| n.load(Ordering::Relaxed) > 0)
    }

    /// Gives the free slot to worker `number` of `database`, its counters from zero.
    pub fn assign(&self, database: Oid, number: usize) {
        self.attempts.iter().for_each(|n| n.store(0, Ordering::Relaxed));
        self.pid.store(0, Ordering::SeqCst);
        self.procno.store(NO_PROC, Ordering::SeqCst);
        self.found.store(Found::Nothing as i32, Ordering::SeqCst);
        self.number.store(number as i32, Ordering::SeqCst);
        self.database.store(database.to_u32(), Ordering::SeqCst);
    }

    /// Frees the slot of a worker that stopped for good (its database or extension is gone).
    pub fn free(&self) {
        self.database.store(NO_DATABASE, Ordering::SeqCst);
    }
}

/// Per database, kept by the backends and the launcher.
pub struct DatabaseSlot {
    oid: AtomicU32,
    /// Events enqueued by transactions that committed, since the server started.
    enqueued: AtomicI64,
    /// `serving_changes()` when one last committed here: a worker that found nothing to serve
    /// as of a lower count may have missed it.
    serving_changed: AtomicU64,
    /// The same, for the last change of `outbox.relay` here: a worker that connected (and read
    /// the database's settings) before it must reconnect.
    settings_changed: AtomicU64,
    /// How many DROP DATABASE or ALTER DATABASE … RENAME commands of it are running: while any
    /// is, its relay workers leave at once and the launcher starts none there.
    leaving: AtomicI32,
}

// SAFETY: as for WorkerSlot.
unsafe impl PGRXSharedMemory for DatabaseSlot {}

pub struct Shared {
    workers: [WorkerSlot; WORKER_SLOTS],
    databases: [DatabaseSlot; DATABASE_SLOTS],
    /// Commits since the server started that may make a database one to serve: CREATE
    /// EXTENSION outbox_ext, ALTER DATABASE … SET or RESET outbox.relay.
    serving_changes: AtomicU64,
    /// The launcher's PGPROC number, NO_PROC while none runs.
    launcher_procno: AtomicI32,
}

// SAFETY: as for WorkerSlot.
unsafe impl PGRXSharedMemory for Shared {}

// SAFETY: the name is this extension's own, used for no other segment.
static SHARED: PgAtomic<Shared> = unsafe { PgAtomic::new(c"outbox_ext_workers") };

/// Set in the postmaster by `_PG_init` and inherited by every backend it forks.
static READY: AtomicBool = AtomicBool::new(false);

/// Called from `_PG_init` while shared_preload_libraries is being processed.
pub fn init_shared_memory() {
    pg_shmem_init!(
        SHARED = Shared {
            workers: std::array::from_fn(|_| WorkerSlot::empty()),
            databases: std::array::from_fn(|_| DatabaseSlot {
                oid: AtomicU32::new(NO_DATABASE),
                enqueued: AtomicI64::new(0),
                serving_changed: AtomicU64::new(0),
                settings_changed: AtomicU64::new(0),
                leaving: AtomicI32::new(0)
            }),
            serving_changes: AtomicU64::new(0),
            launcher_procno: AtomicI32::new(NO_PROC),
        }
    );
    READY.store(true, Ordering::Relaxed);
}

fn shared() -> Option<&'static Shared> {
    READY.load(Ordering::Relaxed).then(|| SHARED.get())
}

/// Every worker slot, or none when the library was not preloaded (no workers exist then).
pub fn slots() -> &'static [WorkerSlot] {
    shared().map_or(&[], |shared| &shared.workers)
}

/// The slots of the workers serving `database`.
pub fn slots_of(database: Oid) -> impl Iterator<Item = &'static WorkerSlot> {
    slots().iter().filter(move |slot| slot.serves(database))
}

/// This backend's database.
pub fn my_database() -> Oid {
    // SAFETY: a plain global of this process, set when it connected.
    unsafe { pg_sys::MyDatabaseId }
}

/// The calling worker's slot (`index` from the launcher), marked as running, its counters
/// from zero (but not `attempts`); released when the process exits, however it exits. `None`
/// if the launcher gave the slot to another worker since it started this one (its database
/// went away meanwhile).
pub fn claim_slot(index: usize, database: Oid, number: usize) -> Option<&'static WorkerSlot> {
    let slot = slots().get(index)?;
    // SAFETY: reads this process's own pid.
    let pid = unsafe { pg_sys::MyProcPid };
    if slot.database() != database
        || slot.number() != number
        || slot.pid.compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst).is_err()
    {
        return None;
    }
    slot.in_flight.store(0, Ordering::Relaxed);
    slot.delivered.store(0, Ordering::Relaxed);
    slot.failed.store(0, Ordering::Relaxed);
    // SAFETY: MyProc is this worker's own PGPROC, set up before its main function ran; the
    // callback is this library's own and takes the slot index as its argument.
    unsafe {
        slot.procno.store(majors::my_proc_number(), Ordering::SeqCst);
        pg_sys::before_shmem_exit(Some(release_slot_at_exit), pg_sys::Datum::from(index));
    }
    Some(slot)
}

/// Releases the exiting worker's slot, also when it exits on an ERROR or FATAL.
#[pg_guard]
unsafe extern "C-unwind" fn release_slot_at_exit(_code: i32, index: pg_sys::Datum) {
    if let Some(slot) = slots().get(index.value()) {
        slot.procno.store(NO_PROC, Ordering::SeqCst);
        slot.wakes_on_commit.store(false, Ordering::SeqCst);
        slot.wakes_on_log.store(false, Ordering::SeqCst);
        slot.committed.store(0, Ordering::SeqCst);
        slot.pid.store(0, Ordering::SeqCst);
        slot.in_flight.store(0, Ordering::Relaxed);
    }
}

/// The entries of `database` (normally one; two backends adding it at once may make two, which
/// readers sum).
fn entries_of(database: Oid) -> impl Iterator<Item = &'static DatabaseSlot> {
    let databases = shared().map_or(&[][..], |shared| &shared.databases[..]);
    databases.iter().filter(move |entry| entry.oid.load(Ordering::SeqCst) == database.to_u32())
}

/// The entry of `database`, added if missing; `None` if every entry is taken.
fn entry_of(database: Oid) -> Option<&'static DatabaseSlot> {
    if let Some(entry) = entries_of(database).next() {
        return Some(entry);
    }
    let databases = &shared()?.databases;
    databases.iter().find(|entry| entry.oid.compare_exchange(NO_DATABASE, database.to_u32(), Ordering::SeqCst, Ordering::SeqCst).is_ok())
}

/// Counts the events of a transaction that just committed in this database.
pub fn count_enqueued(events: i64) {
    if let Some(entry) = entry_of(my_database()) {
        entry.enqueued.fetch_add(events, Ordering::Relaxed);
    }
}

/// Events enqueued by committed transactions in `database` since the server started.
pub fn enqueued(database: Oid) -> i64 {
    entries_of(database).map(|entry| entry.enqueued.load(Ordering::Relaxed)).sum()
}

/// Whether the relay workers must leave `database` (see `DatabaseSlot::leaving`).
pub fn leaving(database: Oid) -> bool {
    entries_of(database).any(|entry| entry.leaving.load(Ordering::SeqCst) > 0)
}

/// Asks the workers of `database` to leave, if it has any (or one is being started there);
/// returns the request, which `end_leaving` lifts.
pub fn begin_leaving(database: Oid) -> Option<LeaveRequest> {
    slots_of(database).next()?;
    let entry = entry_of(database)?;
    entry.leaving.fetch_add(1, Ordering::SeqCst);
    Some(LeaveRequest(entry))
}

/// A request made by `begin_leaving`, on the very entry it counted in.
pub struct LeaveRequest(&'static DatabaseSlot);

pub fn end_leaving(request: LeaveRequest) {
    request.0.leaving.fetch_sub(1, Ordering::SeqCst);
}

/// The databases that have an entry.
pub fn databases_with_entries() -> Vec<Oid> {
    let databases = shared().map_or(&[][..], |shared| &shared.databases[..]);
    databases.iter().map(|entry| entry.oid.load(Ordering::SeqCst)).filter(|oid| *oid != NO_DATABASE).map(Oid::from).collect()
}

/// Drops the entries of `database`, which is gone, with their counters; not while a DROP of it
/// has yet to finish.
pub fn forget_database(database: Oid) {
    for entry in entries_of(database) {
        if entry.leaving.load(Ordering::SeqCst) == 0 {
            entry.enqueued.store(0, Ordering::Relaxed);
            entry.serving_changed.store(0, Ordering::SeqCst);
            entry.settings_changed.store(0, Ordering::SeqCst);
            entry.oid.store(NO_DATABASE, Ordering::SeqCst);
        }
    }
}

/// How many commits that may make a database one to serve (see `Shared::serving_changes`) the
/// cluster has seen since the server started.
pub fn serving_changes() -> u64 {
    shared().map_or(0, |shared| shared.serving_changes.load(Ordering::SeqCst))
}

/// `serving_changes()` as it stood when one last committed in `database` (0: never since the
/// server started).
pub fn serving_changed_in(database: Oid) -> u64 {
    entries_of(database).map(|entry| entry.serving_changed.load(Ordering::SeqCst)).max().unwrap_or(0)
}

/// `serving_changes()` as it stood when `outbox.relay` last changed for `database`.
pub fn settings_changed_in(database: Oid) -> u64 {
    entries_of(database).map(|entry| entry.settings_changed.load(Ordering::SeqCst)).max().unwrap_or(0)
}

/// Called once such a change committed for `database` (`None`: every database that has an
/// entry; `settings`: a change of `outbox.relay`): the launcher looks into it again if it
/// found nothing to serve there before, and workers that read its settings before the change
/// restart.
pub fn note_serving_changed(database: Option<Oid>, settings: bool) {
    let Some(shared) = shared() else { return };
    let count = shared.serving_changes.fetch_add(1, Ordering::SeqCst) + 1;
    let entries: Vec<&DatabaseSlot> = match database {
        Some(database) => entry_of(database).into_iter().collect(),
        None => shared.databases.iter().filter(|entry| entry.oid.load(Ordering::SeqCst) != NO_DATABASE).collect(),
    };
    for entry in entries {
        entry.serving_changed.fetch_max(count, Ordering::SeqCst);
        if settings {
            entry.settings_changed.fetch_max(count, Ordering::SeqCst);
        }
    }
    wake_launcher();
}

fn wake_launcher() {
    let procno = shared().map_or(NO_PROC, |shared| shared.launcher_procno.load(Ordering::SeqCst));
    if procno != NO_PROC {
        super::wake::set_latch(procno as usize);
    }
}

/// The launcher says where its latch is (or that it stopped, with `None`).
pub fn publish_launcher(procno: Option<i32>) {
    if let Some(shared) = shared() {
        shared.launcher_procno.store(procno.unwrap_or(NO_PROC), Ordering::SeqCst);
    }
}
