//! Property tests: thousands of generated inputs (what a receiver or a settings file could
//! hold) thrown at the pure parsers, checking what must hold for every one of them.

use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::backoff::{retry_delay, CAP};
use super::outcome::{one_line, parse_retry_after, Outcome, MAX_ERROR_BYTES};
use super::{Target, MAX_URL_BYTES};

fn any_time() -> impl Strategy<Value = SystemTime> {
    (0u64..=253_402_300_799).prop_map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// Retry-After values as receivers send them: numbers of every size and sign, HTTP dates of
/// any year, and arbitrary text.
fn retry_after_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{1,40}",
        any::<f64>().prop_map(|f| f.to_string()),
        (any_time()).prop_map(httpdate::fmt_http_date),
        ".{0,64}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn retry_after_is_never_beyond_the_cap(value in retry_after_value(), now in any_time()) {
        if let Some(delay) = parse_retry_after(&value, now) {
            prop_assert!(delay <= CAP, "{value:?} gave {delay:?}");
        }
    }

    #[test]
    fn the_retry_delay_stays_within_the_cap_and_honours_retry_after(
        attempts in any::<i32>(), after in proptest::option::of(any::<u64>()), jitter in any::<f64>()
    ) {
        let retry_after = after.map(Duration::from_secs);
        let delay = retry_delay(attempts, retry_after, jitter);
        prop_assert!(delay <= CAP);
        prop_assert!(delay >= retry_after.unwrap_or_default().min(CAP));
        // What the workers hand PostgreSQL: finite, non-negative milliseconds.
        prop_assert!((delay.as_secs_f64() * 1000.0).is_finite());
    }

    #[test]
    fn exactly_the_2xx_statuses_are_deliveries(status in any::<u16>(), value in proptest::option::of(retry_after_value())) {
        let outcome = Outcome::from_status(status, value.as_deref(), SystemTime::now());
        prop_assert_eq!(outcome == Outcome::Delivered, (200..300).contains(&status));
        if let Some(error) = outcome.last_error() {
            prop_assert!(error.len() <= MAX_ERROR_BYTES && !error.chars().any(char::is_control), "{:?}", error);
        }
    }

    #[test]
    fn any_transport_error_is_one_short_printable_line(reason in any::<String>()) {
        let error = Outcome::Unreachable(reason).last_error().unwrap();
        prop_assert!(error.len() <= MAX_ERROR_BYTES);
        prop_assert!(!error.chars().any(char::is_control));
    }

    #[test]
    fn one_line_keeps_a_printable_prefix(text in any::<String>(), max in 0usize..2048) {
        let line = one_line(&text, max);
        prop_assert!(line.len() <= max);
        prop_assert!(!line.chars().any(char::is_control));
        let sanitized: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        prop_assert!(sanitized.starts_with(&line));
    }

    #[test]
    fn endpoints_are_accepted_only_with_short_http_urls_and_never_echoed(
        url in prop_oneof![".{0,80}", "(http|https|ftp)://[a-z0-9:@.\\[\\]/?=&%-]{0,80}", "https?://127\\.0\\.0\\.1/[a-z]{2000,2100}"],
        secret in prop_oneof![".{0,40}", "whsec_[A-Za-z0-9+/=]{0,44}"],
        header in ".{0,20}",
    ) {
        let headers = [("x-token".to_string(), header)];
        match Target::new(&url, std::slice::from_ref(&secret), &headers, Duration::from_secs(1)) {
            Ok(target) => {
                prop_assert!(matches!(target.uri.scheme_str(), Some("http" | "https")));
                prop_assert!(url.trim().len() <= MAX_URL_BYTES && !url.trim().is_empty());
            }
            Err(error) => {
                let explanation = error.to_string();
                for secret_part in [url.trim(), secret.trim()] {
                    if secret_part.len() >= 8 {
                        prop_assert!(!explanation.contains(secret_part), "{explanation:?} repeats {secret_part:?}");
                    }
                }
            }
        }
    }
}
