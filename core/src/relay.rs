//! The relay loop, as both drivers run it: each turn it claims what is due and starts sending
//! it, records what finished, deletes what retention expired, and waits for a commit, a
//! finished request or a timer. The database is behind `Queue`, waiting and signals behind
//! `Wake`, counters and log lines behind `Report`: the background worker implements them with
//! SPI, its latch and shared memory; the `outbox` process with a client connection, LISTEN
//! and Prometheus counters.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::delivery::{one_line, retry_delay, Attempt, AttemptKey, Destinations, Outcome, Sender, SenderError, MAX_ERROR_BYTES};
use crate::endpoints::Endpoints;
use crate::log::batch::{is_log_fence, next_log_fence, Deferrals, LogBatch, ReadStarts, Start};
use crate::log::failing::FailingEndpoints;
use crate::log::read_events;
use crate::log::routes::RouteCache;
use crate::queue::{AttemptColumns, ClaimArguments, Claimed, DeadDelivery, FailureColumns, Queue, QueueError};
use crate::settings::Settings;
pub use crate::timers::Commits;
use crate::timers::{Timers, Waiting, ACK_RETRY, SILENT_FINISH_CHECK};

/// How long a stopping relay waits for requests in flight before abandoning them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Retention deletes at most this many rows per transaction, and pauses this long once it
/// has caught up.
const RETENTION_BATCH: usize = 1_000;
const RETENTION_PAUSE: Duration = Duration::from_secs(10);
/// A failure that keeps happening is logged again after this long.
const REPEAT_WARNING_AFTER: Duration = Duration::from_secs(60);
/// Log mode: a read of the slot takes about this many changes (whole transactions; an event
/// alone in its transaction is three).
const LOG_READ_CHANGES: i32 = 6_000;
/// Reads of a streamed slot on their way at once: the next read's deliveries start as the
/// last requests of the one before finish, not once it is confirmed.
const LOG_READS_ON_THEIR_WAY: usize = 4;

/// How a driver waits, and what it was asked meanwhile.
pub trait Wake {
    /// Whether commits should wake the relay from now on: those into the table path only
    /// while it `can_claim`, and a driver for which a wakeup costs the committer something
    /// may skip them while the last claim came back full (`backlog`: it claims again without
    /// waiting); those into the log while it `reads_log`. True if commits into the table path
    /// may have gone unheard until now (the relay could not claim, or the driver lost its way
    /// of hearing them), so a claim is due at once.
    fn listen(&mut self, can_claim: bool, backlog: bool, reads_log: bool) -> bool;
    /// Waits until a commit wakes the relay, `doorbell` is readable or `timeout` passes; what
    /// the commits that woke it wrote.
    fn wait(&mut self, doorbell: RawFd, timeout: Duration) -> Commits;
    /// What the relay was asked since the last call.
    fn asked(&mut self) -> Asked;
}

/// A driver that runs the loop more than once (after the outbox went away) lends its wake.
impl<W: Wake + ?Sized> Wake for &mut W {
    fn listen(&mut self, can_claim: bool, backlog: bool, reads_log: bool) -> bool {
        (**self).listen(can_claim, backlog, reads_log)
    }

    fn wait(&mut self, doorbell: RawFd, timeout: Duration) -> Commits {
        (**self).wait(doorbell, timeout)
    }

    fn asked(&mut self) -> Asked {
        (**self).asked()
    }
}

/// A request from outside the loop, which it checks between its steps.
pub enum Asked {
    Nothing,
    /// New settings, read after a reload signal.
    Reload(Box<Settings>),
    /// Claim nothing more, record what finishes within `SHUTDOWN_GRACE`, then end.
    Stop,
    /// End at once, recording only what has already finished (the database is going away).
    Leave,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Log,
    Warning,
}

/// What the relay counts and says.
pub trait Report {
    /// Attempts that finished, whatever their outcome.
    fn finished(&mut self, attempts: &[Attempt]);
    /// Requests in flight now.
    fn in_flight(&mut self, requests: usize);
    /// A claim ran, and how long it took.
    fn claimed(&mut self, took: Duration);
    /// The relay works with the settings it last read from now on.
    fn settings_loaded(&mut self);
    /// A line for the log; the driver says which relay it comes from.
    fn log(&mut self, level: Level, text: &str);
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `Asked::Stop` or `Asked::Leave`.
    Asked,
    /// The outbox was dropped or changed (`QueueError::Gone`); what was in flight is dropped
    /// unrecorded, since it belongs to rows that are gone.
    Gone,
}

