//! When a failed event is tried again: exponential in the number of attempts, with jitter,
//! capped, and never sooner than the receiver's `Retry-After`.

use std::time::Duration;

const BASE: Duration = Duration::from_secs(1);
pub const CAP: Duration = Duration::from_secs(3600);

/// Delay before the next attempt of an event that has been tried `attempts` times; never more
/// than `CAP`, whatever `retry_after` says.
///
/// `jitter` is a number in `[0, 1)`; the delay is spread over the upper half of the
/// exponential step ("equal jitter") so that a burst of failures does not retry in lockstep.
pub fn retry_delay(attempts: i32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    let exponent = attempts.saturating_sub(1).clamp(0, 31) as u32;
    let step = BASE.saturating_mul(1u32 << exponent.min(31)).min(CAP);
    let jittered = step.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
    jittered.max(retry_after.unwrap_or(Duration::ZERO)).min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_each_attempt() {
        assert_eq!(retry_delay(1, None, 1.0), Duration::from_secs(1));
        assert_eq!(retry_delay(2, None, 1.0), Duration::from_secs(2));
        assert_eq!(retry_delay(3, None, 1.0), Duration::from_secs(4));
        assert_eq!(retry_delay(10, None, 1.0), Duration::from_secs(512));
    }

    #[test]
    fn jitter_spreads_over_the_upper_half() {
        assert_eq!(retry_delay(3, None, 0.0), Duration::from_secs(2));
        assert_eq!(retry_delay(3, None, 0.5), Duration::from_secs(3));
        assert!(retry_delay(3, None, 0.999) < Duration::from_secs(4));
    }

    #[test]
    fn is_capped_at_an_hour() {
        assert_eq!(retry_delay(13, None, 1.0), CAP);
        assert_eq!(retry_delay(i32::MAX, None, 1.0), CAP);
    }

    #[test]
    fn never_sooner_than_retry_after() {
        assert_eq!(retry_delay(1, Some(Duration::from_secs(120)), 0.0), Duration::from_secs(120));
        assert_eq!(retry_delay(5, Some(Duration::from_secs(1)), 1.0), Duration::from_secs(16));
    }

    #[test]
    fn a_retry_after_beyond_the_cap_waits_the_cap() {
        assert_eq!(retry_delay(1, Some(Duration::MAX), 0.0), CAP);
        assert_eq!(retry_delay(1, Some(Duration::from_secs(u64::MAX)), 1.0), CAP);
    }

    #[test]
    fn odd_attempt_counts_do_not_panic() {
        assert_eq!(retry_delay(0, None, 1.0), BASE);
        assert_eq!(retry_delay(-3, None, 1.0), BASE);
    }
}
