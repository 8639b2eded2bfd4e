//! Sends events concurrently on a small tokio runtime and hands back finished attempts.
//!
//! The main thread calls `send` and `take_finished`; the requests themselves run on the
//! runtime's threads, which never call into PostgreSQL and have every signal blocked so that
//! PostgreSQL's handlers only ever run on the main thread.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, RETRY_AFTER, USER_AGENT as USER_AGENT_HEADER};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::destinations::{AllowedResolver, DestinationRefused, Destinations};
use super::{Attempt, Doorbell, Event, Outcome, Target, MAX_RESPONSE_BYTES, USER_AGENT};

/// hyper's pooled client, each request's URI parsed once per endpoint (`Target::uri`): through
/// reqwest, parsing and formatting URLs again for each request and wrapping each response took
/// about a third of the HTTP thread's own time.
type Client = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector<AllowedResolver>>, Full<Bytes>>;

/// The doorbell rings once this share (1/n) of the requests in flight have finished.
const RING_SHARE: usize = 8;

/// An attempt as the database knows it: endpoint, event id, fencing token.
pub type AttemptKey = (Arc<str>, i64, i32);

pub struct Sender {
    runtime: tokio::runtime::Runtime,
    /// Where requests may go (`outbox.allowed_destinations`).
    destinations: Arc<Destinations>,
    /// A client for each port a block of `destinations` names, and one (under 0) for every
    /// other port, each resolving host names to the addresses allowed there; made when first
    /// needed. So no more clients than the setting names ports.
    clients: HashMap<u16, Client>,
    /// TLS for https endpoints, with the webpki roots (`client_for` offers HTTP/2 and HTTP/1.1).
    tls: rustls::ClientConfig,
    finished_tx: mpsc::Sender<(u64, Attempt)>,
    finished_rx: mpsc::Receiver<(u64, Attempt)>,
    doorbell: Arc<Doorbell>,
    /// The attempts in flight by the number `send` gave each, with the size of the body held.
    in_flight: HashMap<u64, (AttemptKey, usize)>,
    sent: u64,
    /// Requests in flight per endpoint: each endpoint has its own budget (`max_in_flight`), so
    /// one that hangs cannot take the slots of another.
    in_flight_to: HashMap<Arc<str>, usize>,
    /// Bytes of the bodies in flight (`outbox.max_bytes_in_flight` bounds them).
    held_bytes: usize,
}

/// Why a worker cannot start sending.
#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error("cannot start the HTTP runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(rustls::Error),
    #[error("cannot create an eventfd: {0}")]
    Doorbell(std::io::Error),
}

