//! Delivering events over HTTP. Nothing here touches PostgreSQL: it takes and returns plain
//! Rust values, so it runs on the tokio threads and is unit-tested without a server.

mod backoff;
mod doorbell;
mod outcome;
#[cfg(test)]
mod properties;
mod sender;
mod signing;

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};

pub use backoff::retry_delay;
pub use doorbell::Doorbell;
pub use outcome::{one_line, Outcome, OutcomeClass, MAX_ERROR_BYTES};
pub use sender::Sender;
pub use signing::SigningKey;

pub const USER_AGENT: &str = concat!("outbox_ext/", env!("CARGO_PKG_VERSION"));

/// The longest URL the workers accept.
pub const MAX_URL_BYTES: usize = 2048;

/// A claimed delivery, ready to send. `body` is the delivery envelope, built by the claim.
#[derive(Debug, Clone)]
pub struct Event {
    pub endpoint: Arc<str>,
    pub id: i64,
    /// Claims so far, this one included.
    pub attempts: i32,
    pub body: String,
}

/// The result of one attempt, handed back to the main thread to record.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub endpoint: Arc<str>,
    pub id: i64,
    pub attempts: i32,
    pub outcome: Outcome,
}

/// Where and how one endpoint's deliveries are POSTed.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: reqwest::Url,
    /// The live signing secrets, newest first: one `v1,` signature each.
    pub keys: Vec<SigningKey>,
    /// The endpoint's static headers.
    pub extra_headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
}

impl Target {
    /// `Err` says what is wrong with the endpoint, never repeating its URL or a secret: either
    /// may hold credentials.
    pub fn new(url: &str, secrets: &[String], headers: &[(String, String)], timeout: Duration) -> Result<Target, String> {
        let url = url.trim();
        if url.is_empty() {
            return Err("it has no URL".to_string());
        }
        if url.len() > MAX_URL_BYTES {
            return Err(format!("its URL is {} bytes long, more than {MAX_URL_BYTES}", url.len()));
        }
        let url = reqwest::Url::parse(url).map_err(|e| format!("its URL is not valid ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("its URL must be http:// or https://, not {}://", url.scheme()));
        }
        let keys = secrets
            .iter()
            .map(|secret| SigningKey::parse(secret.trim()).map_err(|e| format!("a signing secret is malformed: {e}")))
            .collect::<Result<_, _>>()?;
        let extra_headers = headers
            .iter()
            .map(|(name, value)| {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
                let value = HeaderValue::from_str(value).map_err(|_| format!("the value of header {name} is not valid"))?;
                Ok((name, value))
            })
            .collect::<Result<_, String>>()?;
        Ok(Target { url, keys, extra_headers, timeout })
    }

    /// The Standard Webhooks headers of one attempt at `timestamp` (unix seconds).
    pub fn headers(&self, event: &Event, timestamp: i64) -> Vec<(&'static str, String)> {
        let id = event.id.to_string();
        let mut headers = vec![("content-type", "application/json".to_string())];
        if !self.keys.is_empty() {
            let signatures: Vec<String> = self.keys.iter().map(|key| key.sign(&id, timestamp, event.body.as_bytes())).collect();
            headers.push(("webhook-signature", signatures.join(" ")));
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
    const OLD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn event() -> Event {
        Event { endpoint: "default".into(), id: 42, attempts: 1, body: r#"{"type":"t","timestamp":"x","data":{}}"#.into() }
    }

    fn target(url: &str, secrets: &[&str], headers: &[(&str, &str)]) -> Result<Target, String> {
        let secrets: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
        let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Target::new(url, &secrets, &headers, Duration::from_secs(1))
    }

    #[test]
    fn bad_endpoints_are_explained() {
        assert!(target("  ", &[], &[]).unwrap_err().contains("no URL"));
        assert!(target("not a url", &[], &[]).unwrap_err().contains("not valid"));
        assert!(target("ftp://127.0.0.1/x", &[], &[]).unwrap_err().contains("http:// or https://"));
        assert!(target("http://127.0.0.1/x", &["secret"], &[]).unwrap_err().contains("signing secret"));
        assert!(target("http://127.0.0.1/x", &[], &[("bad name", "v")]).unwrap_err().contains("header name"));
        assert!(target("http://127.0.0.1/x", &[], &[("x-a", "line\nbreak")]).unwrap_err().contains("x-a"));
        let long = format!("http://127.0.0.1/{}", "x".repeat(MAX_URL_BYTES));
        assert!(target(&long, &[], &[]).unwrap_err().contains("more than 2048"));
    }

    #[test]
    fn explanations_never_repeat_credentials() {
        for url in ["http://user:hunter2@[::1/?token=hunter2", "ftp://user:hunter2@127.0.0.1/?token=hunter2"] {
            let error = target(url, &[], &[]).unwrap_err();
            assert!(!error.contains("hunter2"), "{error}");
        }
        let error = target("http://127.0.0.1/x", &["whsec_hunter2!!"], &[]).unwrap_err();
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn headers_carry_the_event_id_timestamp_and_signature() {
        let target = target("http://127.0.0.1:9/hook", &[SECRET], &[("authorization", "Bearer t")]).unwrap();
        let headers = target.headers(&event(), 1_700_000_000);
        let get = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("webhook-id").unwrap(), "42");
        assert_eq!(get("webhook-timestamp").unwrap(), "1700000000");
        assert_eq!(get("content-type").unwrap(), "application/json");
        let key = SigningKey::parse(SECRET).unwrap();
        assert_eq!(get("webhook-signature").unwrap(), key.sign("42", 1_700_000_000, event().body.as_bytes()));
        assert_eq!(target.extra_headers[0].0.as_str(), "authorization");
    }

    #[test]
    fn each_live_secret_signs_newest_first() {
        let target = target("http://127.0.0.1:9/hook", &[SECRET, OLD_SECRET], &[]).unwrap();
        let headers = target.headers(&event(), 7);
        let signature = &headers.iter().find(|(n, _)| *n == "webhook-signature").unwrap().1;
        let [new, old] = [SECRET, OLD_SECRET].map(|s| SigningKey::parse(s).unwrap().sign("42", 7, event().body.as_bytes()));
        assert_eq!(signature, &format!("{new} {old}"));
    }

    #[test]
    fn no_secret_means_no_signature_header() {
        let target = target("https://127.0.0.1/hook", &[], &[]).unwrap();
        assert!(target.headers(&event(), 1).iter().all(|(n, _)| *n != "webhook-signature"));
    }
}
