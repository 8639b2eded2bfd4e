//! The relay workers: background processes that claim due events, send them with no
//! transaction open, and record each outcome as it arrives.

pub mod launcher;
mod queue;
pub mod registry;
mod transaction;
pub mod utility_hook;
pub mod wake;

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;

#[cfg(test)]
pub use queue::claim_batch_sql;
use queue::DeadDelivery;
pub use queue::Queries;
use registry::Found;
use transaction::TransactionError;

use crate::catalog::LIBRARY_VERSION;
use crate::settings::{self, Settings};
use outbox_core::delivery::{one_line, Attempt, Destinations, Outcome, Sender, MAX_ERROR_BYTES};
use outbox_core::endpoints::Endpoints;
use outbox_core::timers::{Timers, ACK_RETRY};

/// How long a stopping worker waits for requests in flight before abandoning them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Retention deletes at most this many rows per transaction, and pauses this long once it
/// has caught up. Only worker 1 runs it; the others only deliver.
const RETENTION_BATCH: usize = 1_000;
const RETENTION_PAUSE: Duration = Duration::from_secs(10);
/// `outbox.allowed_destinations` as the sender takes it. Its check hook refuses a value that
/// does not parse; should one get through all the same, nothing is allowed, rather than
/// everything.
fn allowed_destinations(settings: &Settings, number: usize) -> Destinations {
    Destinations::parse(&settings.allowed_destinations).unwrap_or_else(|e| {
        warning!("outbox_ext relay {number}: outbox.allowed_destinations is not valid, so no destination is allowed: {e}");
        Destinations::default()
    })
}

/// A failure that keeps happening is logged again after this long.
const REPEAT_WARNING_AFTER: Duration = Duration::from_secs(60);

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
        unsafe { pg_sys::proc_exit(0) };
    };
    let settings = settings::read();
    let sender = Sender::new(allowed_destinations(&settings, number)).unwrap_or_else(|e| error!("outbox_ext relay {number}: {e}"));
    let mut relay = Relay {
        number,
        database,
        database_name: transaction::run(database_name).unwrap_or_default(),
        connected_as_of,
        slot,
        settings,
        sender,
        endpoints: Endpoints::default(),
        unrecorded_acks: Vec::new(),
        last_warning: None,
        left_out: false,
    };
    relay.note_settings_loaded();
    relay.run();
    relay.sender.abandon();
    // The launcher starts a stopped worker again, unless the server is shutting down, the
    // database is going away or has no outbox_ext.
    // SAFETY: no transaction is open; proc_exit runs PostgreSQL's exit callbacks.
    unsafe { pg_sys::proc_exit(0) };
}

struct Relay {
    /// The worker's number within its database, from 1.
    number: usize,
    database: pg_sys::Oid,
    /// As it was named when the worker started, for the log.
    database_name: String,
    /// `registry::serving_changes()` before the worker connected.
    connected_as_of: u64,
    slot: &'static registry::WorkerSlot,
    settings: Settings,
    sender: Sender,
    endpoints: Endpoints,
    /// Deliveries the receiver acknowledged whose `sent_at` could not be written yet; retried until
    /// it is, so an acknowledgement is never lost to a failed transaction. Nothing new is
    /// claimed meanwhile.
    unrecorded_acks: Vec<(Arc<str>, i64, i32)>,
    /// The last failure logged and when: the same failure is logged again only after a while.
    last_warning: Option<(String, Instant)>,
    /// The last claim left due deliveries out for want of budget: claim again as soon as a
    /// request ends, since no commit may come to say they are there.
    left_out: bool,
}

/// Why the delivery loop ended.
enum Stop {
    Shutdown,
    /// A DROP DATABASE or ALTER DATABASE … RENAME of this database is waiting for the
    /// workers to leave: exit at once, leaving what is in flight to its lease.
    LeavingDatabase,
    /// The extension was dropped, or its schema moved or changed version.
    ExtensionChanged,
    /// `outbox.relay` was turned off, or may have been changed for this database since the
    /// worker connected (it reads a database's settings only then): exit, and let the launcher
    /// start a worker that reads them afresh.
    RelayChanged,
}

