//! The relay workers: background processes that claim due events, send them with no
//! transaction open, and record each outcome as it arrives.

mod queue;
pub mod registry;
pub mod wake;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;

use crate::delivery::{Outcome, Sender};
use crate::settings::{self, Settings};

/// How long a stopping worker waits for requests in flight before abandoning them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Retention deletes at most this many rows per transaction, and pauses this long once it
/// has caught up. Only worker 1 runs it; the others only deliver.
const RETENTION_BATCH: usize = 1_000;
const RETENTION_PAUSE: Duration = Duration::from_secs(10);
/// How soon the postmaster restarts a worker that exited with an error.
const RESTART_AFTER: Duration = Duration::from_secs(5);

pub fn register_workers() {
    for number in 1..=settings::workers() {
        BackgroundWorkerBuilder::new(&format!("outbox_ext relay {number}"))
            .set_type("outbox_ext relay")
            .set_library("outbox_ext")
            .set_function("outbox_relay_main")
            .set_argument((number as i32).into_datum())
            .enable_spi_access()
            .set_restart_time(Some(RESTART_AFTER))
            .load();
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn outbox_relay_main(arg: pg_sys::Datum) {
    let number = unsafe { i32::from_datum(arg, false) }.unwrap_or(1) as usize;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some(&settings::database()), None);
    let sender = match Sender::new() {
        Ok(sender) => sender,
        Err(e) => error!("outbox_ext relay {number}: {e}"),
    };
    let slot = registry::claim_slot(number);
    let mut relay = Relay { number, slot, settings: Settings::read(), sender };
    relay.note_settings_loaded();
    relay.run();
    registry::release_slot(slot);
    relay.sender.abandon();
    // Exit code 1 so that the postmaster restarts a worker stopped on its own (e.g. by
    // pg_terminate_backend); during a server shutdown nothing is restarted anyway.
    unsafe { pg_sys::proc_exit(1) };
}

struct Relay {
    number: usize,
    slot: &'static registry::WorkerSlot,
    settings: Settings,
    sender: Sender,
}

impl Relay {
    fn run(&mut self) {
        log!("outbox_ext relay {} started for database \"{}\"", self.number, settings::database());
        if !self.wait_for_extension() {
            return;
        }
        let mut claim_due = true;
        let mut next_poll = Instant::now();
        let mut next_cleanup = Instant::now();
        loop {
            if BackgroundWorker::sigterm_received() {
                break;
            }
            let reloaded = BackgroundWorker::sighup_received();
            if reloaded {
                self.reload();
                claim_due = true; // the new settings may enable delivery
                next_cleanup = Instant::now(); // or shorten the retention
            }
            self.record_finished();
            if claim_due && self.claim_limit() > 0 {
                claim_due = self.claim_and_send();
                next_poll = Instant::now() + self.settings.poll_interval;
            }
            if reloaded {
                // Published after the first claim under the new settings: from here on, only a
                // commit's wakeup or the new poll interval starts a claim.
                self.note_settings_loaded();
            }
            if Instant::now() >= next_cleanup {
                next_cleanup = self.delete_expired();
            }
            // Background workers must report their table statistics themselves; without this,
            // autovacuum never learns of the dead rows that claims and acknowledgements leave.
            unsafe { pg_sys::pgstat_report_stat(false) };
            let timeout = if claim_due && self.claim_limit() > 0 {
                Duration::ZERO
            } else {
                next_poll.min(next_cleanup).saturating_duration_since(Instant::now())
            };
            let wakeup = wake::wait(self.sender.doorbell().fd(), timeout);
            claim_due |= wakeup.latch || Instant::now() >= next_poll;
        }
        self.finish_in_flight();
    }

    /// A preloaded worker starts before anyone ran CREATE EXTENSION; wait for it quietly.
    fn wait_for_extension(&mut self) -> bool {
        let mut announced = false;
        loop {
            match queue::use_extension_schema() {
                Ok(true) => return true,
                Ok(false) if !announced => {
                    log!("outbox_ext relay {}: waiting for CREATE EXTENSION outbox_ext", self.number);
                    announced = true;
                }
                Ok(false) => {}
                Err(e) => warning!("outbox_ext relay {}: cannot look up the extension: {e}", self.number),
            }
            wake::wait(self.sender.doorbell().fd(), self.settings.poll_interval);
            if BackgroundWorker::sigterm_received() {
                return false;
            }
            if BackgroundWorker::sighup_received() {
                self.reload();
                self.note_settings_loaded();
            }
        }
    }

    fn reload(&mut self) {
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        self.settings = Settings::read();
    }

    /// Publishes when the settings were read, and says once why nothing will be delivered.
    fn note_settings_loaded(&self) {
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        self.slot.settings_loaded_at.store(now, Ordering::Relaxed);
        if let Err(reason) = &self.settings.target {
            log!("outbox_ext relay {}: not delivering: {reason}", self.number);
        }
    }

    /// How many events to claim now: none unless at least half a batch fits in the free
    /// request slots, so that claims stay batched while earlier requests are in flight.
    fn claim_limit(&self) -> usize {
        if self.settings.target.is_err() {
            return 0;
        }
        let free = self.settings.concurrency.saturating_sub(self.sender.in_flight());
        let batch = self.settings.batch_size.min(self.settings.concurrency);
        if free >= batch.div_ceil(2) {
            free.min(self.settings.batch_size)
        } else {
            0
        }
    }

    /// Claims and starts sending; true if the claim came back full (more may be due).
    fn claim_and_send(&mut self) -> bool {
        let limit = self.claim_limit();
        let Ok(target) = self.settings.target.clone() else { return false };
        match queue::claim_batch(limit, self.settings.lease) {
            Ok(events) => {
                let full = events.len() == limit;
                for event in events {
                    self.sender.send(&target, event);
                }
                self.slot.in_flight.store(self.sender.in_flight() as i64, Ordering::Relaxed);
                full
            }
            Err(e) => {
                warning!("outbox_ext relay {}: claim failed: {e}", self.number);
                false
            }
        }
    }

    fn record_finished(&mut self) {
        let finished = self.sender.take_finished();
        if finished.is_empty() {
            return;
        }
        let delivered = finished.iter().filter(|a| a.outcome == Outcome::Delivered).count() as i64;
        self.slot.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.slot.failed.fetch_add(finished.len() as i64 - delivered, Ordering::Relaxed);
        self.slot.in_flight.store(self.sender.in_flight() as i64, Ordering::Relaxed);
        match queue::record_attempts(&finished, self.settings.max_attempts) {
            Ok(dead) => {
                for event in dead {
                    warning!(
                        "outbox_ext: event {} ({}) is dead after {} attempts; last error: {}",
                        event.id, event.topic, event.attempts, event.last_error
                    );
                }
            }
            // The rows keep their lease and are retried when it runs out.
            Err(e) => warning!("outbox_ext relay {}: recording {} attempts failed: {e}", self.number, finished.len()),
        }
    }

    /// Deletes one batch of sent events past `outbox.retention`; returns when to run again:
    /// at once while there is more, after a pause once caught up.
    fn delete_expired(&mut self) -> Instant {
        let Some(retention) = self.settings.retention.filter(|_| self.number == 1) else {
            return Instant::now() + RETENTION_PAUSE;
        };
        match queue::delete_sent(retention, RETENTION_BATCH) {
            Ok(deleted) if deleted == RETENTION_BATCH => Instant::now(),
            Ok(_) => Instant::now() + RETENTION_PAUSE,
            Err(e) => {
                warning!("outbox_ext relay {}: retention delete failed: {e}", self.number);
                Instant::now() + RETENTION_PAUSE
            }
        }
    }

    /// On SIGTERM: claim nothing more, record what finishes within the grace period, and
    /// leave the rest to lease expiry.
    fn finish_in_flight(&mut self) {
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while self.sender.in_flight() > 0 && Instant::now() < deadline {
            wake::wait(self.sender.doorbell().fd(), deadline.saturating_duration_since(Instant::now()));
            self.record_finished();
        }
        let abandoned = self.sender.in_flight();
        if abandoned > 0 {
            log!("outbox_ext relay {}: stopping with {abandoned} requests in flight; their leases will return them", self.number);
        } else {
            log!("outbox_ext relay {} stopped", self.number);
        }
    }
}