impl Sender {
    pub fn new(destinations: Destinations) -> Result<Sender, SenderError> {
        // Threads inherit the signal mask of the thread that creates them: build the runtime
        // with every signal blocked, so its threads (and the ones they start) never run a
        // PostgreSQL signal handler, not even for an instant after they start.
        let runtime = with_signals_blocked(|| {
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("outbox-http").enable_all().build()
        })
        .map_err(SenderError::Runtime)?;
        let destinations = Arc::new(destinations);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(SenderError::Tls)?
            .with_root_certificates(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
            .with_no_client_auth();
        let doorbell = Doorbell::new().map_err(SenderError::Doorbell)?;
        let (finished_tx, finished_rx) = mpsc::channel();
        Ok(Sender {
            runtime,
            destinations,
            clients: HashMap::new(),
            tls,
            finished_tx,
            finished_rx,
            doorbell: Arc::new(doorbell),
            in_flight: HashMap::new(),
            sent: 0,
            in_flight_to: HashMap::new(),
            held_bytes: 0,
        })
    }

    /// Where requests may go from now on; requests in flight keep going where they went.
    pub fn allow(&mut self, destinations: Destinations) {
        if *self.destinations != destinations {
            self.destinations = Arc::new(destinations);
            self.clients.clear();
        }
    }

    /// Starts one attempt; its result comes back through `take_finished`. A URL whose host is
    /// an address outside `outbox.allowed_destinations` fails at once, with no connection made;
    /// a host name's addresses are checked when it is resolved.
    pub fn send(&mut self, target: &Arc<Target>, event: Event) {
        let port = target.port;
        let refused = target.address.is_some_and(|ip| !self.destinations.allows(SocketAddr::new(ip, port)));
        // The resolver resolves to this port, so the port hyper connects to is one it checked.
        let client_port = if self.destinations.names_port(port) { port } else { 0 };
        let client = match self.clients.get(&client_port) {
            Some(client) => client.clone(),
            None => {
                let client = client_for(&self.destinations, client_port, &self.tls);
                self.clients.insert(client_port, client.clone());
                client
            }
        };
        let (target, done, bell) = (target.clone(), self.finished_tx.clone(), self.doorbell.clone());
        self.sent += 1;
        let number = self.sent;
        self.in_flight.insert(number, ((event.endpoint.clone(), event.id, event.fence), event.body.len()));
        self.held_bytes += event.body.len();
        *self.in_flight_to.entry(event.endpoint.clone()).or_default() += 1;
        self.runtime.spawn(async move {
            let started = std::time::Instant::now();
            let outcome = if refused {
                Outcome::Refused
            } else {
                tokio::time::timeout(target.timeout, post(&client, &target, &event)).await.unwrap_or(Outcome::TimedOut)
            };
            // The receiver only disappears when the worker exits; then the result is moot.
            let attempt = Attempt {
                endpoint: event.endpoint,
                id: event.id,
                attempts: event.attempts,
                fence: event.fence,
                outcome,
                took: started.elapsed(),
            };
            let _ = done.send((number, attempt));
            bell.finished();
        });
    }

    /// Every attempt that finished since the last call.
    pub fn take_finished(&mut self) -> Vec<Attempt> {
        self.doorbell.clear();
        let mut finished = Vec::new();
        for (number, attempt) in self.finished_rx.try_iter() {
            if let Some((_, bytes)) = self.in_flight.remove(&number) {
                self.held_bytes -= bytes;
            }
            if let Some(count) = self.in_flight_to.get_mut(&attempt.endpoint) {
                *count -= 1;
            }
            finished.push(attempt);
        }
        self.in_flight_to.retain(|_, count| *count > 0);
        finished
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The attempts in flight now.
    pub fn in_flight_attempts(&self) -> impl Iterator<Item = &AttemptKey> {
        self.in_flight.values().map(|(attempt, _)| attempt)
    }

    /// Endpoints with requests in flight now.
    pub fn busy_endpoints(&self) -> usize {
        self.in_flight_to.len()
    }

    /// Bytes of the request bodies in flight.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    pub fn in_flight_to(&self, endpoint: &str) -> usize {
        self.in_flight_to.get(endpoint).copied().unwrap_or(0)
    }

    /// Arms the doorbell for a wait and returns it: ready to read once an eighth of the requests
    /// in flight now have finished, or the one request in flight (`RING_SHARE`). Many results
    /// are then taken in one turn; a result that came while fewer finished waits at most
    /// `Doorbell::may_be_silent`'s check (`timers::SILENT_FINISH_CHECK`).
    pub fn arm_doorbell(&self) -> &Doorbell {
        self.doorbell.ring_at(self.in_flight.len() / RING_SHARE);
        &self.doorbell
    }

    /// Drops the requests still in flight; their rows come back when the lease runs out.
    pub fn abandon(self) {
        self.runtime.shutdown_background();
    }
}

/// The most of a response body a worker reads: enough to reuse the connection after a normal
/// answer, never enough for a receiver to fill the worker's memory.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// One attempt, from connecting to the end of the answer: the caller bounds it in time.
async fn post(client: &Client, target: &Target, event: &Event) -> Outcome {
    let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let mut request = http::Request::new(Full::new(event.body.clone()));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = target.uri.clone();
    let headers = request.headers_mut();
    for (name, value) in &target.extra_headers {
        headers.append(name, value.clone());
    }
    for (name, value) in target.headers(event, timestamp) {
        headers.append(name, value);
    }
    // Unless the endpoint's headers name them.
    if let Some(authorization) = &target.authorization {
        headers.entry(AUTHORIZATION).or_insert_with(|| authorization.clone());
    }
    headers.entry(USER_AGENT_HEADER).or_insert(HeaderValue::from_static(USER_AGENT));
    headers.entry(ACCEPT).or_insert(HeaderValue::from_static("*/*"));
    let mut response = match client.request(request).await {
        Ok(response) => response,
        Err(e) => return transport_failure(&e),
    };
    let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok());
    let mut outcome = Outcome::from_status(response.status().as_u16(), retry_after, SystemTime::now());
    // Read the answer to its end (up to MAX_BODY_BYTES, within the request's timeout): a
    // connection cut mid-response is a failed attempt, and a fully read response lets the
    // connection go back to the pool. A longer body is left unread and its connection closed.
    // A failure keeps the start of the answer for its history; a success keeps nothing.
    let keep_start = matches!(outcome, Outcome::Rejected { .. });
    let mut start = Vec::new();
    let mut read = 0;
    while let Some(frame) = response.body_mut().frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return transport_failure(&e),
        };
        // Trailers carry no body.
        let Some(chunk) = frame.data_ref() else { continue };
        read += chunk.len();
        if keep_start && start.len() < MAX_RESPONSE_BYTES {
            start.extend_from_slice(&chunk[..chunk.len().min(MAX_RESPONSE_BYTES - start.len())]);
        }
        if read > MAX_BODY_BYTES {
            break;
        }
    }
    if let Outcome::Rejected { response, .. } = &mut outcome {
        *response = String::from_utf8_lossy(&start).into_owned();
    }
    outcome
}

