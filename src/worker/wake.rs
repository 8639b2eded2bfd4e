//! Waking relay workers the moment an enqueuing transaction commits.
//!
//! Each worker publishes its PGPROC number in its registry slot; `outbox_enqueue` arms a
//! transaction callback that sets the latches of the database's workers at commit (and counts
//! the transaction's events for `outbox_enqueued()`), noting in each slot what the commit wrote:
//! deliveries into the table path, or (log mode) events into the log, which only the worker
//! reading the log is woken for. Every worker that can claim, not one in
//! turn: one busy with a failing endpoint would leave the event to the next poll (waking one
//! in turn made the p50 latency at 500 events/s with an endpoint down 4.5 s instead of
//! 6 ms). A worker that cannot claim (no endpoint has room for a claim or a URL, or
//! acknowledgements wait to be recorded) is left asleep, and claims once when it can again.
//! A rolled-back transaction wakes nobody and counts nothing. Polling
//! (`outbox.poll_interval`) remains the fallback, e.g. after a two-phase commit or on a
//! server where the library is not preloaded.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

use outbox_core::timers::wait_millis;
use pgrx::prelude::*;

use super::registry;
use crate::majors;

// Per backend: how many events this transaction enqueued, what they wrote (registry's
// COMMITTED_* bits), and is the callback installed yet?
static ENQUEUED_IN_TRANSACTION: AtomicI64 = AtomicI64::new(0);
static WROTE_IN_TRANSACTION: AtomicU8 = AtomicU8::new(0);
static CALLBACK_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Arranges for the workers to be woken, and the event counted, if the current transaction
/// commits: those that can claim if it wrote deliveries into the table path, the one reading
/// the log if it wrote into the log. (An event rolled back to a savepoint is counted too.)
pub fn wake_workers_at_commit(logged: bool) {
    if registry::slots().is_empty() {
        return;
    }
    ENQUEUED_IN_TRANSACTION.fetch_add(1, Ordering::Relaxed);
    WROTE_IN_TRANSACTION.fetch_or(if logged { registry::COMMITTED_LOG } else { registry::COMMITTED_TABLE }, Ordering::Relaxed);
    if !CALLBACK_INSTALLED.swap(true, Ordering::Relaxed) {
        // SAFETY: registered once per backend (CALLBACK_INSTALLED); the callback takes no
        // argument and lives as long as the library.
        unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => {
            let events = ENQUEUED_IN_TRANSACTION.swap(0, Ordering::Relaxed);
            let wrote = WROTE_IN_TRANSACTION.swap(0, Ordering::Relaxed);
            if events > 0 {
                registry::count_enqueued(events);
                wake_workers_for(registry::my_database(), wrote);
            }
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE => {
            ENQUEUED_IN_TRANSACTION.store(0, Ordering::Relaxed);
            WROTE_IN_TRANSACTION.store(0, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Wakes the relay workers serving `database` that a commit which `wrote` (COMMITTED_* bits)
/// concerns: those that can claim now (`WorkerSlot::set_wakes_on_commit`) for the table path,
/// the one reading the log for the log. Waking every worker at each commit into the log made
/// each run a claim that found nothing, thousands of times a second.
fn wake_workers_for(database: pg_sys::Oid, wrote: u8) {
    for slot in registry::slots_of(database) {
        // Noted first: a worker that starts to want wakeups after this looks at the note.
        slot.note_commit(wrote);
        let concerns = (wrote & registry::COMMITTED_TABLE != 0 && slot.wakes_on_commit())
            || (wrote & registry::COMMITTED_LOG != 0 && slot.wakes_on_log());
        if let Some(procno) = slot.running_procno().filter(|_| concerns) {
            set_latch(procno);
        }
    }
}

/// Wakes every relay worker serving `database`.
pub fn wake_workers_of(database: pg_sys::Oid) {
    // A stale slot (a worker that crashed) only causes a harmless spurious wakeup.
    registry::slots_of(database).filter_map(|slot| slot.running_procno()).for_each(set_latch);
}

/// Sets the latch of the process with PGPROC number `procno`.
pub fn set_latch(procno: usize) {
    // SAFETY: procno is a PGPROC number a worker or the launcher published, below ProcGlobal's
    // count; the PGPROC array lives in shared memory for the server's life, and SetLatch may be
    // called on another process's latch.
    unsafe { pg_sys::SetLatch(&raw mut (*(*pg_sys::ProcGlobal).allProcs.add(procno)).procLatch) };
}

/// Sleeps until the latch is set or `timeout` passes. Exits the process if the postmaster
/// dies.
pub fn wait(timeout: Duration) {
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: main thread, this process's own latch.
    let rc = unsafe { pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, wait_millis(timeout) as _, pg_sys::PG_WAIT_EXTENSION) };
    after_wait(rc & pg_sys::WL_LATCH_SET as i32 != 0)
}

/// The relay loop's wait on the latch, the postmaster and the sender's doorbell, made once:
/// `WaitLatchOrSocket` makes and frees an epoll set at every wait, which at thousands of
/// turns a second was a quarter of the worker's time.
pub struct DoorbellWait {
    /// The doorbell the set was made with, and the set (in TopMemoryContext).
    made: Option<(RawFd, *mut pg_sys::WaitEventSet)>,
}

impl DoorbellWait {
    pub fn new() -> DoorbellWait {
        DoorbellWait { made: None }
    }

    /// Sleeps until the latch is set, `doorbell` is readable, or `timeout` passes. Exits the
    /// process if the postmaster dies.
    pub fn wait(&mut self, doorbell: RawFd, timeout: Duration) {
        let set = match self.made {
            Some((fd, set)) if fd == doorbell => set,
            _ => {
                self.free();
                // SAFETY: main thread; the set lives in TopMemoryContext until `free`, the latch
                // is this process's own, and the doorbell an open eventfd that outlives this
                // wait (the relay's sender owns both, and drops this first).
                let set = unsafe {
                    let set = majors::lasting_wait_event_set(3);
                    let none = std::ptr::null_mut();
                    pg_sys::AddWaitEventToSet(set, pg_sys::WL_LATCH_SET, pg_sys::PGINVALID_SOCKET, pg_sys::MyLatch, none);
                    pg_sys::AddWaitEventToSet(set, pg_sys::WL_EXIT_ON_PM_DEATH, pg_sys::PGINVALID_SOCKET, std::ptr::null_mut(), none);
                    pg_sys::AddWaitEventToSet(set, pg_sys::WL_SOCKET_READABLE, doorbell, std::ptr::null_mut(), none);
                    set
                };
                self.made = Some((doorbell, set));
                set
            }
        };
        // SAFETY: WaitEvent is plain C data, for which all zeroes is a valid value.
        let mut occurred: [pg_sys::WaitEvent; 3] = unsafe { std::mem::zeroed() };
        let timeout = wait_millis(timeout) as _;
        // SAFETY: main thread; `set` was made above and is still alive; `occurred` has room for
        // the 3 events passed as its length.
        let n = unsafe { pg_sys::WaitEventSetWait(set, timeout, occurred.as_mut_ptr(), 3, pg_sys::PG_WAIT_EXTENSION) };
        let latch = occurred.iter().take(n.max(0) as usize).any(|event| event.events & pg_sys::WL_LATCH_SET != 0);
        after_wait(latch)
    }

    fn free(&mut self) {
        if let Some((_, set)) = self.made.take() {
            // SAFETY: main thread; the set was made by CreateWaitEventSet and is freed once.
            unsafe { pg_sys::FreeWaitEventSet(set) };
        }
    }
}

impl Drop for DoorbellWait {
    fn drop(&mut self) {
        self.free();
    }
}

/// What every wait does after waking: resets the latch if it was set (what commits set it for,
/// the registry slot says), and takes what other processes asked.
fn after_wait(latch: bool) {
    if latch {
        // SAFETY: main thread, this process's own latch.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    }
    // Absorb what other backends asked of every process, e.g. the barrier DROP DATABASE waits
    // for: a worker with nothing to deliver runs no statement that would do it otherwise. A
    // cancel request (pg_cancel_backend) has no statement to cancel between transactions, and
    // would otherwise raise an ERROR here, outside the guarded transactions.
    // SAFETY: main thread; plain flags of this process.
    unsafe { pg_sys::QueryCancelPending = 0 };
    pg_sys::check_for_interrupts!();
}