impl Relay {
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
            match self.deliver(&queries) {
                Stop::Shutdown | Stop::LeavingDatabase | Stop::RelayChanged => return,
                Stop::ExtensionChanged => {
                    // What is in flight belongs to rows that are gone: drop it unrecorded.
                    let fresh = Sender::new(allowed_destinations(&self.settings, self.number))
                        .unwrap_or_else(|e| error!("outbox_ext relay {}: {e}", self.number));
                    std::mem::replace(&mut self.sender, fresh).abandon();
                    self.unrecorded_acks.clear();
                    self.endpoints = Endpoints::default();
                    self.slot.in_flight.store(0, Ordering::Relaxed);
                    // A reload read in the loop that just ended is in effect from here on.
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
            wake::wait(Some(self.sender.doorbell().fd()), self.settings.poll_interval);
            if BackgroundWorker::sigterm_received() {
                return None;
            }
            if BackgroundWorker::sighup_received() {
                self.reload();
                self.note_settings_loaded();
            }
        }
    }

    /// The loop: each turn reloads the settings if signalled, claims and sends if a claim is
    /// due, records what finished, deletes what retention expired if that is due, reports its
    /// table statistics and waits for a commit, a finished request or a timer. Ends on SIGTERM,
    /// when its database is going away, or when the extension changes under it.
    fn deliver(&mut self, queries: &Queries) -> Stop {
        let mut timers = Timers::new();
        let Err(stop) = self.deliver_turns(queries, &mut timers);
        stop
    }

    fn deliver_turns(&mut self, queries: &Queries, timers: &mut Timers) -> Result<Infallible, Stop> {
        loop {
            self.stop_if_asked(queries)?;
            let reloaded = self.reload_if_signalled(timers);
            // Outcomes are collected first (freeing their request slots) but written after the
            // claim: a commit's fresh event is sent before the transactions that record what
            // finished, which under a failing endpoint are most of the worker's time.
            let busy = self.sender.busy_endpoints();
            let finished = self.sender.take_finished();
            // Also when fewer endpoints are busy: each one's share of the requests grew.
            timers.claim_due |= self.endpoints.room_regained(&finished, &self.sender, &self.settings)
                || (self.left_out && !finished.is_empty())
                || self.sender.busy_endpoints() < busy;
            let claimed = self.claim_if_due(queries, timers);
            // Recorded even when the claim ends the loop (the relay's settings changed): these
            // are neither in flight nor recorded anywhere else. The next events of ordered keys
            // just sent are due: claim them without waiting.
            timers.claim_due |= self.record_finished(queries, finished)?;
            claimed?;
            if reloaded {
                // Published after the first claim under the new settings: from here on, only a
                // commit's wakeup or the new poll interval starts a claim.
                self.note_settings_loaded();
            }
            self.delete_expired_if_due(queries, timers)?;
            report_table_statistics();
            let can_claim = self.can_claim();
            timers.claim_due |= self.slot.set_wakes_on_commit(can_claim);
            let sleep = timers.sleep(can_claim, !self.unrecorded_acks.is_empty());
            let wakeup = wake::wait(Some(self.sender.doorbell().fd()), sleep);
            timers.after_wait(wakeup.latch, self.settings.poll_interval);
        }
    }

    /// On SIGTERM, when a DROP DATABASE or RENAME of this database waits for the workers, or
    /// when a reload turned `outbox.relay` off.
    fn stop_if_asked(&mut self, queries: &Queries) -> Result<(), Stop> {
        if registry::leaving(self.database) {
            // Acknowledgements already received are written first (the command waits up to
            // 5 s for the workers); requests still in flight come back by their lease.
            let finished = self.sender.take_finished();
            let _ = self.record_finished(queries, finished);
            log!("outbox_ext relay {}: leaving database \"{}\", which is being dropped or renamed", self.number, self.database_name);
            return Err(Stop::LeavingDatabase);
        }
        if BackgroundWorker::sigterm_received() {
            self.finish_in_flight(queries);
            return Err(Stop::Shutdown);
        }
        if !settings::relay() {
            self.finish_in_flight(queries);
            return Err(Stop::RelayChanged);
        }
        Ok(())
    }

