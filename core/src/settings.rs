//! The relay's settings as plain data: each driver reads them from where it keeps them (the
//! extension from its `outbox.*` settings), and the core acts on them.

use std::time::Duration;

/// What one pass of the relay loop needs. No Debug: `webhook_url` may carry a token.
#[derive(Clone)]
pub struct Settings {
    /// The default endpoint's URL when its own is null.
    pub webhook_url: String,
    /// What sets `webhook_url` for this driver, named when `default` has no URL: the
    /// extension's setting, or the `outbox relay` flag (the SQL install has no such setting).
    pub webhook_url_from: &'static str,
    pub http_timeout: Duration,
    pub batch_size: usize,
    pub concurrency: usize,
    pub lease: Duration,
    pub poll_interval: Duration,
    /// `None`: keep sent events forever.
    pub retention: Option<Duration>,
    /// `None`: never disable a failing endpoint.
    pub endpoint_disable_after: Option<Duration>,
    /// `None`: keep dead deliveries forever.
    pub dead_retention: Option<Duration>,
    /// `outbox.allowed_destinations` as written.
    pub allowed_destinations: String,
    /// The server's `outbox.allowed_destinations`, for an `outbox relay` serving the
    /// extension's install, whose own flag is `allowed_destinations`: both must allow.
    pub server_allowed_destinations: Option<String>,
    pub max_requests_in_flight: usize,
    pub max_bytes_in_flight: usize,
}

/// Each setting's default, in the unit of its `outbox.*` setting (0: never), which the
/// extension declares its settings with and the `outbox` process starts from.
pub mod defaults {
    pub const BATCH_SIZE: i32 = 100;
    pub const CONCURRENCY: i32 = 128;
    pub const LEASE_MS: i32 = 30_000;
    pub const MAX_ATTEMPTS: i32 = 10;
    pub const HTTP_TIMEOUT_MS: i32 = 10_000;
    pub const POLL_INTERVAL_MS: i32 = 1_000;
    pub const RETENTION_S: i32 = 7 * 24 * 3600;
    pub const ENDPOINT_DISABLE_AFTER_S: i32 = 5 * 24 * 3600;
    pub const DEAD_RETENTION_S: i32 = 30 * 24 * 3600;
    pub const ALLOWED_DESTINATIONS: &str = "0.0.0.0/0, ::/0";
    pub const MAX_REQUESTS_IN_FLIGHT: i32 = 256;
    pub const MAX_BYTES_IN_FLIGHT: i32 = 64 * 1024 * 1024;
}

impl Default for Settings {
    fn default() -> Settings {
        use defaults::*;
        Settings {
            webhook_url: String::new(),
            webhook_url_from: "outbox.webhook_url",
            http_timeout: millis(HTTP_TIMEOUT_MS),
            batch_size: BATCH_SIZE as usize,
            concurrency: CONCURRENCY as usize,
            lease: millis(LEASE_MS),
            poll_interval: millis(POLL_INTERVAL_MS),
            retention: seconds(RETENTION_S),
            endpoint_disable_after: seconds(ENDPOINT_DISABLE_AFTER_S),
            dead_retention: seconds(DEAD_RETENTION_S),
            allowed_destinations: ALLOWED_DESTINATIONS.to_string(),
            server_allowed_destinations: None,
            max_requests_in_flight: MAX_REQUESTS_IN_FLIGHT as usize,
            max_bytes_in_flight: MAX_BYTES_IN_FLIGHT as usize,
        }
    }
}

/// A setting in milliseconds.
pub fn millis(value: i32) -> Duration {
    Duration::from_millis(value.max(0) as u64)
}

/// A setting in seconds where 0 (or less) means "never".
pub fn seconds(value: i32) -> Option<Duration> {
    (value > 0).then(|| Duration::from_secs(value as u64))
}
