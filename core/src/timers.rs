//! When the relay loop's next claim and retention pass are due, and how long it may sleep.

use std::time::{Duration, Instant};

/// How soon acknowledgements that could not be recorded are tried again.
pub const ACK_RETRY: Duration = Duration::from_millis(500);

/// How long a finished attempt may go unheard while the doorbell waits for more to finish
/// (`Doorbell::ring_at`): the results of a few quick requests among many slow ones.
pub const SILENT_FINISH_CHECK: Duration = Duration::from_millis(5);

/// `timeout` in the whole milliseconds a wait takes (poll(2), `WaitLatch`), rounded up:
/// rounded down, the last millisecond before a timer was due became waits of 0, and the loop
/// turned hundreds of times without sleeping until the timer was due.
pub fn wait_millis(timeout: Duration) -> i32 {
    timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
}

/// What the commits that ended a wait wrote: deliveries into the table path (a claim is
/// due), events into the log (a read is due, for the relay reading it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commits {
    pub table: bool,
    pub log: bool,
}

/// What the relay is doing as it goes to wait.
#[derive(Debug, Clone, Copy, Default)]
pub struct Waiting {
    /// Some endpoint has room for a claim.
    pub can_claim: bool,
    /// Acknowledgements could not be recorded and are kept to try again.
    pub acks_to_record: bool,
    /// The doorbell waits for several attempts to finish (`Doorbell::ring_at`).
    pub finishes_may_be_silent: bool,
    /// While deliveries of a read of the log are on their way: when the lease on reading the
    /// log is renewed.
    pub log_read_renews_lease_at: Option<Instant>,
    /// Another read of the log may begin: none is on its way, or the queue reads ahead.
    pub log_room: bool,
}

/// When the loop's next claim and retention pass are due.
pub struct Timers {
    /// A commit woke the worker, the last claim came back full, the worker can claim again
    /// after it could not, or an acknowledgement made ordered deliveries claimable.
    pub claim_due: bool,
    /// The poll or a reload happened since the endpoints were last read: read them again even
    /// if none of those read last could take a claim (one may have been fixed or added).
    pub endpoints_stale: bool,
    /// Log mode: read the slot (the log's poll, or the last read was full).
    pub log_due: bool,
    /// Log mode: a commit woke the worker, which reads the slot if it holds the lease on it
    /// (others try at the poll, so that a commit costs a relay in table mode nothing more).
    pub log_woken: bool,
    next_poll: Instant,
    /// The log's own poll, which a claim does not put off: back in table mode, a relay that
    /// claims all the time still reads the log until it is delivered and its slot dropped
    /// (sql/log.sql), and meanwhile confirms the slot past the table's writes. Put off with
    /// the claims, it did not: the slot kept 114 MB of WAL after 20 s at 5,000 events/s.
    next_log_poll: Instant,
    pub next_cleanup: Instant,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers::new()
    }
}

impl Timers {
    pub fn new() -> Timers {
        Timers {
            claim_due: true,
            endpoints_stale: true,
            log_due: true,
            log_woken: false,
            next_poll: Instant::now(),
            next_log_poll: Instant::now(),
            next_cleanup: Instant::now(),
        }
    }

    /// New settings may enable delivery, or shorten the retention or the poll interval (a
    /// poll armed under a longer one would otherwise keep the worker asleep until then).
    pub fn after_reload(&mut self, poll_interval: Duration) {
        self.claim_due = true;
        self.endpoints_stale = true;
        self.log_due = true;
        self.next_cleanup = Instant::now();
        self.next_poll = self.next_poll.min(Instant::now() + poll_interval);
        self.next_log_poll = self.next_log_poll.min(Instant::now() + poll_interval);
    }

    pub fn after_claim(&mut self, full: bool, poll_interval: Duration) {
        self.claim_due = full;
        self.next_poll = Instant::now() + poll_interval;
    }

    pub fn cleanup_due(&self) -> bool {
        Instant::now() >= self.next_cleanup
    }