    /// Reads the settings again after a SIGHUP; true if it did.
    fn reload_if_signalled(&mut self, timers: &mut Timers) -> bool {
        let reloaded = BackgroundWorker::sighup_received();
        if reloaded {
            self.reload();
            timers.after_reload(self.settings.poll_interval);
        }
        reloaded
    }

    fn claim_if_due(&mut self, queries: &Queries, timers: &mut Timers) -> Result<(), Stop> {
        if timers.claim_due && (self.can_claim() || timers.endpoints_stale) {
            let read_endpoints = std::mem::take(&mut timers.endpoints_stale);
            // None: no room, or nothing to send to; wait for a finished request or the poll.
            if let Some(full) = self.claim_and_send(queries, read_endpoints)? {
                timers.after_claim(full, self.settings.poll_interval);
            }
        }
        Ok(())
    }

    fn delete_expired_if_due(&mut self, queries: &Queries, timers: &mut Timers) -> Result<(), Stop> {
        if timers.cleanup_due() {
            timers.next_cleanup = self.delete_expired(queries)?;
        }
        Ok(())
    }

    fn reload(&mut self) {
        // SAFETY: main thread, outside a transaction, as PostgreSQL's own SIGHUP handling does.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        self.settings = settings::read();
        self.sender.allow(allowed_destinations(&self.settings, self.number));
    }

    /// Publishes when the settings were read.
    fn note_settings_loaded(&self) {
        // SAFETY: reads the clock; no PostgreSQL state involved.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        self.slot.settings_loaded_at.store(now, Ordering::Relaxed);
    }

    /// Whether a claim could take anything now: not while acknowledgements wait to be
    /// recorded, nor while every endpoint's request slots are (nearly) full.
    fn can_claim(&self) -> bool {
        self.unrecorded_acks.is_empty() && self.endpoints.can_claim(&self.sender, &self.settings)
    }

    /// Reads the endpoints if asked (disabling those failing for too long), claims for each
    /// what fits in its free request slots, and starts sending. `Some(true)` if some
    /// endpoint's claim came back full (more may be due); `None` if there was nothing to claim
    /// for.
    fn claim_and_send(&mut self, queries: &Queries, read_endpoints: bool) -> Result<Option<bool>, Stop> {
        if read_endpoints {
            self.read_endpoints(queries)?;
        }
        let plan = self.endpoints.claim_plan(&self.sender, &self.settings);
        if plan.claims.is_empty() || !self.unrecorded_acks.is_empty() {
            return Ok(None);
        }
        match queue::claim_batch(queries, &plan, self.endpoints.version) {
            // Claims again with what the endpoints are now (once: a change during this claim
            // is seen by the next one).
            Ok(queue::Claimed::EndpointsChanged) if !read_endpoints => self.claim_and_send(queries, true),
            Ok(queue::Claimed::EndpointsChanged) => Ok(Some(true)),
            Ok(queue::Claimed::Deliveries { claimed, dead, left_out }) => {
                self.left_out = left_out;
                dead.iter().for_each(warn_dead);
                let taken = |endpoint: &str| {
                    claimed.iter().filter(|d| *d.endpoint == *endpoint).count() + dead.iter().filter(|d| d.endpoint == endpoint).count()
                };
                let full = plan.claims.iter().any(|claim| taken(&claim.endpoint) == claim.limit);
                for delivery in claimed {
                    if let Some(target) = self.endpoints.target(&delivery.endpoint) {
                        self.sender.send(&target, delivery);
                    }
                }
                self.slot.in_flight.store(self.sender.in_flight() as i64, Ordering::Relaxed);
                Ok(Some(full))
            }
            Err(e) => self.failed("claiming deliveries", e, queries).map(|()| Some(false)),
        }
    }

