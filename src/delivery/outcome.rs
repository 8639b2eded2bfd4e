//! What one delivery attempt came to, classified by kind rather than by matching strings.

use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The receiver answered 2xx: the event counts as sent.
    Delivered,
    /// The receiver answered something else (redirects are not followed).
    Rejected { status: u16, retry_after: Option<Duration> },
    /// No complete answer within `outbox.http_timeout`.
    TimedOut,
    /// No answer at all: refused, reset, closed mid-response, DNS, TLS.
    Unreachable(String),
}

impl Outcome {
    pub fn from_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> Outcome {
        if (200..300).contains(&status) {
            Outcome::Delivered
        } else {
            Outcome::Rejected { status, retry_after: retry_after.and_then(|v| parse_retry_after(v, now)) }
        }
    }

    /// The text stored in `outbox.last_error`; `None` for a success.
    pub fn last_error(&self) -> Option<String> {
        match self {
            Outcome::Delivered => None,
            Outcome::Rejected { status, retry_after: None } => Some(format!("HTTP {status}")),
            Outcome::Rejected { status, retry_after: Some(after) } => {
                Some(format!("HTTP {status} (Retry-After {}s)", after.as_secs()))
            }
            Outcome::TimedOut => Some("timeout".to_string()),
            Outcome::Unreachable(reason) => Some(format!("unreachable: {reason}")),
        }
    }

    /// The earliest retry the receiver asked for, if it asked.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Rejected { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// `Retry-After` is either delay-seconds or an HTTP date (RFC 9110 §10.2.3).
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap()
    }

    #[test]
    fn every_2xx_is_delivered() {
        for status in [200, 201, 202, 204, 299] {
            assert_eq!(Outcome::from_status(status, None, now()), Outcome::Delivered);
        }
    }

    #[test]
    fn redirects_client_and_server_errors_are_rejections() {
        for status in [101, 301, 302, 400, 404, 410, 429, 500, 503] {
            let outcome = Outcome::from_status(status, None, now());
            assert_eq!(outcome, Outcome::Rejected { status, retry_after: None });
            assert_eq!(outcome.last_error().unwrap(), format!("HTTP {status}"));
        }
    }

    #[test]
    fn retry_after_in_seconds() {
        let outcome = Outcome::from_status(429, Some(" 2 "), now());
        assert_eq!(outcome.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(outcome.last_error().unwrap(), "HTTP 429 (Retry-After 2s)");
    }

    #[test]
    fn retry_after_as_an_http_date() {
        let outcome = Outcome::from_status(503, Some("Sun, 06 Nov 1994 08:50:07 GMT"), now());
        assert_eq!(outcome.retry_after(), Some(Duration::from_secs(30)));
        let past = Outcome::from_status(503, Some("Sun, 06 Nov 1994 08:00:00 GMT"), now());
        assert_eq!(past.retry_after(), Some(Duration::ZERO));
    }

    #[test]
    fn unparseable_retry_after_is_ignored() {
        assert_eq!(Outcome::from_status(429, Some("soon"), now()).retry_after(), None);
        assert_eq!(Outcome::from_status(429, Some("-5"), now()).retry_after(), None);
    }

    #[test]
    fn transport_failures_have_readable_errors() {
        assert_eq!(Outcome::TimedOut.last_error().unwrap(), "timeout");
        assert_eq!(
            Outcome::Unreachable("connection refused".into()).last_error().unwrap(),
            "unreachable: connection refused"
        );
        assert_eq!(Outcome::Delivered.last_error(), None);
    }
}
