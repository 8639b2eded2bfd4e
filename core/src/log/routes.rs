//! Where the events read from the log go, and the body each delivery sends. The endpoints each
//! topic routes to are asked of the database once per topic (`outbox_log_route`) and kept
//! until the endpoints change; each body is put together here, byte for byte as a claim's
//! `json_build_object` builds it (sql/claim.sql). Routing each read in SQL, bodies included,
//! held the relay's loop a twentieth of a second per read of 6,000 changes, during which no
//! request started.

use std::collections::HashMap;

use super::batch::Route;
use super::LogEvent;

/// Topics whose routes are kept at most: a topic per entity would otherwise grow the cache
/// until the endpoints change.
const TOPICS_KEPT: usize = 10_000;

/// A row of `outbox_log_route`: `topic` goes to `endpoint`, which the relay may send to now
/// (`sendable`: an enabled webhook endpoint) and which keeps its keys' order (`ordered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRoute {
    pub topic: String,
    pub endpoint: String,
    pub sendable: bool,
    pub ordered: bool,
}

/// The routes of the topics seen so far, for one version of the endpoints.
#[derive(Debug, Default)]
pub struct RouteCache {
    version: i64,
    by_topic: HashMap<String, Vec<TopicRoute>>,
}

impl RouteCache {
    /// The topics of `events` not yet routed under endpoints `version` (the routes of another
    /// version are forgotten first, and all of them past `TOPICS_KEPT`), each once.
    pub fn missing(&mut self, events: &[LogEvent], version: i64) -> Vec<String> {
        if version != self.version || self.by_topic.len() > TOPICS_KEPT {
            self.by_topic.clear();
            self.version = version;
        }
        let mut missing: Vec<String> = events.iter().filter(|e| !self.by_topic.contains_key(&e.topic)).map(|e| e.topic.clone()).collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// The routes `outbox_log_route` found for `topics`; a topic with none routes nowhere.
    pub fn insert(&mut self, topics: Vec<String>, routes: Vec<TopicRoute>) {
        for topic in topics {
            self.by_topic.entry(topic).or_default();
        }
        for route in routes {
            self.by_topic.entry(route.topic.clone()).or_default().push(route);
        }
    }

    /// One route per (event, endpoint), events in the read's order (from 1) and each one's
    /// endpoints by name. Sent now (with its body): an event to an enabled webhook endpoint,
    /// unless it has a key and the endpoint keeps order; the rest go through the table path,
    /// where pull consumers claim, an ordered key keeps its order and a disabled endpoint
    /// keeps them.
    pub fn routes(&self, events: &[LogEvent]) -> Vec<Route> {
        let mut routes = Vec::new();
        for (place, event) in events.iter().enumerate() {
            let mut endpoints: Vec<&TopicRoute> = self.by_topic.get(&event.topic).map(|r| r.iter().collect()).unwrap_or_default();
            endpoints.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
            let mut body = None;
            for route in endpoints {
                let direct = route.sendable && !(route.ordered && event.key.is_some());
                let body = direct.then(|| body.get_or_insert_with(|| delivery_body(event)).clone());
                routes.push(Route { event: place as i32 + 1, endpoint: route.endpoint.clone(), body });
            }
        }
        routes
    }
}

/// `json_build_object('type', topic, 'timestamp', created_at, 'data', payload)::text`, from
/// the event's columns as text (the payload as jsonb writes it, created_at in ISO style).
pub fn delivery_body(event: &LogEvent) -> String {
    let mut body = String::with_capacity(event.payload.len() + event.topic.len() + 80);
    body.push_str("{\"type\" : ");
    push_json_string(&mut body, &event.topic);
    body.push_str(", \"timestamp\" : \"");
    body.push_str(&json_timestamp(&event.created_at));
    body.push_str("\", \"data\" : ");
    body.push_str(&event.payload);
    body.push('}');
    body
}

/// A string as PostgreSQL's JSON output escapes it (escape_json): quotes, backslashes and
/// control characters; everything else as it is.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A timestamptz as ISO DateStyle writes it (`2026-12-04 13:00:00.5+05:30`, an offset of whole
/// hours as `+00`) as JSON writes it (`2026-12-04T13:00:00.5+05:30`, every offset with its
/// minutes). Infinities and anything else unexpected stay as they are.
fn json_timestamp(iso: &str) -> String {
    let (stamp, era) = match iso.strip_suffix(" BC") {
        Some(stamp) => (stamp, " BC"),
        None => (iso, ""),
    };
    let Some((date, time)) = stamp.split_once(' ') else { return iso.to_string() };
    let Some(sign_at) = time.rfind(['+', '-']) else { return iso.to_string() };
    let offset = &time[sign_at..];
    let minutes = if offset.len() == 3 { ":00" } else { "" };
    format!("{date}T{time}{minutes}{era}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(topic: &str, key: Option<&str>) -> LogEvent {
        LogEvent {
            id: 1,
            topic: topic.into(),
            payload: "{\"n\": 1}".into(),
            key: key.map(str::to_string),
            created_at: "2026-12-04 13:00:00.25+00".into(),
        }
    }

    fn route(topic: &str, endpoint: &str, sendable: bool, ordered: bool) -> TopicRoute {
        TopicRoute { topic: topic.into(), endpoint: endpoint.into(), sendable, ordered }
    }

    #[test]
    fn timestamps_are_written_as_json_writes_them() {
        assert_eq!(json_timestamp("2026-12-04 13:00:00.25+00"), "2026-12-04T13:00:00.25+00:00");
        assert_eq!(json_timestamp("2026-12-04 13:00:00+05:30"), "2026-12-04T13:00:00+05:30");
        assert_eq!(json_timestamp("2026-12-04 09:30:00.123456-03:30"), "2026-12-04T09:30:00.123456-03:30");
        assert_eq!(json_timestamp("1890-01-01 00:00:00+00:09:21"), "1890-01-01T00:00:00+00:09:21");
        assert_eq!(json_timestamp("0044-03-15 12:00:00+00 BC"), "0044-03-15T12:00:00+00:00 BC");
        assert_eq!(json_timestamp("infinity"), "infinity");
    }

    #[test]
    fn a_body_is_what_json_build_object_writes() {
        let mut odd = event("a\"b\\c\u{1}\n\té", None);
        odd.payload = "[]".into();
        assert_eq!(delivery_body(&odd), r#"{"type" : "a\"b\\c\u0001\n\té", "timestamp" : "2026-12-04T13:00:00.25+00:00", "data" : []}"#);
    }

    #[test]
    fn events_go_to_each_subscribed_endpoint_in_name_order_and_keyed_ones_to_an_ordered_endpoint_through_the_table() {
        let mut cache = RouteCache::default();
        let events = [event("a", Some("k")), event("b", None), event("a", None)];
        assert_eq!(cache.missing(&events, 3), ["a", "b"]);
        cache.insert(
            vec!["a".into(), "b".into()],
            vec![route("a", "zeta", true, false), route("a", "ordered", true, true), route("a", "pull", false, false)],
        );
        assert!(cache.missing(&events, 3).is_empty());
        let routes = cache.routes(&events);
        let summary: Vec<(i32, &str, bool)> = routes.iter().map(|r| (r.event, r.endpoint.as_str(), r.body.is_some())).collect();
        assert_eq!(
            summary,
            [(1, "ordered", false), (1, "pull", false), (1, "zeta", true), (3, "ordered", true), (3, "pull", false), (3, "zeta", true)],
            "b routes nowhere"
        );
        assert_eq!(routes[2].body.as_deref(), Some(delivery_body(&events[0]).as_str()));
        assert_eq!(cache.missing(&events, 4), ["a", "b"], "new endpoints: every topic is routed again");
    }
}