    /// Reads the webhook endpoints, after disabling those that have failed for longer than
    /// `outbox.endpoint_disable_after`. Done at each poll and reload, not at each commit's
    /// wakeup: endpoint changes reach the workers within a poll interval, while the claim
    /// itself leaves out an endpoint disabled or dropped since at once.
    fn read_endpoints(&mut self, queries: &Queries) -> Result<(), Stop> {
        if registry::settings_changed_in(self.database) > self.connected_as_of {
            log!("outbox_ext relay {}: outbox.relay was set for database \"{}\"; restarting to read it", self.number, self.database_name);
            self.finish_in_flight(queries);
            return Err(Stop::RelayChanged);
        }
        match queue::load_endpoints(queries, self.settings.endpoint_disable_after) {
            Ok(queue::Endpoints::ExtensionGone) => {
                log!("outbox_ext relay {}: outbox_ext was dropped or changed in this database", self.number);
                return Err(Stop::ExtensionChanged);
            }
            Ok(queue::Endpoints::Read { disabled, endpoints: rows, version }) => {
                for (name, reason) in disabled {
                    warning!(
                        "outbox_ext: endpoint {} disabled: {}; its deliveries wait for outbox_endpoint_enable()",
                        one_line(&name, 255),
                        one_line(&reason, MAX_ERROR_BYTES)
                    );
                }
                for (name, reason) in self.endpoints.refresh(rows, version, &self.settings) {
                    log!("outbox_ext relay {}: not delivering to endpoint {name}: {reason}", self.number);
                }
                let (names, reasons) = self.endpoints.unusable();
                if !names.is_empty() {
                    if let Err(e) = queue::note_unusable_endpoints(queries, names, reasons) {
                        self.failed("recording why endpoints cannot be sent to", e, queries)?;
                    }
                }
            }
            Err(e) => self.failed("reading the endpoints", e, queries)?,
        }
        Ok(())
    }

    /// Records the attempts that finished: acknowledgements first, in a transaction of their
    /// own (kept and retried if it fails), then failures (left to their lease if that fails).
    /// True if an acknowledgement made the next delivery of an ordered key claimable.
    fn record_finished(&mut self, queries: &Queries, finished: Vec<Attempt>) -> Result<bool, Stop> {
        let (delivered, failed): (Vec<&Attempt>, Vec<&Attempt>) = finished.iter().partition(|a| a.outcome == Outcome::Delivered);
        self.slot.delivered.fetch_add(delivered.len() as i64, Ordering::Relaxed);
        self.slot.failed.fetch_add(failed.len() as i64, Ordering::Relaxed);
        for attempt in &finished {
            self.slot.attempts[attempt.outcome.class() as usize].fetch_add(1, Ordering::Relaxed);
        }
        self.slot.in_flight.store(self.sender.in_flight() as i64, Ordering::Relaxed);

        self.unrecorded_acks.extend(delivered.iter().map(|a| (a.endpoint.clone(), a.id, a.fence)));
        let mut released = false;
        if !self.unrecorded_acks.is_empty() {
            match queue::mark_sent(queries, &self.unrecorded_acks) {
                Ok(claimable) => {
                    self.unrecorded_acks.clear();
                    released = claimable > 0;
                }
                Err(e) => {
                    let what = format!("recording {} acknowledgements (kept, tried again)", self.unrecorded_acks.len());
                    self.failed(&what, e, queries)?;
                }
            }
        }
        if !failed.is_empty() {
            let failed: Vec<(&Attempt, i32)> =
                failed.into_iter().map(|a| (a, self.endpoints.max_attempts(&a.endpoint, &self.settings))).collect();
            match queue::record_failures(queries, &failed) {
                Ok(dead) => dead.iter().for_each(warn_dead),
                Err(e) => {
                    let what = format!("recording {} failed attempts (their leases will return them)", failed.len());
                    self.failed(&what, e, queries)?;
                }
            }
        }
        Ok(released)
    }