pub struct Relay<Q, W, R> {
    queue: Q,
    wake: W,
    report: R,
    settings: Settings,
    sender: Sender,
    endpoints: Endpoints,
    /// Whether this relay deletes what retention expired (one relay per database does).
    runs_retention: bool,
    /// Deliveries the receiver acknowledged whose `sent_at` could not be written yet; retried
    /// until it is, so an acknowledgement is never lost to a failed transaction. Nothing new
    /// is claimed meanwhile.
    unrecorded_acks: Vec<AttemptKey>,
    /// The last failure logged and when: the same failure is logged again only after a while.
    last_warning: Option<(String, Instant)>,
    /// The last claim left due deliveries out for want of budget: claim again as soon as a
    /// request ends, since no commit may come to say they are there.
    left_out: bool,
    /// Some endpoint's last claim came back full: more is due than one claim takes.
    backlog: bool,
    log: LogReading,
}

/// Log mode: the lease this relay holds on reading the slot (0: none), the reads on their way
/// (confirmed in order), and where recent reads began.
struct LogReading {
    fence: i64,
    /// One at a time from a queue that reads the slot itself, which hands out from its
    /// confirmed position; up to `LOG_READS_ON_THEIR_WAY` from one that streams it.
    batches: VecDeque<LogBatch>,
    /// The last read's fencing token (`next_log_fence`).
    last_read_fence: i32,
    starts: ReadStarts,
    /// The last read took as many changes as a read takes: read again once it is delivered.
    full: bool,
    /// When to renew the lease while a read is on its way.
    renew_at: Instant,
    /// Endpoints whose deliveries the next reads copy into the table path for a while.
    failing: FailingEndpoints,
    /// Where each topic read goes, by the endpoints' version.
    routes: RouteCache,
    /// The slot could not be made again or recovered: tried again at the poll, not at each
    /// commit into the log.
    slot_unready: bool,
}

impl Default for LogReading {
    fn default() -> LogReading {
        LogReading {
            fence: 0,
            batches: VecDeque::new(),
            last_read_fence: 0,
            starts: ReadStarts::default(),
            full: false,
            renew_at: Instant::now(),
            failing: FailingEndpoints::default(),
            routes: RouteCache::default(),
            slot_unready: false,
        }
    }
}

impl LogReading {
    /// The lease is lost, or taken again after it ran out: another relay may have read and
    /// confirmed past the read on its way, which is let go of (the slot was not confirmed past
    /// it here, so what it holds is read again).
    fn lease_lost(&mut self) {
        self.fence = 0;
        self.batches.clear();
        self.starts = ReadStarts::default();
    }
}

impl<Q: Queue, W: Wake, R: Report> Relay<Q, W, R> {
    pub fn new(queue: Q, wake: W, mut report: R, settings: Settings, runs_retention: bool) -> Result<Self, SenderError> {
        let sender = Sender::new(allowed_destinations(&settings, &mut report))?;
        Ok(Relay {
            queue,
            wake,
            report,
            settings,
            sender,
            endpoints: Endpoints::default(),
            runs_retention,
            unrecorded_acks: Vec::new(),
            last_warning: None,
            left_out: false,
            backlog: false,
            log: LogReading::default(),
        })
    }

    /// Runs the loop until asked to stop or the outbox goes away; requests still in flight
    /// then are abandoned to their leases.
    pub fn run(mut self) -> Ended {
        let mut timers = Timers::new();
        let Err(ended) = self.turns(&mut timers);
        self.sender.abandon();
        ended
    }

