//! `/healthz`, `/readyz` and `/metrics`, served on the address `--metrics` gives, on a thread
//! of their own: a scrape never waits for the relay loop, nor the loop for a scrape.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tiny_http::{Header, Response, Server};

use crate::metrics::Metrics;

/// Starts serving on `address`; fails at once if it cannot listen there.
pub fn serve(address: &str, metrics: Arc<Metrics>) -> Result<(), String> {
    let server = Server::http(address).map_err(|e| format!("cannot serve metrics on {address}: {e}"))?;
    std::thread::Builder::new()
        .name("outbox-metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let (status, body, content_type) = answer(request.url(), &metrics);
                let header = Header::from_bytes("content-type", content_type).expect("a valid header");
                let _ = request.respond(Response::from_string(body).with_status_code(status).with_header(header));
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