    /// Deletes one batch of deliveries sent longer ago than `outbox.retention` or dead longer
    /// than `outbox.dead_retention`, and the events they leave behind; returns when to run
    /// again: at once while there is more, after a pause once caught up.
    fn delete_expired(&mut self, queries: &Queries) -> Result<Instant, Stop> {
        let (retention, dead_retention) = (self.settings.retention, self.settings.dead_retention);
        if self.number != 1 || (retention.is_none() && dead_retention.is_none()) {
            return Ok(Instant::now() + RETENTION_PAUSE);
        }
        match queue::delete_expired(queries, retention, dead_retention, RETENTION_BATCH) {
            Ok(deleted) if deleted >= RETENTION_BATCH => Ok(Instant::now()),
            Ok(_) => Ok(Instant::now() + RETENTION_PAUSE),
            Err(e) => self.failed("deleting expired events", e, queries).map(|()| Instant::now() + RETENTION_PAUSE),
        }
    }

    /// After a statement failed: if the extension was dropped, re-created or updated, say so
    /// quietly and stop the loop; otherwise (also when even the lookup fails) log the error,
    /// once per minute while it repeats, and carry on.
    fn failed(&mut self, what: &str, error: TransactionError, queries: &Queries) -> Result<(), Stop> {
        match queue::find_installation() {
            Ok(Some(installation)) if installation == queries.installation => {}
            Ok(_) => {
                log!("outbox_ext relay {}: outbox_ext was dropped or changed in this database", self.number);
                return Err(Stop::ExtensionChanged);
            }
            Err(_) => {}
        }
        let message = format!("{what} failed: {}", one_line(&error.to_string(), MAX_ERROR_BYTES));
        let now = Instant::now();
        if self.last_warning.as_ref().is_none_or(|(said, at)| *said != message || now >= *at + REPEAT_WARNING_AFTER) {
            warning!("outbox_ext relay {}: {message}", self.number);
            self.last_warning = Some((message, now));
        }
        Ok(())
    }

    /// On SIGTERM: claim nothing more, record what finishes within the grace period, and
    /// leave the rest to lease expiry.
    fn finish_in_flight(&mut self, queries: &Queries) {
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while (self.sender.in_flight() > 0 || !self.unrecorded_acks.is_empty()) && Instant::now() < deadline {
            wake::wait(Some(self.sender.doorbell().fd()), deadline.saturating_duration_since(Instant::now()).min(ACK_RETRY));
            let finished = self.sender.take_finished();
            if self.record_finished(queries, finished).is_err() {
                return;
            }
        }
        let abandoned = self.sender.in_flight();
        if abandoned > 0 {
            log!("outbox_ext relay {}: stopping with {abandoned} requests in flight; their leases will return them", self.number);
            if let Err(e) = queue::uncount_abandoned(queries, self.sender.in_flight_attempts()) {
                warning!("outbox_ext relay {}: the abandoned attempts still count: {e}", self.number);
            }
        } else {
            log!("outbox_ext relay {} stopped", self.number);
        }
    }
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

/// Background workers must report their table statistics themselves; without this,
/// autovacuum never learns of the dead rows that claims and acknowledgements leave.
fn report_table_statistics() {
    // SAFETY: main thread, no transaction open.
    unsafe { pg_sys::pgstat_report_stat(false) };
}

fn warn_dead(delivery: &DeadDelivery) {
    // The error comes from a receiver: print it on one line.
    warning!(
        "outbox_ext: the delivery of event {} to endpoint {} is dead after {} attempts; last error: {}",
        delivery.event_id,
        one_line(&delivery.endpoint, 255),
        delivery.attempts,
        one_line(&delivery.last_error, MAX_ERROR_BYTES)
    );
}
