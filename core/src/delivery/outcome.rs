//! What one delivery attempt came to, classified by kind rather than by matching strings.

use std::time::{Duration, SystemTime};

use super::backoff::CAP;

/// `outbox.last_error` keeps at most this many bytes of what an attempt saw.
pub const MAX_ERROR_BYTES: usize = 1024;

/// The history of failed attempts keeps at most this many bytes of the receiver's answer.
pub const MAX_RESPONSE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The receiver answered 2xx: the event counts as sent.
    Delivered,
    /// The receiver answered something else (redirects are not followed), or a status no
    /// HTTP version defines (hyper accepts 100–999). `response` is the start of its answer
    /// (at most `MAX_RESPONSE_BYTES`, as text), for the history of failed attempts.
    Rejected { status: u16, retry_after: Option<Duration>, response: String },
    /// No complete answer within `outbox.http_timeout`.
    TimedOut,
    /// No answer at all: refused, reset, closed mid-response, DNS, TLS.
    Unreachable(String),
    /// Not attempted: the destination's address is outside `outbox.allowed_destinations`.
    Refused,
}

impl Outcome {
    pub fn from_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> Outcome {
        if (200..300).contains(&status) {
            Outcome::Delivered
        } else {
            Outcome::Rejected { status, retry_after: retry_after.and_then(|v| parse_retry_after(v, now)), response: String::new() }
        }
    }

    /// The text stored in `outbox.last_error`: one line of at most `MAX_ERROR_BYTES` without
    /// control characters, whatever the receiver or the network said; `None` for a success.
    pub fn last_error(&self) -> Option<String> {
        let text = match self {
            Outcome::Delivered => None,
            Outcome::Rejected { status, retry_after: None, .. } => Some(format!("HTTP {status}")),
            Outcome::Rejected { status, retry_after: Some(after), .. } => Some(format!("HTTP {status} (Retry-After {}s)", after.as_secs())),
            Outcome::TimedOut => Some("timeout".to_string()),
            Outcome::Unreachable(reason) => Some(format!("unreachable: {reason}")),
            Outcome::Refused => Some(super::destinations::REFUSED.to_string()),
        };
        text.map(|t| one_line(&t, MAX_ERROR_BYTES))
    }

    /// The receiver's status, when it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The start of the receiver's answer to a failed attempt, when it answered one.
    pub fn response(&self) -> Option<&str> {
        match self {
            Outcome::Rejected { response, .. } => Some(response),
            _ => None,
        }
    }

    /// The earliest retry the receiver asked for, if it asked.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::Rejected { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// What the workers count attempts by (`outbox_worker_attempts()`).
    pub fn class(&self) -> OutcomeClass {
        match self {
            Outcome::Delivered => OutcomeClass::Success,
            Outcome::Rejected { status: 400..=499, .. } => OutcomeClass::ClientError,
            Outcome::Rejected { status: 500..=599, .. } => OutcomeClass::ServerError,
            Outcome::Rejected { .. } => OutcomeClass::OtherStatus,
            Outcome::TimedOut => OutcomeClass::Timeout,
            Outcome::Unreachable(_) | Outcome::Refused => OutcomeClass::Unreachable,
        }
    }
}

/// An attempt's outcome as an operator counts it: a few classes, so that a metric labelled
/// with it stays small whatever receivers answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    Success,
    ClientError,
    ServerError,
    /// A status that is neither 2xx, 4xx nor 5xx (redirects are not followed).
    OtherStatus,
    Timeout,
    Unreachable,
}

impl OutcomeClass {
    pub const ALL: [OutcomeClass; 6] = [
        OutcomeClass::Success,
        OutcomeClass::ClientError,
        OutcomeClass::ServerError,
        OutcomeClass::OtherStatus,
        OutcomeClass::Timeout,
        OutcomeClass::Unreachable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            OutcomeClass::Success => "2xx",
            OutcomeClass::ClientError => "4xx",
            OutcomeClass::ServerError => "5xx",
            OutcomeClass::OtherStatus => "other_status",
            OutcomeClass::Timeout => "timeout",
            OutcomeClass::Unreachable => "unreachable",
        }
    }
}