    fn turns(&mut self, timers: &mut Timers) -> Result<Infallible, Ended> {
        loop {
            let reloaded = self.stop_or_reload_if_asked(timers)?;
            // Outcomes are collected first (freeing their request slots) but written after the
            // claim: a commit's fresh event is sent before the transactions that record what
            // finished, which under a failing endpoint are most of the relay's time.
            let busy = self.sender.busy_endpoints();
            let finished = self.sender.take_finished();
            // Also when fewer endpoints are busy: each one's share of the requests grew. Room
            // a log delivery gave back is the next log delivery's: claiming at each would cost
            // a statement per delivery (or per read), and the table path's few rows in log mode
            // (retries, ordered keys) are claimed at the next commit, copy or poll.
            let table_finished: Vec<&Attempt> = finished.iter().filter(|a| !is_log_fence(a.fence)).collect();
            timers.claim_due |= self.endpoints.room_regained(&table_finished, &self.sender, &self.settings)
                || (self.left_out && !table_finished.is_empty())
                || (self.sender.busy_endpoints() < busy && !table_finished.is_empty());
            let claimed = self.claim_if_due(timers);
            // Recorded even when the claim ends the loop: these are neither in flight nor
            // recorded anywhere else. The next events of ordered keys just sent are due: claim
            // them without waiting.
            timers.claim_due |= self.record_finished(finished)?;
            claimed?;
            self.read_log_if_due(timers)?;
            if reloaded {
                // Published after the first claim under the new settings: from here on, only a
                // commit's wakeup or the new poll interval starts a claim.
                self.report.settings_loaded();
            }
            self.delete_expired_if_due(timers)?;
            let can_claim = self.can_claim();
            timers.claim_due |= self.wake.listen(can_claim, self.backlog, self.log.fence != 0);
            let doorbell = self.sender.arm_doorbell();
            let sleep = timers.sleep(Waiting {
                can_claim,
                acks_to_record: !self.unrecorded_acks.is_empty(),
                finishes_may_be_silent: doorbell.may_be_silent(),
                log_read_renews_lease_at: (!self.log.batches.is_empty()).then_some(self.log.renew_at),
                log_room: self.log_room(),
            });
            let commits = self.wake.wait(doorbell.fd(), sleep);
            timers.after_wait(commits, self.settings.poll_interval);
        }
    }

    /// Ends the loop if asked to (finishing what is in flight first, unless leaving at once);
    /// true if new settings were loaded.
    fn stop_or_reload_if_asked(&mut self, timers: &mut Timers) -> Result<bool, Ended> {
        match self.wake.asked() {
            Asked::Nothing => Ok(false),
            Asked::Reload(settings) => {
                let destinations = allowed_destinations(&settings, &mut self.report);
                self.sender.allow(destinations);
                self.settings = *settings;
                // A new lease length holds from the next read on, not from the next renewal.
                self.log.renew_at = Instant::now();
                timers.after_reload(self.settings.poll_interval);
                Ok(true)
            }
            Asked::Stop => {
                self.finish_in_flight();
                Err(Ended::Asked)
            }
            Asked::Leave => {
                // Acknowledgements already received are written first; requests still in
                // flight come back by their lease.
                let finished = self.sender.take_finished();
                let _ = self.record_finished(finished);
                Err(Ended::Asked)
            }
        }
    }

    fn claim_if_due(&mut self, timers: &mut Timers) -> Result<(), Ended> {
        if timers.claim_due && (self.can_claim() || timers.endpoints_stale) {
            let read_endpoints = std::mem::take(&mut timers.endpoints_stale);
            // None: no room, or nothing to send to; wait for a finished request or the poll.
            if let Some(full) = self.claim_and_send(read_endpoints)? {
                self.backlog = full;
                timers.after_claim(full, self.settings.poll_interval);
            }
        }
        Ok(())
    }