/// A client for requests to `port`: hyper follows no redirects and takes no proxy from the
/// environment (it would connect where allowed_destinations does not look); host names are
/// resolved to allowed addresses only.
fn client_for(destinations: &Arc<Destinations>, port: u16, tls: &rustls::ClientConfig) -> Client {
    let mut http = HttpConnector::new_with_resolver(AllowedResolver { destinations: destinations.clone(), port });
    http.enforce_http(false);
    http.set_nodelay(true);
    // A peer that vanished, or stopped reading a body larger than the socket's buffers, ends
    // the connection within about 30 s; pooled connections survive idle-dropping middleboxes.
    http.set_keepalive(Some(Duration::from_secs(15)));
    http.set_keepalive_interval(Some(Duration::from_secs(15)));
    http.set_keepalive_retries(Some(3));
    http.set_tcp_user_timeout(Some(Duration::from_secs(30)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(https)
}

/// Why a request failed on its way: refused by allowed_destinations when a host name resolved
/// only to addresses outside it, timed out when the kernel gave up on the peer, otherwise the
/// error and its causes, on one line.
fn transport_failure(error: &(dyn std::error::Error + 'static)) -> Outcome {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<DestinationRefused>() {
            return Outcome::Refused;
        }
        // The kernel's own limits: a connection attempt unanswered, or TCP_USER_TIMEOUT.
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return Outcome::TimedOut;
            }
            // An io::Error that wraps another error (as TLS errors are) does not name it as its
            // source.
            if let Some(inner) = io.get_ref() {
                cause = Some(inner);
                continue;
            }
        }
        cause = error.source();
    }
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        reason = format!("{reason}: {cause}");
        source = cause.source();
    }
    Outcome::Unreachable(reason)
}

fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: the signal sets are zeroed locals initialised by sigfillset; pthread_sigmask only
    // changes this thread's mask, and the previous one is put back.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
        let result = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked_on_this_thread(signal: i32) -> bool {
        // SAFETY: reads this thread's mask into a zeroed local set.
        unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
            libc::sigismember(&mask, signal) == 1
        }
    }

    #[test]
    fn a_connection_the_kernel_gave_up_on_is_a_timeout_and_other_failures_say_why() {
        assert!(matches!(transport_failure(&std::io::Error::from(std::io::ErrorKind::TimedOut)), Outcome::TimedOut));
        let during_tls = std::io::Error::other(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(transport_failure(&during_tls), Outcome::TimedOut));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert!(matches!(transport_failure(&refused), Outcome::Unreachable(reason) if reason == "connection refused"));
        assert!(matches!(transport_failure(&DestinationRefused), Outcome::Refused));
    }

    #[test]
    fn runtime_threads_have_every_signal_blocked_and_the_caller_keeps_its_mask() {
        let sender = Sender::new(Destinations::parse("0.0.0.0/0").unwrap()).unwrap();
        let on_runtime = sender.runtime.block_on(async {
            tokio::spawn(async { [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGINT].map(blocked_on_this_thread) }).await.unwrap()
        });
        assert_eq!(on_runtime, [true; 4]);
        assert!(!blocked_on_this_thread(libc::SIGUSR1), "the creating thread's mask is restored");
    }
}