/// `Retry-After` is either delay-seconds or an HTTP date (RFC 9110 §10.2.3). Whatever it
/// says, the delay is at most the backoff's cap (an hour); anything else is ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "later than the cap".
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(CAP));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO).min(CAP))
}

/// `text` as one printable line of at most `max_bytes`: control characters (newlines too)
/// become spaces, so that nothing a receiver sends can forge a log line, and a cut never
/// splits a character.
pub fn one_line(text: &str, max_bytes: usize) -> String {
    let mut line = String::with_capacity(text.len().min(max_bytes));
    for c in text.chars().map(|c| if c.is_control() { ' ' } else { c }) {
        if line.len() + c.len_utf8() > max_bytes {
            break;
        }
        line.push(c);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap()
    }

    #[test]
    fn attempts_are_counted_by_status_class_timeout_and_unreachable() {
        let cases = [
            (Outcome::Delivered, "2xx"),
            (Outcome::from_status(404, None, now()), "4xx"),
            (Outcome::from_status(429, Some("5"), now()), "4xx"),
            (Outcome::from_status(503, None, now()), "5xx"),
            (Outcome::from_status(302, None, now()), "other_status"),
            (Outcome::from_status(999, None, now()), "other_status"),
            (Outcome::TimedOut, "timeout"),
            (Outcome::Unreachable("connection refused".into()), "unreachable"),
        ];
        for (outcome, label) in cases {
            assert_eq!(outcome.class().label(), label, "{outcome:?}");
        }
        // Each class is where ALL says, so a counter array indexed by it is labelled right.
        for (index, class) in OutcomeClass::ALL.iter().enumerate() {
            assert_eq!(*class as usize, index);
        }
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
            assert_eq!(outcome, Outcome::Rejected { status, retry_after: None, response: String::new() });
            assert_eq!(outcome.status(), Some(status));
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
        for garbage in ["soon", "-5", "1e308", "3.5", "", " ", "0x10", "+7", "\u{1}"] {
            assert_eq!(Outcome::from_status(429, Some(garbage), now()).retry_after(), None, "{garbage:?}");
        }
    }

    #[test]
    fn retry_after_is_never_more_than_an_hour() {
        let hour = Some(Duration::from_secs(3600));
        for far in ["99999999999999", "3601", "184467440737095516150000", "Fri, 31 Dec 9999 23:59:59 GMT"] {
            assert_eq!(Outcome::from_status(503, Some(far), now()).retry_after(), hour, "{far:?}");
        }
        assert_eq!(Outcome::from_status(503, Some("99999999999999"), now()).last_error().unwrap(), "HTTP 503 (Retry-After 3600s)");
    }

    #[test]
    fn statuses_outside_the_usual_range_are_rejections() {
        for status in [0, 1, 99, 600, 999, u16::MAX] {
            assert_eq!(Outcome::from_status(status, None, now()).last_error().unwrap(), format!("HTTP {status}"));
        }
    }

    #[test]
    fn errors_are_one_short_printable_line() {
        let error = Outcome::Unreachable(format!("line one\nline two\r\u{0}{}", "é".repeat(2000))).last_error().unwrap();
        assert!(error.len() <= MAX_ERROR_BYTES, "{} bytes", error.len());
        assert!(error.starts_with("unreachable: line one line two  "), "{error}");
        assert!(!error.chars().any(char::is_control));
    }

    #[test]
    fn transport_failures_have_readable_errors() {
        assert_eq!(Outcome::TimedOut.last_error().unwrap(), "timeout");
        assert_eq!(Outcome::Unreachable("connection refused".into()).last_error().unwrap(), "unreachable: connection refused");
        assert_eq!(Outcome::Delivered.last_error(), None);
    }
}
