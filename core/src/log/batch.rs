//! One read of the log on its way to the receivers: the deliveries still to start, how many
//! are in flight, those to copy into the table path (routed where only it goes, or failed),
//! and the position the slot may be confirmed at once none is left.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::LogEvent;
use crate::delivery::{Attempt, Event, Outcome};

/// The fencing token of the deliveries of the read after the one that had `last` (0 before
/// the first read). A delivery read from the log has no claim, whose tokens start at 1: it
/// carries minus the number of its read instead, by which the relay tells the log's attempts
/// from the table path's, and a late result of a read it let go of from one of a later read
/// that holds the same event again. After -i32::MAX the tokens start again at -1, so that two
/// reads in a row never share one.
pub fn next_log_fence(last: i32) -> i32 {
    if last < 0 && last > -i32::MAX {
        last - 1
    } else {
        -1
    }
}

pub fn is_log_fence(fence: i32) -> bool {
    fence <= 0
}

/// Whether `fence` is the token of a read after the one that had `than` (0: none yet), the
/// tokens going down and wrapping as `next_log_fence` has them: reads on their way at once are
/// a few apart, never half the range.
pub fn is_later_read(fence: i32, than: i32) -> bool {
    if than == 0 {
        return fence != 0;
    }
    let apart = (i64::from(than) - i64::from(fence)).rem_euclid(i64::from(i32::MAX));
    apart > 0 && apart < i64::from(i32::MAX) / 2
}

/// A row of `outbox_log_route`: event `event` (from 1, in the read's order) goes to
/// `endpoint`, sent now with `body`, or (no body) copied into the table path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub event: i32,
    pub endpoint: String,
    pub body: Option<String>,
}

/// Deliveries copied into the table path, as `outbox_log_defer` takes them: one element per
/// delivery, its event's columns repeated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Deferrals {
    pub ids: Vec<i64>,
    pub topics: Vec<String>,
    pub payloads: Vec<String>,
    pub keys: Vec<Option<String>>,
    pub created: Vec<String>,
    pub endpoints: Vec<String>,
    pub attempts: Vec<i32>,
    pub errors: Vec<Option<String>>,
    /// Milliseconds until it is due.
    pub due_in_ms: Vec<f64>,
}