    fn delete_expired_if_due(&mut self, timers: &mut Timers) -> Result<(), Ended> {
        if timers.cleanup_due() {
            timers.next_cleanup = self.delete_expired()?;
        }
        Ok(())
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
    fn claim_and_send(&mut self, read_endpoints: bool) -> Result<Option<bool>, Ended> {
        if read_endpoints {
            self.read_endpoints()?;
        }
        let plan = self.endpoints.claim_plan(&self.sender, &self.settings);
        if plan.claims.is_empty() || !self.unrecorded_acks.is_empty() {
            return Ok(None);
        }
        let started = Instant::now();
        let rows = self.queue.claim_batch(&ClaimArguments::new(&plan), self.endpoints.version);
        self.report.claimed(started.elapsed());
        match rows {
            // Claims again with what the endpoints are now (once: a change during this claim
            // is seen by the next one). A new secret signs every attempt started after its
            // rotation committed.
            Ok(None) if !read_endpoints => self.claim_and_send(true),
            Ok(None) => Ok(Some(true)),
            Ok(Some(rows)) => {
                let claimed = Claimed::from_rows(rows, &plan);
                self.left_out = claimed.left_out;
                claimed.dead.iter().for_each(|dead| self.warn_dead(dead));
                let full = plan.claims.iter().any(|claim| claimed.taken(&claim.endpoint) == claim.limit);
                for delivery in claimed.deliveries {
                    if let Some(target) = self.endpoints.target(&delivery.endpoint) {
                        self.sender.send(&target, delivery);
                    }
                }
                self.report.in_flight(self.sender.in_flight());
                Ok(Some(full))
            }
            Err(e) => self.failed("claiming deliveries", e).map(|()| Some(false)),
        }
    }

    /// Log mode: starts what the reads on their way have room for and confirms each once
    /// delivered; with room for another read (none on its way, or the queue reads ahead) and
    /// one due, takes the lease and reads the slot's next transactions. Deliveries only the
    /// table path makes (and failures) are copied there.
    fn read_log_if_due(&mut self, timers: &mut Timers) -> Result<(), Ended> {
        if self.log_room() {
            let woken = std::mem::take(&mut timers.log_woken) && self.log.fence != 0 && !self.log.slot_unready;
            if std::mem::take(&mut timers.log_due) || woken {
                self.read_log(timers)?;
            }
        }
        if !self.log.batches.is_empty() && Instant::now() >= self.log.renew_at {
            self.lease_log(timers)?;
        }
        self.start_log_deliveries();
        if let Some(copied) = self.confirm_log_if_done()? {
            timers.claim_due |= copied;
            // Commits while the read was on its way are read at once, not at the poll.
            timers.log_due = self.log.full || std::mem::take(&mut timers.log_woken);
        }
        Ok(())
    }

    /// Whether another read of the log may begin: none is on its way, or the queue reads ahead
    /// and fewer than `LOG_READS_ON_THEIR_WAY` are.
    fn log_room(&self) -> bool {
        let on_their_way = self.log.batches.len();
        on_their_way == 0 || (on_their_way < LOG_READS_ON_THEIR_WAY && self.queue.log_reads_ahead(self.log.fence))
    }

    fn read_log(&mut self, timers: &mut Timers) -> Result<(), Ended> {
        // The read checks the lease itself: it is renewed, and the slot looked at, only when due
        // (doing so at each read took a seventh of the reader's time).
        let fence = if self.log.fence != 0 && Instant::now() < self.log.renew_at {
            self.log.fence
        } else {
            let Some(fence) = self.lease_log(timers)? else { return Ok(()) };
            fence
        };
        let after = self.log.batches.back().map_or(0, |batch| batch.end);
        let rows = match self.queue.log_read(fence, LOG_READ_CHANGES, after) {
            Ok(Some(rows)) => rows,
            Ok(None) => {
                self.log.lease_lost();
                return Ok(());
            }
            Err(e) => {
                // The slot may be gone: the next read looks at it first.
                self.log.renew_at = Instant::now();
                return self.failed("reading the log's slot", e);
            }
        };
        self.log.full = rows.messages.len() >= LOG_READ_CHANGES as usize;
        self.log.starts.note(rows.began_at as u64, rows.oldest);
        let read = match read_events(rows.messages.iter().map(Vec::as_slice), rows.log_relation) {
            Ok(read) => read,
            // Left in the slot, and said at each read: nothing is skipped unread.
            Err(e) => return self.failed("reading the log's slot", QueueError::Failed(e.to_string())),
        };
        let Some(end) = read.end else {
            // Nothing committed in the log up to what was flushed when the read began: the slot
            // keeps no WAL of other tables up to there (unless reads before are on their way).
            let flushed = rows.flushed_at as u64;
            if flushed == 0 || !self.log.batches.is_empty() {
                return Ok(());
            }
            if let Err(e) = self.queue.log_confirm(fence, flushed, self.log.starts.oldest_for(flushed)) {
                self.failed("confirming the log's slot", e)?;
            }
            return Ok(());
        };
        // Routed by the endpoints as they were when the read began, read again first if they
        // changed (as for a claim: a new secret signs every attempt started after its rotation
        // committed).
        if rows.endpoints_version != self.endpoints.version {
            self.read_endpoints()?;
            if self.endpoints.version < rows.endpoints_version {
                // They could not be read (said there): routed by the old ones, an endpoint
                // subscribed since would miss these events. Read again at the poll.
                return Ok(());
            }
        }
        let topics = self.log.routes.missing(&read.events, self.endpoints.version);
        if !topics.is_empty() {
            match self.queue.log_route(&topics) {
                Ok(found) => self.log.routes.insert(topics, found),
                Err(e) => return self.failed("routing the events read from the log", e),
            }
        }
        let routes = self.log.routes.routes(&read.events);
        let now = Instant::now();
        let (endpoints, failing) = (&self.endpoints, &self.log.failing);
        self.log.last_read_fence = next_log_fence(self.log.last_read_fence);
        let fence = self.log.last_read_fence;
        let sendable = |name: &str| endpoints.sendable(name).filter(|_| !failing.holds(name, now));
        self.log.batches.push_back(LogBatch::new(read.events, end, fence, routes, sendable));
        // A full read leaves more to read: at once if there is room for it, else once the
        // reads on their way are confirmed.
        timers.log_due |= self.log.full;
        Ok(())
    }

    /// The lease on reading the slot, taken or renewed; a slot found missing or lost is made
    /// again first and what it may have held recovered into the table path. `None` while
    /// another relay reads it.
    fn lease_log(&mut self, timers: &mut Timers) -> Result<Option<i64>, Ended> {
        let lease = match self.queue.log_lease(self.log.fence, self.settings.lease) {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                self.log.lease_lost();
                return Ok(None);
            }
            Err(e) => {
                // A read on its way renews when due: not again at once, in a loop, nor so late
                // that the lease runs out meanwhile.
                self.log.renew_at = Instant::now() + self.settings.poll_interval.min(self.settings.lease / 4);
                return self.failed("taking the lease on the log", e).map(|()| None);
            }
        };
        if lease.fence != self.log.fence {
            self.log.lease_lost();
            self.log.fence = lease.fence;
        }
        self.log.renew_at = Instant::now() + self.settings.lease / 2;
        self.log.slot_unready = !lease.slot_ready;
        if !lease.slot_ready {
            // Reads on their way are of the slot that was lost: their events are recovered, and
            // their ends are no positions of the new slot's.
            self.log.batches.clear();
            self.log.starts = ReadStarts::default();
            // Tried again at the next poll's read (no read is on its way now, and commits do
            // not wake it: slot_unready), which renews the lease first. Until the recovery
            // has run, the new slot is neither read nor confirmed (sql/log.sql).
            if let Err(e) = self.queue.log_make_slot(lease.fence) {
                self.log.renew_at = Instant::now();
                return self.failed("making the log's slot", e).map(|()| None);
            }
            match self.queue.log_recover(lease.fence) {
                Ok(recovered) => {
                    let text = format!("made the log's slot; {recovered} deliveries of events it did not hold copied into the table");
                    self.report.log(Level::Log, &text);
                    timers.claim_due = true;
                    self.log.slot_unready = false;
                }
                Err(e) => {
                    self.log.renew_at = Instant::now();
                    return self.failed("recovering the events of the log's slot", e).map(|()| None);
                }
            }
        }
        Ok(Some(lease.fence))
    }

