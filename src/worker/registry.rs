//! One shared-memory slot per relay worker: how commits find a worker's latch, and what
//! `outbox_workers()` shows an operator. Written by the worker, read by any backend.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};

use pgrx::prelude::*;
use pgrx::shmem::PGRXSharedMemory;
use pgrx::{pg_shmem_init, PgAtomic};

use crate::delivery::OutcomeClass;
use crate::settings::MAX_WORKERS;

const NO_PROC: i32 = -1;

pub struct WorkerSlot {
    /// PGPROC number while the worker runs, NO_PROC otherwise.
    pub procno: AtomicI32,
    pub pid: AtomicI32,
    /// When the worker began working with the settings it last read (PostgreSQL timestamp, µs).
    pub settings_loaded_at: AtomicI64,
    pub in_flight: AtomicI64,
    pub delivered: AtomicI64,
    pub failed: AtomicI64,
    /// Attempts by outcome class (indexed by `OutcomeClass as usize`) since the server started:
    /// kept when the worker restarts, so they never go backwards (monitoring counters).
    pub attempts: [AtomicI64; OutcomeClass::ALL.len()],
}

// SAFETY: only atomics, no pointers: valid in every process that maps the segment.
unsafe impl PGRXSharedMemory for WorkerSlot {}

impl WorkerSlot {
    fn empty() -> WorkerSlot {
        WorkerSlot {
            procno: AtomicI32::new(NO_PROC),
            pid: AtomicI32::new(0),
            settings_loaded_at: AtomicI64::new(0),
            in_flight: AtomicI64::new(0),
            delivered: AtomicI64::new(0),
            failed: AtomicI64::new(0),
            attempts: std::array::from_fn(|_| AtomicI64::new(0)),
        }
    }

    pub fn running_procno(&self) -> Option<usize> {
        let procno = self.procno.load(Ordering::SeqCst);
        (procno != NO_PROC).then_some(procno as usize)
    }
}

/// What the workers, the launcher and every backend share.
pub struct Shared {
    slots: [WorkerSlot; MAX_WORKERS],
    /// How many DROP DATABASE or ALTER DATABASE … RENAME commands of the served database are
    /// running: while any is, the relay workers leave it at once and the launcher starts none.
    leaving_database: AtomicI32,
    /// Events enqueued by transactions that committed, since the server started.
    enqueued: AtomicI64,
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
            slots: std::array::from_fn(|_| WorkerSlot::empty()),
            leaving_database: AtomicI32::new(0),
            enqueued: AtomicI64::new(0),
        }
    );
    READY.store(true, Ordering::Relaxed);
}

/// The slots, or none when the library was not preloaded (no workers exist then).
pub fn slots() -> &'static [WorkerSlot] {
    if READY.load(Ordering::Relaxed) {
        &SHARED.get().slots
    } else {
        &[]
    }
}

/// Whether the relay workers must leave their database (see `Shared::leaving_database`).
pub fn leaving_database() -> bool {
    READY.load(Ordering::Relaxed) && SHARED.get().leaving_database.load(Ordering::SeqCst) > 0
}

pub fn begin_leaving_database() {
    if READY.load(Ordering::Relaxed) {
        SHARED.get().leaving_database.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn end_leaving_database(requests: i32) {
    if READY.load(Ordering::Relaxed) {
        SHARED.get().leaving_database.fetch_sub(requests, Ordering::SeqCst);
    }
}

/// Counts the events of a transaction that just committed.
pub fn count_enqueued(events: i64) {
    if READY.load(Ordering::Relaxed) {
        SHARED.get().enqueued.fetch_add(events, Ordering::Relaxed);
    }
}

/// Events enqueued by committed transactions since the server started (0 when the library was
/// not preloaded).
pub fn enqueued() -> i64 {
    if READY.load(Ordering::Relaxed) {
        SHARED.get().enqueued.load(Ordering::Relaxed)
    } else {
        0
    }
}

/// The pid of a live process holding slot `number` (counting from 1), if any: a launcher that
/// was restarted finds the workers its predecessor started.
pub fn live_worker(number: usize) -> Option<i32> {
    let pid = slots().get(number - 1)?.pid.load(Ordering::SeqCst);
    // SAFETY: signal 0 only asks whether the process exists.
    (pid > 0 && unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

/// The calling worker's slot (`number` counts from 1), marked as running, its counters from
/// zero (but not `attempts`, which count since the server started).
pub fn claim_slot(number: usize) -> &'static WorkerSlot {
    let slot = &SHARED.get().slots[number - 1];
    slot.in_flight.store(0, Ordering::Relaxed);
    slot.delivered.store(0, Ordering::Relaxed);
    slot.failed.store(0, Ordering::Relaxed);
    // SAFETY: MyProc is this worker's own PGPROC, set up before its main function ran.
    unsafe {
        slot.pid.store(pg_sys::MyProcPid, Ordering::SeqCst);
        slot.procno.store((*pg_sys::MyProc).pgprocno, Ordering::SeqCst);
    }
    slot
}

pub fn release_slot(slot: &WorkerSlot) {
    slot.procno.store(NO_PROC, Ordering::SeqCst);
    slot.pid.store(0, Ordering::SeqCst);
    slot.in_flight.store(0, Ordering::Relaxed);
}