impl Deferrals {
    fn push(&mut self, event: &LogEvent, endpoint: &str, attempts: i32, error: Option<String>, due_in: Duration) {
        self.ids.push(event.id);
        self.topics.push(event.topic.clone());
        self.payloads.push(event.payload.clone());
        self.keys.push(event.key.clone());
        self.created.push(event.created_at.clone());
        self.endpoints.push(endpoint.to_string());
        self.attempts.push(attempts);
        self.errors.push(error);
        self.due_in_ms.push(due_in.as_secs_f64() * 1000.0);
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// What became of a delivery `LogBatch::start` offered.
pub enum Start {
    Started,
    NoRoom(Event),
    Unsendable(Event),
}

pub struct LogBatch {
    events: Vec<LogEvent>,
    /// Where each event is in `events`, by id.
    places: HashMap<i64, usize>,
    /// Just past the read's last transaction.
    pub end: u64,
    /// The fencing token of its deliveries (`next_log_fence`).
    pub fence: i32,
    /// The deliveries not yet started, by endpoint, each in the read's order.
    to_start: HashMap<Arc<str>, VecDeque<Event>>,
    in_flight: usize,
    /// Not yet written: the copies still to make.
    pub deferrals: Deferrals,
}

impl LogBatch {
    /// The read's `events` sent as `routes` say, with the fencing token `fence`, to the
    /// endpoints `sendable` accepts; the rest (and every route without a body) copied into the
    /// table path, due at once.
    pub fn new(events: Vec<LogEvent>, end: u64, fence: i32, routes: Vec<Route>, sendable: impl Fn(&str) -> Option<Arc<str>>) -> LogBatch {
        let places = events.iter().enumerate().map(|(place, e)| (e.id, place)).collect();
        let (to_start, deferrals) = (HashMap::new(), Deferrals::default());
        let mut batch = LogBatch { events, places, end, fence, to_start, in_flight: 0, deferrals };
        for route in routes {
            let Some(event) = usize::try_from(route.event - 1).ok().and_then(|i| batch.events.get(i)) else { continue };
            match (route.body, sendable(&route.endpoint)) {
                (Some(body), Some(endpoint)) => {
                    let delivery = Event { endpoint: endpoint.clone(), id: event.id, attempts: 1, fence, body: body.into() };
                    batch.to_start.entry(endpoint).or_default().push_back(delivery);
                }
                _ => batch.deferrals.push(event, &route.endpoint, 0, None, Duration::ZERO),
            }
        }
        batch
    }

    /// Starts what `start` takes of the deliveries not yet started, each endpoint's in the
    /// read's order; an endpoint's first one it hands back for want of room waits with the
    /// rest of them (asking on would cost a turn as long as the read), and one whose endpoint
    /// can no longer be sent to is copied into the table path.
    pub fn start(&mut self, mut start: impl FnMut(Event) -> Start) {
        for waiting in self.to_start.values_mut() {
            while let Some(event) = waiting.pop_front() {
                match start(event) {
                    Start::Started => self.in_flight += 1,
                    Start::NoRoom(event) => {
                        waiting.push_front(event);
                        break;
                    }
                    Start::Unsendable(event) => {
                        if let Some(&place) = self.places.get(&event.id) {
                            self.deferrals.push(&self.events[place], &event.endpoint, 0, None, Duration::ZERO);
                        }
                    }
                }
            }
        }
        self.to_start.retain(|_, waiting| !waiting.is_empty());
    }

    /// An attempt finished: one of this batch's counts (a failure is copied into the table
    /// path with its error, due after `retry_in`); one of an earlier read does not. After a
    /// failure of any read's, the endpoint's deliveries still waiting for room are copied too,
    /// due then: an endpoint that times out would otherwise hold each read on its way back one
    /// timeout per round of its request slots.
    pub fn finished(&mut self, attempt: &Attempt, retry_in: Duration) {
        if attempt.fence == self.fence {
            self.in_flight = self.in_flight.saturating_sub(1);
            if attempt.outcome != Outcome::Delivered {
                if let Some(event) = self.places.get(&attempt.id).map(|&place| &self.events[place]) {
                    self.deferrals.push(event, &attempt.endpoint, attempt.attempts, attempt.outcome.last_error(), retry_in);
                }
            }
        }
        if attempt.outcome == Outcome::Delivered {
            return;
        }
        for waiting in self.to_start.remove(&*attempt.endpoint).into_iter().flatten() {
            if let Some(&place) = self.places.get(&waiting.id) {
                self.deferrals.push(&self.events[place], &waiting.endpoint, 0, None, retry_in);
            }
        }
    }

    /// Every delivery was acknowledged or failed: once the copies are written, the slot may be
    /// confirmed at `end`.
    pub fn is_done(&self) -> bool {
        self.to_start.is_empty() && self.in_flight == 0
    }
}

/// The oldest transaction running when each recent read began, by the WAL position then: a
/// transaction that commits past that position is that one or newer. What the relay
/// confirms a position with (outbox_log_confirm), so that a lost slot is recovered from it.
#[derive(Debug, Default)]
pub struct ReadStarts {
    starts: VecDeque<(u64, i64)>,
}

impl ReadStarts {
    pub fn note(&mut self, position: u64, oldest: i64) {
        self.starts.push_back((position, oldest));
    }

    /// For a confirmation at `end`: the newest read start at or before it (0 if none, which
    /// keeps what was confirmed before). Older ones are dropped.
    pub fn oldest_for(&mut self, end: u64) -> i64 {
        let mut oldest = 0;
        while let Some(&(position, xact)) = self.starts.front() {
            if position > end {
                break;
            }
            oldest = xact;
            self.starts.pop_front();
        }
        // The last one used still holds for later positions.
        if oldest != 0 {
            self.starts.push_front((end, oldest));
        }
        oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64) -> LogEvent {
        LogEvent { id, topic: "t".into(), payload: "{}".into(), key: None, created_at: "2026-12-04 13:00:00+00".into() }
    }

    fn route(event: i32, endpoint: &str, body: Option<&str>) -> Route {
        Route { event, endpoint: endpoint.into(), body: body.map(str::to_string) }
    }

    fn attempt(event: &Event, outcome: Outcome) -> Attempt {
        Attempt { endpoint: event.endpoint.clone(), id: event.id, attempts: 1, fence: event.fence, outcome, took: Duration::ZERO }
    }

    #[test]
    fn routes_with_a_body_are_sent_the_rest_copied_and_failures_copied_with_their_error() {
        let routes = vec![route(1, "hook", Some("b1")), route(1, "jobs", None), route(2, "hook", Some("b2")), route(2, "gone", Some("b"))];
        let sendable = |name: &str| (name == "hook").then(|| Arc::from(name));
        let mut batch = LogBatch::new(vec![event(10), event(11)], 99, next_log_fence(0), routes, sendable);
        assert_eq!(batch.deferrals.endpoints, ["jobs", "gone"], "a pull endpoint's, and one the relay cannot send to");
        assert_eq!(batch.deferrals.ids, [10, 11]);
        batch.deferrals = Deferrals::default();

        let mut started = Vec::new();
        batch.start(|event| {
            started.push(event);
            Start::Started
        });
        assert_eq!(started.iter().map(|e| (e.id, e.fence)).collect::<Vec<_>>(), [(10, -1), (11, -1)]);
        assert!(is_log_fence(started[0].fence) && !is_log_fence(1), "a claim's token is at least 1");
        assert!(!batch.is_done());
        batch.finished(&attempt(&started[0], Outcome::Delivered), Duration::from_secs(1));
        assert!(batch.deferrals.is_empty(), "an acknowledged delivery writes nothing");
        batch.finished(
            &attempt(&started[1], Outcome::Rejected { status: 503, retry_after: None, response: String::new() }),
            Duration::from_secs(2),
        );
        assert!(batch.is_done());
        assert_eq!((batch.deferrals.ids.as_slice(), batch.deferrals.attempts.as_slice()), ([11].as_slice(), [1].as_slice()));
        assert_eq!(batch.deferrals.due_in_ms, [2000.0]);
        assert!(batch.deferrals.errors[0].as_deref().is_some_and(|e| e.contains("503")));
    }

    #[test]
    fn deliveries_wait_for_room_in_the_read_order_and_one_no_longer_sendable_is_copied() {
        let routes = (1..=4).map(|n| route(n, "hook", Some("b"))).chain([route(5, "other", Some("b"))]).collect();
        let events = (1..=5).map(event).collect();
        let mut batch = LogBatch::new(events, 9, next_log_fence(0), routes, |name| Some(Arc::from(name)));
        let mut offered = Vec::new();
        batch.start(|event| {
            offered.push(event.id);
            match event.id {
                1 | 5 => Start::Started,
                2 => Start::Unsendable(event),
                _ => Start::NoRoom(event),
            }
        });
        offered.sort();
        assert_eq!(offered, [1, 2, 3, 5], "once hook has no room, its later deliveries are not offered; other's is");
        assert_eq!(batch.deferrals.ids, [2]);
        let mut started = Vec::new();
        batch.start(|event| {
            started.push(event.id);
            Start::Started
        });
        assert_eq!(started, [3, 4], "in the read's order");
        assert!(!batch.is_done(), "three in flight");
    }

    #[test]
    fn after_a_failure_the_endpoints_deliveries_waiting_for_room_are_copied_and_the_others_go_on() {
        let routes = (1..=3).map(|n| route(n, "slow", Some("b"))).chain([route(4, "fast", Some("b"))]).collect();
        let mut batch = LogBatch::new((1..=4).map(event).collect(), 9, next_log_fence(0), routes, |name| Some(Arc::from(name)));
        let mut started = Vec::new();
        batch.start(|event| match event.id {
            2 | 3 => Start::NoRoom(event),
            _ => {
                started.push(event);
                Start::Started
            }
        });

        let mut ids: Vec<i64> = started.iter().map(|e| e.id).collect();
        ids.sort();
        assert_eq!(ids, [1, 4], "slow's first, and fast's");
        let slow = started.iter().find(|e| e.id == 1).unwrap();
        batch.finished(&attempt(slow, Outcome::TimedOut), Duration::from_secs(5));
        assert_eq!(batch.deferrals.ids, [1, 2, 3], "the failure, then what waited behind it");
        assert_eq!(batch.deferrals.attempts, [1, 0, 0]);
        assert_eq!(batch.deferrals.due_in_ms, [5000.0, 5000.0, 5000.0]);
        assert!(!batch.is_done(), "fast's is still in flight");
        let fast = started.iter().find(|e| e.id == 4).unwrap();
        batch.finished(&attempt(fast, Outcome::Delivered), Duration::ZERO);
        assert!(batch.is_done());
    }

    #[test]
    fn a_failure_of_one_read_copies_what_waits_for_the_same_endpoint_in_another() {
        let routes = vec![route(1, "slow", Some("b")), route(2, "slow", Some("b"))];
        let mut later =
            LogBatch::new((1..=2).map(event).collect(), 9, next_log_fence(next_log_fence(0)), routes, |name| Some(Arc::from(name)));
        later.start(Start::NoRoom);
        let earlier_failure = Attempt {
            endpoint: Arc::from("slow"),
            id: 7,
            attempts: 1,
            fence: next_log_fence(0),
            outcome: Outcome::TimedOut,
            took: Duration::ZERO,
        };
        later.finished(&earlier_failure, Duration::from_secs(5));
        assert_eq!(later.deferrals.ids, [1, 2], "what waited for slow, not the earlier read's event");
        assert!(later.is_done());
    }

    #[test]
    fn later_reads_are_told_from_earlier_ones_across_the_wrap() {
        let first = next_log_fence(0);
        assert!(is_later_read(first, 0));
        assert!(is_later_read(next_log_fence(first), first));
        assert!(!is_later_read(first, next_log_fence(first)), "a late failure of an earlier read");
        assert!(!is_later_read(first, first));
        assert!(is_later_read(next_log_fence(-i32::MAX), -i32::MAX), "after the wrap");
        assert!(!is_later_read(-i32::MAX, next_log_fence(-i32::MAX)));
    }

    #[test]
    fn two_reads_in_a_row_never_share_a_fencing_token() {
        for last in [0, -1, -2, 1 - i32::MAX, -i32::MAX] {
            let next = next_log_fence(last);
            assert!(is_log_fence(next) && next != 0, "after {last}: {next}");
            assert_ne!(next, next_log_fence(next), "two reads in a row, after {last}");
        }
        assert_eq!((next_log_fence(0), next_log_fence(-1), next_log_fence(-i32::MAX)), (-1, -2, -1));
    }

    #[test]
    fn a_late_result_of_a_read_let_go_of_counts_for_no_later_read_of_the_same_event() {
        let routes = || vec![route(1, "hook", Some("b"))];
        let sendable = |name: &str| Some(Arc::from(name));
        let mut let_go = LogBatch::new(vec![event(10)], 9, next_log_fence(0), routes(), sendable);
        let mut started = Vec::new();
        let_go.start(|event| {
            started.push(event);
            Start::Started
        });
        let mut again = LogBatch::new(vec![event(10)], 9, next_log_fence(-1), routes(), sendable);
        again.start(|event| {
            started.push(event);
            Start::Started
        });
        again.finished(&attempt(&started[0], Outcome::Delivered), Duration::ZERO);
        assert!(!again.is_done(), "the first read's attempt is not the second's");
        again.finished(&attempt(&started[1], Outcome::Delivered), Duration::ZERO);
        assert!(again.is_done());
    }

    #[test]
    fn a_position_is_confirmed_with_the_newest_read_that_began_at_or_before_it() {
        let mut starts = ReadStarts::default();
        starts.note(100, 7);
        starts.note(300, 9);
        assert_eq!(starts.oldest_for(50), 0, "no read began that early: keep what was confirmed");
        assert_eq!(starts.oldest_for(200), 7);
        assert_eq!(starts.oldest_for(250), 7);
        assert_eq!(starts.oldest_for(300), 9);
    }
}