    /// In the order read: a later read's deliveries take the room an earlier one's leave.
    fn start_log_deliveries(&mut self) {
        let (endpoints, sender, settings) = (&self.endpoints, &mut self.sender, &self.settings);
        for batch in self.log.batches.iter_mut() {
            batch.start(|event| match endpoints.target(&event.endpoint) {
                Some(target) if endpoints.has_room(&event.endpoint, sender, settings) => {
                    sender.send(&target, event);
                    Start::Started
                }
                Some(_) => Start::NoRoom(event),
                None => Start::Unsendable(event),
            });
        }
        self.report.in_flight(self.sender.in_flight());
    }

    /// Once every delivery of the first reads on their way is acknowledged or failed: copies
    /// into the table path what goes there, then confirms the slot up to the last of them.
    /// Whether it copied any, if it confirmed.
    fn confirm_log_if_done(&mut self) -> Result<Option<bool>, Ended> {
        let done = self.log.batches.iter().take_while(|batch| batch.is_done()).count();
        if done == 0 {
            return Ok(None);
        }
        let mut copied = false;
        for batch in self.log.batches.iter_mut().take(done).filter(|batch| !batch.deferrals.is_empty()) {
            if let Err(e) = self.queue.log_defer(&batch.deferrals) {
                return self.failed("copying deliveries read from the log into the table", e).map(|()| None);
            }
            batch.deferrals = Deferrals::default();
            copied = true;
        }
        let end = self.log.batches[done - 1].end;
        let oldest = self.log.starts.oldest_for(end);
        match self.queue.log_confirm(self.log.fence, end, oldest) {
            Ok(true) => {
                self.log.batches.drain(..done);
                Ok(Some(copied))
            }
            Ok(false) => {
                self.report.log(Level::Warning, "another relay reads the log now; this one's last read may be sent again");
                self.log.lease_lost();
                Ok(None)
            }
            Err(e) => self.failed("confirming the log's slot", e).map(|()| None),
        }
    }

