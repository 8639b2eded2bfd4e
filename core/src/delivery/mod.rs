//! Delivering events over HTTP. Nothing here touches PostgreSQL: it takes and returns plain
//! Rust values, so it runs on the tokio threads and is unit-tested without a server.

mod backoff;
mod destinations;
mod doorbell;
mod outcome;
#[cfg(test)]
mod properties;
mod sender;
mod signing;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::header::{HeaderName, HeaderValue};

pub use backoff::retry_delay;
pub use destinations::Destinations;
pub use doorbell::Doorbell;
pub use outcome::{one_line, Outcome, OutcomeClass, MAX_ERROR_BYTES, MAX_RESPONSE_BYTES};
pub use sender::{AttemptKey, Sender, SenderError};
pub use signing::{SecretError, SigningKey};

pub const USER_AGENT: &str = concat!("outbox_ext/", env!("CARGO_PKG_VERSION"));

/// The longest URL the workers accept.
pub const MAX_URL_BYTES: usize = 2048;

/// A claimed delivery, ready to send. `body` is the delivery envelope, built by the claim, held
/// once: the request shares it.
#[derive(Debug, Clone)]
pub struct Event {
    pub endpoint: Arc<str>,
    pub id: i64,
    /// Claims since the delivery was created or requeued, this one included: the backoff
    /// grows with it.
    pub attempts: i32,
    /// The claim's fencing token, by which its outcome is recorded: no other claim of the
    /// delivery has it.
    pub fence: i32,
    pub body: bytes::Bytes,
}

/// The result of one attempt, handed back to the main thread to record.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub endpoint: Arc<str>,
    pub id: i64,
    pub attempts: i32,
    pub fence: i32,
    pub outcome: Outcome,
    /// From the start of the request to its outcome.
    pub took: Duration,
}

/// Where and how one endpoint's deliveries are POSTed.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as a request takes it, parsed once, without the user and password.
    pub uri: http::Uri,
    /// The port the URL names or its scheme implies, and its host when that is an address
    /// (a host name's addresses are checked when it is resolved).
    pub port: u16,
    pub address: Option<IpAddr>,
    /// `Basic` authorization from the URL's user and password, if it has them.
    pub authorization: Option<HeaderValue>,
    /// The live signing secrets, newest first: one `v1,` signature each.
    pub keys: Vec<SigningKey>,
    /// The endpoint's static headers.
    pub extra_headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
}

/// What is wrong with an endpoint the workers cannot send to. Its text never repeats the URL
/// or a secret: either may hold credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("it has no URL")]
    NoUrl,
    #[error("its URL is {0} bytes long, more than {MAX_URL_BYTES}")]
    UrlTooLong(usize),
    /// The parser's reason (which does not quote the URL).
    #[error("its URL is not valid ({0})")]
    BadUrl(String),
    #[error("its URL must be http:// or https://, not {0}://")]
    NotHttp(String),
    #[error("a signing secret is malformed: {0}")]
    BadSecret(#[from] SecretError),
    /// The header's position among the endpoint's headers (its name may be anything).
    #[error("header {0} has a name that is not a header name")]
    BadHeaderName(usize),
    #[error("the value of header {0} is not valid")]
    BadHeaderValue(HeaderName),
}

