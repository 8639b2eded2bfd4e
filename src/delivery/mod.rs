//! Delivering events over HTTP. Nothing here touches PostgreSQL: it takes and returns plain
//! Rust values, so it runs on the tokio threads and is unit-tested without a server.

mod backoff;
mod doorbell;
mod outcome;
#[cfg(test)]
mod properties;
mod sender;
mod signing;

use std::time::Duration;

pub use backoff::retry_delay;
pub use doorbell::Doorbell;
pub use outcome::{one_line, Outcome, MAX_ERROR_BYTES};
pub use sender::Sender;
pub use signing::SigningKey;

pub const USER_AGENT: &str = concat!("outbox_ext/", env!("CARGO_PKG_VERSION"));

/// The longest URL the workers accept.
pub const MAX_URL_BYTES: usize = 2048;

/// A claimed event, ready to send. `body` is the delivery envelope, built by the claim query.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: i64,
    /// Claims so far, this one included.
    pub attempts: i32,
    pub body: String,
}

/// The result of one attempt, handed back to the main thread to record.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: i64,
    pub attempts: i32,
    pub outcome: Outcome,
}

/// Where and how events are POSTed.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: reqwest::Url,
    pub key: Option<SigningKey>,
    pub timeout: Duration,
}

impl Target {
    /// `Ok(None)` when no URL is configured; `Err` says what is wrong with the settings. The
    /// explanation never repeats the URL or the secret: either may hold credentials.
    pub fn parse(url: &str, secret: &str, timeout: Duration) -> Result<Option<Target>, String> {
        let url = url.trim();
        if url.is_empty() {
            return Ok(None);
        }
        if url.len() > MAX_URL_BYTES {
            return Err(format!("outbox.webhook_url is {} bytes long, more than {MAX_URL_BYTES}", url.len()));
        }
        let url = reqwest::Url::parse(url).map_err(|e| format!("outbox.webhook_url is not a valid URL ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("outbox.webhook_url must be http:// or https://, not {}://", url.scheme()));
        }
        let key = match secret.trim() {
            "" => None,
            secret => Some(SigningKey::parse(secret).map_err(|e| format!("outbox.signing_secret is malformed: {e}"))?),
        };
        Ok(Some(Target { url, key, timeout }))
    }

    /// The Standard Webhooks headers of one attempt at `timestamp` (unix seconds).
    pub fn headers(&self, event: &Event, timestamp: i64) -> Vec<(&'static str, String)> {
        let id = event.id.to_string();
        let mut headers = vec![("content-type", "application/json".to_string())];
        if let Some(key) = &self.key {
            headers.push(("webhook-signature", key.sign(&id, timestamp, event.body.as_bytes())));
        }
        headers.push(("webhook-timestamp", timestamp.to_string()));
        headers.push(("webhook-id", id));
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn event() -> Event {
        Event { id: 42, attempts: 1, body: r#"{"type":"t","timestamp":"x","data":{}}"#.into() }
    }

    #[test]
    fn empty_url_means_no_target() {
        assert!(Target::parse("  ", SECRET, Duration::from_secs(1)).unwrap().is_none());
    }

    #[test]
    fn bad_settings_are_explained() {
        let t = Duration::from_secs(1);
        assert!(Target::parse("not a url", "", t).unwrap_err().contains("not a valid URL"));
        assert!(Target::parse("ftp://127.0.0.1/x", "", t).unwrap_err().contains("http:// or https://"));
        assert!(Target::parse("http://127.0.0.1/x", "secret", t).unwrap_err().contains("signing_secret"));
        let long = format!("http://127.0.0.1/{}", "x".repeat(MAX_URL_BYTES));
        assert!(Target::parse(&long, "", t).unwrap_err().contains("more than 2048"));
    }

    #[test]
    fn explanations_never_repeat_credentials() {
        let t = Duration::from_secs(1);
        for url in ["http://user:hunter2@[::1/?token=hunter2", "ftp://user:hunter2@127.0.0.1/?token=hunter2"] {
            let error = Target::parse(url, "", t).unwrap_err();
            assert!(!error.contains("hunter2"), "{error}");
        }
        let error = Target::parse("http://127.0.0.1/x", "whsec_hunter2!!", t).unwrap_err();
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn headers_carry_the_event_id_timestamp_and_signature() {
        let target = Target::parse("http://127.0.0.1:9/hook", SECRET, Duration::from_secs(1)).unwrap().unwrap();
        let headers = target.headers(&event(), 1_700_000_000);
        let get = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("webhook-id").unwrap(), "42");
        assert_eq!(get("webhook-timestamp").unwrap(), "1700000000");
        assert_eq!(get("content-type").unwrap(), "application/json");
        let key = SigningKey::parse(SECRET).unwrap();
        assert_eq!(get("webhook-signature").unwrap(), key.sign("42", 1_700_000_000, event().body.as_bytes()));
    }

    #[test]
    fn no_secret_means_no_signature_header() {
        let target = Target::parse("https://127.0.0.1/hook", "", Duration::from_secs(1)).unwrap().unwrap();
        assert!(target.headers(&event(), 1).iter().all(|(n, _)| *n != "webhook-signature"));
    }
}