    /// Reads the webhook endpoints, after disabling those that have failed for longer than
    /// `endpoint_disable_after`. Done at each poll and reload, not at each commit's wakeup:
    /// endpoint changes reach the relay within a poll interval, while the claim itself leaves
    /// out an endpoint disabled or dropped since at once.
    fn read_endpoints(&mut self) -> Result<(), Ended> {
        let read = match self.queue.load_endpoints(self.settings.endpoint_disable_after) {
            Ok(read) => read,
            Err(e) => return self.failed("reading the endpoints", e),
        };
        for (name, reason) in read.disabled {
            let text = format!(
                "endpoint {} disabled: {}; its deliveries wait for outbox_endpoint_enable()",
                one_line(&name, 255),
                one_line(&reason, MAX_ERROR_BYTES)
            );
            self.report.log(Level::Warning, &text);
        }
        for (name, reason) in self.endpoints.refresh(read.endpoints, read.version, &self.settings) {
            self.report.log(Level::Log, &format!("not delivering to endpoint {name}: {reason}"));
        }
        let (names, reasons) = self.endpoints.unusable();
        if !names.is_empty() {
            if let Err(e) = self.queue.note_unusable_endpoints(&names, &reasons) {
                self.failed("recording why endpoints cannot be sent to", e)?;
            }
        }
        Ok(())
    }

    /// Records the attempts that finished: acknowledgements first, in a transaction of their
    /// own (kept and retried if it fails), then failures (left to their lease if that fails).
    /// True if an acknowledgement made the next delivery of an ordered key claimable.
    fn record_finished(&mut self, finished: Vec<Attempt>) -> Result<bool, Ended> {
        self.report.finished(&finished);
        self.report.in_flight(self.sender.in_flight());
        let (from_log, finished): (Vec<Attempt>, Vec<Attempt>) = finished.into_iter().partition(|a| is_log_fence(a.fence));
        for attempt in &from_log {
            self.log.failing.note(attempt, fastrand::f64(), Instant::now());
            let retry_in = retry_delay(attempt.attempts, attempt.outcome.retry_after(), fastrand::f64());
            for batch in self.log.batches.iter_mut() {
                batch.finished(attempt, retry_in);
            }
        }
        let (delivered, failed): (Vec<Attempt>, Vec<Attempt>) = finished.into_iter().partition(|a| a.outcome == Outcome::Delivered);
        self.unrecorded_acks.extend(delivered.into_iter().map(|a| (a.endpoint, a.id, a.fence)));
        let mut released = false;
        if !self.unrecorded_acks.is_empty() {
            match self.queue.mark_sent(&self.unrecorded_acks.iter().collect()) {
                Ok(claimable) => {
                    self.unrecorded_acks.clear();
                    released = claimable > 0;
                }
                Err(e) => {
                    let what = format!("recording {} acknowledgements (kept, tried again)", self.unrecorded_acks.len());
                    self.failed(&what, e)?;
                }
            }
        }
        if !failed.is_empty() {
            let capped: Vec<(&Attempt, i32)> = failed.iter().map(|a| (a, self.endpoints.max_attempts(&a.endpoint))).collect();
            match self.queue.record_failures(&FailureColumns::new(&capped, fastrand::f64)) {
                Ok(dead) => dead.iter().for_each(|dead| self.warn_dead(dead)),
                Err(e) => {
                    let what = format!("recording {} failed attempts (their leases will return them)", failed.len());
                    self.failed(&what, e)?;
                }
            }
        }
        Ok(released)
    }