impl Target {
    pub fn new(url: &str, secrets: &[String], headers: &[(String, String)], timeout: Duration) -> Result<Target, TargetError> {
        let url = url.trim();
        if url.is_empty() {
            return Err(TargetError::NoUrl);
        }
        if url.len() > MAX_URL_BYTES {
            return Err(TargetError::UrlTooLong(url.len()));
        }
        let url = url::Url::parse(url).map_err(|e| TargetError::BadUrl(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(TargetError::NotHttp(url.scheme().to_string()));
        }
        let (uri, authorization) = request_uri(&url)?;
        let port = url.port_or_known_default().unwrap_or(0);
        let address = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(ip.into()),
            Some(url::Host::Ipv6(ip)) => Some(ip.into()),
            _ => None,
        };
        let keys = secrets.iter().map(|secret| SigningKey::parse(secret.trim())).collect::<Result<_, _>>()?;
        let extra_headers = headers
            .iter()
            .enumerate()
            .map(|(position, (name, value))| {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| TargetError::BadHeaderName(position + 1))?;
                let value = HeaderValue::from_str(value).map_err(|_| TargetError::BadHeaderValue(name.clone()))?;
                Ok((name, value))
            })
            .collect::<Result<_, TargetError>>()?;
        Ok(Target { uri, port, address, authorization, keys, extra_headers, timeout })
    }

    /// The Standard Webhooks headers of one attempt at `timestamp` (unix seconds).
    pub fn headers(&self, event: &Event, timestamp: i64) -> Vec<(HeaderName, HeaderValue)> {
        let mut headers = vec![(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
        if !self.keys.is_empty() {
            let id = event.id.to_string();
            let signatures: Vec<String> = self.keys.iter().map(|key| key.sign(&id, timestamp, &event.body)).collect();
            let signatures = HeaderValue::try_from(signatures.join(" ")).expect("v1, and base64 are header-safe");
            headers.push((HeaderName::from_static("webhook-signature"), signatures));
        }
        headers.push((HeaderName::from_static("webhook-timestamp"), HeaderValue::from(timestamp)));
        headers.push((HeaderName::from_static("webhook-id"), HeaderValue::from(event.id)));
        headers
    }
}

/// The URI requests go to, and the user and password the URL carries as `Basic` authorization
/// (their percent-decoded bytes, as curl sends them); the URI keeps neither.
fn request_uri(url: &url::Url) -> Result<(http::Uri, Option<HeaderValue>), TargetError> {
    let decode = |part: &str| percent_encoding::percent_decode_str(part).collect::<Vec<u8>>();
    let authorization = (!url.username().is_empty() || url.password().is_some()).then(|| {
        let credentials = [decode(url.username()), b":".to_vec(), url.password().map(decode).unwrap_or_default()].concat();
        let mut value = HeaderValue::try_from(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials)))
            .expect("base64 is a valid header value");
        value.set_sensitive(true);
        value
    });
    let mut bare = url.clone();
    // Only a URL without a host refuses them, and an http(s) URL always has one.
    bare.set_username("").and(bare.set_password(None)).map_err(|()| TargetError::BadUrl("it has no host".into()))?;
    let uri = bare.as_str().parse::<http::Uri>().map_err(|e| TargetError::BadUrl(e.to_string()))?;
    Ok((uri, authorization))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const OLD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn event() -> Event {
        Event { endpoint: "default".into(), id: 42, attempts: 1, fence: 1, body: r#"{"type":"t","timestamp":"x","data":{}}"#.into() }
    }

    fn target(url: &str, secrets: &[&str], headers: &[(&str, &str)]) -> Result<Target, TargetError> {
        let secrets: Vec<String> = secrets.iter().map(|s| s.to_string()).collect();
        let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Target::new(url, &secrets, &headers, Duration::from_secs(1))
    }

    #[test]
    fn bad_endpoints_are_explained() {
        assert_eq!(target("  ", &[], &[]).unwrap_err(), TargetError::NoUrl);
        assert!(matches!(target("not a url", &[], &[]).unwrap_err(), TargetError::BadUrl(_)));
        // A URL the URL standard takes but HTTP's URI grammar does not: refused when loaded.
        assert!(matches!(target("https://{{hostname}}/hook", &[], &[]).unwrap_err(), TargetError::BadUrl(_)));
        assert_eq!(target("ftp://127.0.0.1/x", &[], &[]).unwrap_err(), TargetError::NotHttp("ftp".into()));
        assert_eq!(target("http://127.0.0.1/x", &["secret"], &[]).unwrap_err(), TargetError::BadSecret(SecretError::NoPrefix));
        assert_eq!(target("http://127.0.0.1/x", &[], &[("x-ok", "v"), ("bad name", "v")]).unwrap_err(), TargetError::BadHeaderName(2));
        assert_eq!(
            target("http://127.0.0.1/x", &[], &[("x-a", "line\nbreak")]).unwrap_err(),
            TargetError::BadHeaderValue(HeaderName::from_static("x-a"))
        );
        let long = format!("http://127.0.0.1/{}", "x".repeat(MAX_URL_BYTES));
        assert_eq!(target(&long, &[], &[]).unwrap_err(), TargetError::UrlTooLong(long.len()));
        // What the log and last_error show.
        assert_eq!(TargetError::UrlTooLong(3000).to_string(), "its URL is 3000 bytes long, more than 2048");
    }

    #[test]
    fn explanations_never_repeat_credentials() {
        for url in ["http://user:hunter2@[::1/?token=hunter2", "ftp://user:hunter2@127.0.0.1/?token=hunter2"] {
            let error = target(url, &[], &[]).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
        let error = target("http://127.0.0.1/x", &["whsec_hunter2!!"], &[]).unwrap_err().to_string();
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn headers_carry_the_event_id_timestamp_and_signature() {
        let target = target("http://127.0.0.1:9/hook", &[SECRET], &[("authorization", "Bearer t")]).unwrap();
        let headers = target.headers(&event(), 1_700_000_000);
        let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_str().unwrap().to_string());
        assert_eq!(get("webhook-id").unwrap(), "42");
        assert_eq!(get("webhook-timestamp").unwrap(), "1700000000");
        assert_eq!(get("content-type").unwrap(), "application/json");
        let key = SigningKey::parse(SECRET).unwrap();
        assert_eq!(get("webhook-signature").unwrap(), key.sign("42", 1_700_000_000, &event().body));
        assert_eq!(target.extra_headers[0].0.as_str(), "authorization");
    }

    #[test]
    fn each_live_secret_signs_newest_first() {
        let target = target("http://127.0.0.1:9/hook", &[SECRET, OLD_SECRET], &[]).unwrap();
        let headers = target.headers(&event(), 7);
        let signature = &headers.iter().find(|(n, _)| n == "webhook-signature").unwrap().1;
        let [new, old] = [SECRET, OLD_SECRET].map(|s| SigningKey::parse(s).unwrap().sign("42", 7, &event().body));
        assert_eq!(signature.to_str().unwrap(), format!("{new} {old}"));
    }

    #[test]
    fn a_user_and_password_in_the_url_become_basic_authorization_and_leave_the_uri() {
        let with_both = target("https://us%40er:p%3Ass@127.0.0.1:8443/hook?token=t", &[], &[]).unwrap();
        assert_eq!(with_both.uri.to_string(), "https://127.0.0.1:8443/hook?token=t");
        let authorization = with_both.authorization.unwrap();
        assert_eq!(authorization.to_str().unwrap(), format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("us@er:p:ss")));
        assert!(authorization.is_sensitive());
        assert!(target("http://127.0.0.1/hook", &[], &[]).unwrap().authorization.is_none());
        let user_only = target("http://me@127.0.0.1/hook", &[], &[]).unwrap().authorization.unwrap();
        assert_eq!(user_only.to_str().unwrap(), format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("me:")));
        // Bytes that are not UTF-8 are sent as they are, not replaced.
        let raw = target("http://%FF:%FE@127.0.0.1/hook", &[], &[]).unwrap().authorization.unwrap();
        assert_eq!(raw.to_str().unwrap(), format!("Basic {}", base64::engine::general_purpose::STANDARD.encode([0xFF, b':', 0xFE])));
    }

    #[test]
    fn no_secret_means_no_signature_header() {
        let target = target("https://127.0.0.1/hook", &[], &[]).unwrap();
        assert!(target.headers(&event(), 1).iter().all(|(n, _)| n != "webhook-signature"));
    }
}
