//! `/healthz`, `/readyz` and `/metrics`, served on the address `--metrics` gives, on a thread
//! of their own: a scrape never waits for the relay loop, nor the loop for a scrape.

use std::net::ToSocketAddrs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::listener::{HostName, Listener, Response};
use crate::metrics::Metrics;

/// Starts serving on `address`, answering also the hosts `allowed` names; fails at once if it
/// cannot listen there.
pub fn serve(address: &str, allowed: &[HostName], metrics: Arc<Metrics>) -> Result<(), String> {
    let cannot = |e: &dyn std::fmt::Display| format!("cannot serve metrics on {address}: {e}");
    let addresses: Vec<_> = address.to_socket_addrs().map_err(|e| cannot(&e))?.collect();
    // A scrape has no body.
    let listener = Listener::start(&addresses, allowed, 0, "outbox-metrics").map_err(|e| cannot(&e))?;
    std::thread::Builder::new()
        .name("outbox-metrics".into())
        .spawn(move || {
            while let Some(exchange) = listener.next() {
                let (status, body, content_type) = answer(exchange.request.path(), &metrics);
                exchange.answer(Response::new(status, content_type, body));
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    Ok(())
}
fn answer(path: &str, metrics: &Metrics) -> (u16, String, &'static str) {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/healthz" => (200, "ok\n".into(), TEXT),
        "/readyz" => {
            let database = metrics.database_up.load(Ordering::Relaxed);
            let schema = metrics.schema_supported.load(Ordering::Relaxed);
            match (database, schema) {
                (true, true) => (200, "ready\n".into(), TEXT),
                (false, _) => (503, "the database is not reachable\n".into(), TEXT),
                (true, false) => (503, "the outbox's schema is missing or at a version this relay does not run against\n".into(), TEXT),
            }
        }
        "/metrics" => (200, metrics.render(), "text/plain; version=0.0.4; charset=utf-8"),
        _ => (404, "not found: try /healthz, /readyz or /metrics\n".into(), TEXT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_the_database_reached_and_the_schema_supported() {
        let metrics = Metrics::default();
        assert_eq!(answer("/healthz", &metrics).0, 200);
        assert_eq!(answer("/readyz", &metrics).0, 503);
        metrics.database_up.store(true, Ordering::Relaxed);
        assert!(answer("/readyz", &metrics).1.contains("schema"));
        metrics.schema_supported.store(true, Ordering::Relaxed);
        assert_eq!(answer("/readyz", &metrics).0, 200);
        assert_eq!(answer("/nope", &metrics).0, 404);
    }
}
