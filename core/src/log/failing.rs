//! Endpoints a delivery read from the log failed to. Until their backoff has passed, the next
//! reads copy their deliveries into the table path instead of sending them: an endpoint that
//! times out would otherwise hold every read, and so every other endpoint, back a timeout long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::batch::is_later_read;
use crate::delivery::{retry_delay, Attempt, Outcome};

#[derive(Debug, Default)]
pub struct FailingEndpoints {
    endpoints: HashMap<Arc<str>, Failing>,
}

#[derive(Debug)]
struct Failing {
    /// Reads in a row whose deliveries to it failed: the backoff grows with them.
    reads: i32,
    /// The fencing token of the last of those reads: the failures of one read count once.
    last_read: i32,
    until: Instant,
}

impl FailingEndpoints {
    /// A delivery read from the log finished: a success clears its endpoint; the first failure
    /// of a read puts it off for longer than the last.
    pub fn note(&mut self, attempt: &Attempt, jitter: f64, now: Instant) {
        if attempt.outcome == Outcome::Delivered {
            self.endpoints.remove(&attempt.endpoint);
            return;
        }
        // Log fences are negative (next_log_fence): 0 is no read's. With reads on their way at
        // once, failures of two reads interleave: only a later read's counts again.
        let failing = self.endpoints.entry(attempt.endpoint.clone()).or_insert(Failing { reads: 0, last_read: 0, until: now });
        if is_later_read(attempt.fence, failing.last_read) {
            failing.reads = failing.reads.saturating_add(1);
            failing.last_read = attempt.fence;
            failing.until = now + retry_delay(failing.reads, attempt.outcome.retry_after(), jitter);
        }
    }

    /// Whether a read at `now` copies the endpoint's deliveries instead of sending them.
    pub fn holds(&self, endpoint: &str, now: Instant) -> bool {
        self.endpoints.get(endpoint).is_some_and(|failing| failing.until > now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn attempt(endpoint: &str, fence: i32, outcome: Outcome) -> Attempt {
        Attempt { endpoint: Arc::from(endpoint), id: 1, attempts: 1, fence, outcome, took: Duration::ZERO }
    }

    #[test]
    fn the_failures_of_one_read_count_once_and_each_read_in_a_row_puts_the_endpoint_off_longer() {
        let (mut failing, now) = (FailingEndpoints::default(), Instant::now());
        for _ in 0..20 {
            failing.note(&attempt("slow", -1, Outcome::TimedOut), 0.0, now);
        }
        let first = retry_delay(1, None, 0.0);
        assert!(failing.holds("slow", now + first - Duration::from_millis(1)));
        assert!(!failing.holds("slow", now + first), "twenty failures of one read: the first backoff only");
        assert!(!failing.holds("fast", now));
        failing.note(&attempt("slow", -2, Outcome::TimedOut), 0.0, now + first);
        assert!(failing.holds("slow", now + first + retry_delay(2, None, 0.0) - Duration::from_millis(1)), "the next read's: longer");
    }

    #[test]
    fn a_delivery_clears_its_endpoint() {
        let (mut failing, now) = (FailingEndpoints::default(), Instant::now());
        failing.note(&attempt("hook", -1, Outcome::Unreachable("refused".into())), 0.5, now);
        assert!(failing.holds("hook", now));
        failing.note(&attempt("hook", -2, Outcome::Delivered), 0.5, now);
        assert!(!failing.holds("hook", now));
    }
}