    /// Deletes one batch of deliveries sent longer ago than `retention` or dead longer than
    /// `dead_retention`, and the events they leave behind; returns when to run again: at once
    /// while there is more, after a pause once caught up.
    /// Log mode's retention comes with it: the log's partitions read and confirmed are
    /// dropped, and those of the next hours made.
    fn delete_expired(&mut self) -> Result<Instant, Ended> {
        if !self.runs_retention {
            return Ok(Instant::now() + RETENTION_PAUSE);
        }
        let (retention, dead_retention) = (self.settings.retention, self.settings.dead_retention);
        if retention.is_some() || dead_retention.is_some() {
            match self.queue.delete_expired(retention, dead_retention, RETENTION_BATCH) {
                Ok(deleted) if deleted >= RETENTION_BATCH => return Ok(Instant::now()),
                Ok(_) => {}
                Err(e) => self.failed("deleting expired events", e)?,
            }
        }
        if let Err(e) = self.queue.log_maintain() {
            self.failed("making and dropping the log's partitions", e)?;
        }
        Ok(Instant::now() + RETENTION_PAUSE)
    }

    /// After a statement failed: if the outbox is gone, end the loop; otherwise log the
    /// error, once per minute while it repeats, and carry on.
    fn failed(&mut self, what: &str, error: QueueError) -> Result<(), Ended> {
        let QueueError::Failed(error) = error else {
            self.report.log(Level::Log, "the outbox was dropped or changed in this database");
            return Err(Ended::Gone);
        };
        let message = format!("{what} failed: {}", one_line(&error, MAX_ERROR_BYTES));
        let now = Instant::now();
        if self.last_warning.as_ref().is_none_or(|(said, at)| *said != message || now >= *at + REPEAT_WARNING_AFTER) {
            self.report.log(Level::Warning, &message);
            self.last_warning = Some((message, now));
        }
        Ok(())
    }

    /// Claims nothing more, records what finishes within the grace period, and leaves the
    /// rest to lease expiry, taking back the attempts it counted.
    fn finish_in_flight(&mut self) {
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while (self.sender.in_flight() > 0 || !self.unrecorded_acks.is_empty()) && Instant::now() < deadline {
            let doorbell = self.sender.arm_doorbell();
            let check = if doorbell.may_be_silent() { SILENT_FINISH_CHECK } else { ACK_RETRY };
            self.wake.wait(doorbell.fd(), deadline.saturating_duration_since(Instant::now()).min(check));
            let finished = self.sender.take_finished();
            if self.record_finished(finished).is_err() {
                return;
            }
        }
        // What the log's last read delivered is not sent again by the next reader, which need
        // not wait for this one's lease to run out. (A failure to confirm is logged there; the
        // outbox gone, there is nothing to let go.)
        if self.confirm_log_if_done().is_ok() && self.log.fence != 0 {
            if let Err(e) = self.queue.log_lease(self.log.fence, Duration::ZERO) {
                self.report
                    .log(Level::Warning, &format!("the log's lease could not be let go; the next reader waits for it to run out: {e}"));
            }
        }
        let abandoned = self.sender.in_flight();
        if abandoned > 0 {
            self.report.log(Level::Log, &format!("stopping with {abandoned} requests in flight; their leases will return them"));
            let attempts: AttemptColumns = self.sender.in_flight_attempts().filter(|(_, _, fence)| !is_log_fence(*fence)).collect();
            if let Err(e) = self.queue.uncount_abandoned(&attempts) {
                self.report.log(Level::Warning, &format!("the abandoned attempts still count: {e}"));
            }
        } else {
            self.report.log(Level::Log, "stopped");
        }
    }

    fn warn_dead(&mut self, delivery: &DeadDelivery) {
        // The error comes from a receiver: print it on one line.
        let text = format!(
            "the delivery of event {} to endpoint {} is dead after {} attempts; last error: {}",
            delivery.event_id,
            one_line(&delivery.endpoint, 255),
            delivery.attempts,
            one_line(&delivery.last_error, MAX_ERROR_BYTES)
        );
        self.report.log(Level::Warning, &text);
    }
}

/// `allowed_destinations`, within the server's if the driver read it, as the sender takes it.
/// A driver refuses a value that does not parse; should one get through all the same, nothing
/// is allowed, rather than everything.
fn allowed_destinations(settings: &Settings, report: &mut impl Report) -> Destinations {
    let mut parse = |list: &str| {
        Destinations::parse(list).unwrap_or_else(|e| {
            report.log(Level::Warning, &format!("allowed_destinations is not valid, so no destination is allowed: {e}"));
            Destinations::default()
        })
    };
    let own = parse(&settings.allowed_destinations);
    match &settings.server_allowed_destinations {
        Some(server) => own.within(parse(server)),
        None => own,
    }
}