    /// How long to wait: not at all while a claim is due and possible, or a read of the log
    /// (once the read on its way is confirmed); else until the next poll, retention pass or
    /// retry of unrecorded acknowledgements, and no longer than `SILENT_FINISH_CHECK` while the
    /// doorbell may not ring for an attempt that finished.
    pub fn sleep(&self, relay: Waiting) -> Duration {
        if (self.claim_due && relay.can_claim) || (self.log_due && relay.log_room) {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut until = self.next_poll.min(self.next_log_poll).min(self.next_cleanup);
        if relay.acks_to_record {
            until = until.min(now + ACK_RETRY);
        }
        if relay.finishes_may_be_silent {
            until = until.min(now + SILENT_FINISH_CHECK);
        }
        if let Some(renew) = relay.log_read_renews_lease_at {
            until = until.min(renew);
        }
        until.saturating_duration_since(now)
    }

    /// A commit's wakeup makes a claim or a read due; so do the poll timers, which then re-arm
    /// themselves.
    pub fn after_wait(&mut self, commits: Commits, poll_interval: Duration) {
        let now = Instant::now();
        if now >= self.next_poll {
            self.claim_due = true;
            self.endpoints_stale = true;
            self.next_poll = now + poll_interval;
        }
        if now >= self.next_log_poll {
            self.log_due = true;
            self.next_log_poll = now + poll_interval;
        }
        // Not endpoints_stale: a busy database commits thousands of times a second, and each
        // commit wakes the workers that can claim; endpoint changes are picked up at the next
        // poll.
        self.claim_due |= commits.table;
        self.log_woken |= commits.log;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_never_shorter_than_its_timeout() {
        assert_eq!(wait_millis(Duration::ZERO), 0);
        assert_eq!(wait_millis(Duration::from_micros(1)), 1, "a timer due within a millisecond is waited for");
        assert_eq!(wait_millis(Duration::from_micros(4_200)), 5);
        assert_eq!(wait_millis(Duration::from_millis(5)), 5);
        assert_eq!(wait_millis(Duration::from_secs(u64::MAX)), i32::MAX);
    }

    #[test]
    fn a_new_loop_claims_and_reads_the_endpoints_at_once() {
        let timers = Timers::new();
        assert!(timers.claim_due && timers.endpoints_stale);
        assert_eq!(timers.sleep(Waiting { can_claim: true, ..Waiting::default() }), Duration::ZERO);
    }

    #[test]
    fn after_a_claim_that_was_not_full_the_loop_sleeps_until_the_poll() {
        let mut timers = Timers::new();
        timers.next_cleanup = Instant::now() + Duration::from_secs(3600);
        timers.next_log_poll = Instant::now() + Duration::from_secs(60);
        // The first claim reads the endpoints (the loop takes endpoints_stale) and is not full;
        // the first read of the log (which takes log_due) found nothing.
        timers.endpoints_stale = false;
        timers.log_due = false;
        timers.after_claim(false, Duration::from_secs(60));
        let sleep = timers.sleep(Waiting { can_claim: true, ..Waiting::default() });
        assert!(sleep > Duration::from_secs(59) && sleep <= Duration::from_secs(60), "{sleep:?}");
        let can_claim = Waiting { can_claim: true, ..Waiting::default() };
        assert!(timers.sleep(Waiting { acks_to_record: true, ..can_claim }) <= ACK_RETRY, "acknowledgements to record are retried sooner");
        assert!(
            timers.sleep(Waiting { finishes_may_be_silent: true, ..can_claim }) <= SILENT_FINISH_CHECK,
            "a finished attempt the doorbell has not rung for is looked for"
        );
        timers.after_wait(Commits { table: false, log: true }, Duration::from_secs(60));
        assert!(!timers.claim_due && timers.log_woken && !timers.log_due, "a commit into the log reads it, and claims nothing");
        timers.log_due = true;
        let renew_at = Instant::now() + Duration::from_secs(5);
        let reading = Waiting { log_read_renews_lease_at: Some(renew_at), ..can_claim };
        let sleep = timers.sleep(reading);
        assert!(
            sleep > Duration::from_secs(4) && sleep <= Duration::from_secs(5),
            "the next read waits for the one on its way, and the lease's renewal does not: {sleep:?}"
        );
        let ahead = Waiting { log_room: true, ..reading };
        assert_eq!(timers.sleep(ahead), Duration::ZERO, "a queue that reads ahead reads before the read on its way is confirmed");
        timers.log_due = false;
        timers.after_wait(Commits { table: true, log: false }, Duration::from_secs(60));
        assert!(timers.claim_due && !timers.endpoints_stale, "a commit into the table path claims without reading the endpoints");
    }

    #[test]
    fn claims_do_not_put_off_the_read_of_the_log_at_the_poll() {
        let mut timers = Timers::new();
        timers.log_due = false;
        timers.after_claim(false, Duration::from_secs(60));
        timers.after_wait(Commits::default(), Duration::from_secs(60));
        assert!(timers.log_due, "the log's poll is due although a claim just ran");
        timers.log_due = false;
        timers.after_claim(false, Duration::from_secs(60));
        timers.after_wait(Commits::default(), Duration::from_secs(60));
        assert!(!timers.log_due, "and then not before the next poll interval");
    }

    #[test]
    fn a_reload_to_a_shorter_poll_interval_takes_effect_at_once() {
        let mut timers = Timers::new();
        timers.after_claim(false, Duration::from_secs(3600));
        timers.after_reload(Duration::from_secs(1));
        timers.claim_due = false;
        timers.log_due = false;
        timers.next_cleanup = Instant::now() + Duration::from_secs(3600);
        assert!(timers.sleep(Waiting { can_claim: true, ..Waiting::default() }) <= Duration::from_secs(1));
    }
}
