//! The relay's settings as plain data: each driver reads them from where it keeps them (the
//! extension from its `outbox.*` settings), and the core acts on them.

use std::time::Duration;

/// What one pass of the relay loop needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The default endpoint's URL when its own is null.
    pub webhook_url: String,
    pub http_timeout: Duration,
    pub batch_size: usize,
    pub concurrency: usize,
    pub lease: Duration,
    pub max_attempts: i32,
    pub poll_interval: Duration,
    /// `None`: keep sent events forever.
    pub retention: Option<Duration>,
    /// `None`: never disable a failing endpoint.
    pub endpoint_disable_after: Option<Duration>,
    /// `None`: keep dead deliveries forever.
    pub dead_retention: Option<Duration>,
    /// `outbox.allowed_destinations` as written.
    pub allowed_destinations: String,
    pub max_requests_in_flight: usize,
    pub max_bytes_in_flight: usize,
}
