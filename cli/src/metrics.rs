//! What the relay process counts, shared with the thread that serves `/metrics`, and the
//! relay loop's `Report` for this process: counters here, log lines on standard error.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::delivery::{Attempt, Outcome, OutcomeClass};
use outbox_core::relay::{Level, Report};

use crate::output;

/// Upper bounds of the duration histograms' buckets, in seconds.
const BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when rendered).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(bucket) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[derive(Default)]
pub struct Metrics {
    attempts: [AtomicU64; OutcomeClass::ALL.len()],
    sent: AtomicU64,
    in_flight: AtomicU64,
    claims: Histogram,
    requests: Histogram,
    /// The last statement reached the database.
    pub database_up: AtomicBool,
    /// The outbox was found at a version this binary runs against.
    pub schema_supported: AtomicBool,
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP outbox_relay_attempts_total Delivery attempts that finished, by outcome.\n");
        out.push_str("# TYPE outbox_relay_attempts_total counter\n");
        for class in OutcomeClass::ALL {
            let _ = writeln!(
                out,
                "outbox_relay_attempts_total{{outcome=\"{}\"}} {}",
                class.label(),
                self.attempts[class as usize].load(Ordering::Relaxed)
            );
        }
        let gauge = |out: &mut String, name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        };
        gauge(
            &mut out,
            "outbox_relay_deliveries_sent_total",
            "counter",
            "Deliveries the receiver acknowledged.",
            self.sent.load(Ordering::Relaxed),
        );
        gauge(&mut out, "outbox_relay_in_flight", "gauge", "Requests in flight now.", self.in_flight.load(Ordering::Relaxed));
        gauge(
            &mut out,
            "outbox_relay_database_up",
            "gauge",
            "1 if the last statement reached the database.",
            self.database_up.load(Ordering::Relaxed).into(),
        );
        gauge(
            &mut out,
            "outbox_relay_schema_supported",
            "gauge",
            "1 if the outbox was found at a version this relay runs against.",
            self.schema_supported.load(Ordering::Relaxed).into(),
        );
        self.claims.render(&mut out, "outbox_relay_claim_duration_seconds", "How long each claim took, in the database.");
        self.requests.render(&mut out, "outbox_relay_request_duration_seconds", "How long each request took, to its outcome.");
        out
    }
}

/// The relay loop's reports in the `outbox` process.
pub struct ProcessReport {
    pub metrics: Arc<Metrics>,
}

impl Report for ProcessReport {
    fn finished(&mut self, attempts: &[Attempt]) {
        for attempt in attempts {
            self.metrics.attempts[attempt.outcome.class() as usize].fetch_add(1, Ordering::Relaxed);
            self.metrics.requests.observe(attempt.took);
            if attempt.outcome == Outcome::Delivered {
                self.metrics.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn in_flight(&mut self, requests: usize) {
        self.metrics.in_flight.store(requests as u64, Ordering::Relaxed);
    }

    fn claimed(&mut self, took: Duration) {
        self.metrics.claims.observe(took);
    }

    fn settings_loaded(&mut self) {}

    fn log(&mut self, level: Level, text: &str) {
        say(level, text);
    }
}

/// A line on standard error, where systemd's journal and container logs collect it.
pub fn say(level: Level, text: &str) {
    match level {
        Level::Log => output::say(&format!("outbox relay: {text}")),
        Level::Warning => output::say(&format!("outbox relay: warning: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_counts_attempts_by_outcome_and_buckets_cumulatively() {
        let metrics = Arc::new(Metrics::default());
        let mut report = ProcessReport { metrics: metrics.clone() };
        let attempt =
            |outcome, ms| Attempt { endpoint: "a".into(), id: 1, attempts: 1, fence: 1, outcome, took: Duration::from_millis(ms) };
        report.finished(&[attempt(Outcome::Delivered, 3), attempt(Outcome::TimedOut, 20_000)]);
        report.claimed(Duration::from_micros(1500));
        let text = metrics.render();
        assert!(text.contains("outbox_relay_attempts_total{outcome=\"2xx\"} 1\n"), "{text}");
        assert!(text.contains("outbox_relay_attempts_total{outcome=\"timeout\"} 1\n"), "{text}");
        assert!(text.contains("outbox_relay_deliveries_sent_total 1\n"), "{text}");
        assert!(text.contains("outbox_relay_request_duration_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("outbox_relay_request_duration_seconds_bucket{le=\"10\"} 1\n"), "{text}");
        assert!(text.contains("outbox_relay_request_duration_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("outbox_relay_claim_duration_seconds_count 1\n"), "{text}");
    }
}
