//! The events filter: what the console's events page and its bulk actions select, read from a
//! query string (`state=dead&endpoint=billing&topic=order.*&…`) and checked before any SQL
//! runs, into the parameters of sql/filter.sql.

use postgres::types::{ToSql, Type};

use outbox_core::statements::qualify;

const FILTER: &str = include_str!("sql/filter.sql");
const BOUNDS: &str = include_str!("sql/bounds.sql");
const WITHIN_BOUNDS: &str = include_str!("sql/within_bounds.sql");

/// The states a delivery is listed by.
pub const STATES: [&str; 4] = ["pending", "waiting", "dead", "sent"];

/// `sql` with sql/filter.sql in place of its `--@include filter.sql` line and the filter's
/// bounds (sql/bounds.sql) in place of its `--@include bounds.sql` line, naming the outbox's
/// objects by `schema`.
pub fn with_filter(sql: &str, schema: &str) -> String {
    let filter = FILTER.replace("--@include within_bounds.sql", WITHIN_BOUNDS);
    qualify(&sql.replace("--@include bounds.sql", BOUNDS).replace("--@include filter.sql", &filter), schema)
}

/// The planner's guess at how many deliveries a filter matches (EXPLAIN, no row read): the
/// filter without its bounds, which change no row it matches but hide their values from the
/// planner.
pub fn estimate(schema: &str) -> String {
    qualify(&format!("EXPLAIN SELECT\n{}", FILTER.replace("--@include within_bounds.sql", "")), schema)
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub state: Option<String>,
    pub endpoint: Option<String>,
    /// An exact topic, or with `topic_prefix` the start of one (`order.*` is `order.`).
    pub topic: Option<String>,
    pub topic_prefix: bool,
    pub key: Option<String>,
    pub event_id: Option<i64>,
    /// created_at from (inclusive) and until (exclusive), as PostgreSQL reads a timestamptz.
    pub since: Option<String>,
    pub until: Option<String>,
    /// An SQL/JSON path the payload must match (`@?`), e.g. `$.customer ? (@ == "c-1")`.
    pub json_path: Option<String>,
    /// The last row of the page before: event id and endpoint.
    pub after: Option<(i64, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("state must be one of pending, waiting, dead or sent, not {0:?}")]
    State(String),
    #[error("{0:?} is not an event id")]
    EventId(String),
    #[error("topic pattern {0:?}: write a topic (order.placed), a prefix (order.*) or *")]
    Topic(String),
    #[error("after must be an event id and an endpoint, as event_id:endpoint")]
    Cursor,
    #[error("unknown filter {0:?}: use state, endpoint, topic, key, id, since, until, path or after")]
    Unknown(String),
}

impl Filter {
    /// The filter a query string gives; empty values filter nothing.
    pub fn parse(query: &str) -> Result<Filter, FilterError> {
        let mut filter = Filter::default();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = value.trim().to_string();
            if value.is_empty() {
                continue;
            }
            match name.as_ref() {
                "state" if STATES.contains(&value.as_str()) => filter.state = Some(value),
                "state" => return Err(FilterError::State(value)),
                "endpoint" => filter.endpoint = Some(value),
                "topic" => filter.set_topic(&value)?,
                "key" => filter.key = Some(value),
                "id" => filter.event_id = Some(value.parse().map_err(|_| FilterError::EventId(value))?),
                "since" => filter.since = Some(value),
                "until" => filter.until = Some(value),
                "path" => filter.json_path = Some(value),
                "after" => {
                    let (id, endpoint) = value.split_once(':').ok_or(FilterError::Cursor)?;
                    filter.after = Some((id.parse().map_err(|_| FilterError::Cursor)?, endpoint.to_string()));
                }
                other => return Err(FilterError::Unknown(other.to_string())),
            }
        }
        Ok(filter)
    }

    /// Topic patterns as endpoints subscribe with them: `*`, a topic, or `prefix.*`.
    fn set_topic(&mut self, pattern: &str) -> Result<(), FilterError> {
        if pattern == "*" {
            return Ok(());
        }
        let (topic, prefix) = match pattern.strip_suffix('*') {
            Some(start) if start.ends_with('.') && start.len() > 1 => (start, true),
            Some(_) => return Err(FilterError::Topic(pattern.to_string())),
            None => (pattern, false),
        };
        if topic.contains('*') {
            return Err(FilterError::Topic(pattern.to_string()));
        }
        self.topic = Some(topic.to_string());
        self.topic_prefix = prefix;
        Ok(())
    }

    /// $1 to $9 of sql/filter.sql.
    pub fn parameters(&self) -> Vec<(&(dyn ToSql + Sync), Type)> {
        vec![
            (&self.state, Type::TEXT),
            (&self.endpoint, Type::TEXT),
            (&self.topic, Type::TEXT),
            (&self.topic_prefix, Type::BOOL),
            (&self.key, Type::TEXT),
            (&self.event_id, Type::INT8),
            (&self.since, Type::TEXT),
            (&self.until, Type::TEXT),
            (&self.json_path, Type::TEXT),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_string_becomes_the_filters_parameters() {
        let filter =
            Filter::parse("state=dead&endpoint=billing&topic=order.*&key=c%2D1&id=42&since=2026-01-01&path=%24.a&after=41%3Abilling")
                .unwrap();
        assert_eq!(filter.state.as_deref(), Some("dead"));
        assert_eq!(filter.endpoint.as_deref(), Some("billing"));
        assert_eq!((filter.topic.as_deref(), filter.topic_prefix), (Some("order."), true));
        assert_eq!(filter.key.as_deref(), Some("c-1"));
        assert_eq!(filter.event_id, Some(42));
        assert_eq!(filter.since.as_deref(), Some("2026-01-01"));
        assert_eq!(filter.json_path.as_deref(), Some("$.a"));
        assert_eq!(filter.after, Some((41, "billing".to_string())));
        assert_eq!(filter.parameters().len(), 9);
    }

    #[test]
    fn empty_values_and_the_star_filter_nothing() {
        assert_eq!(Filter::parse("state=&topic=*&key=").unwrap(), Filter::default());
        assert!(!Filter::parse("topic=order.placed").unwrap().topic_prefix);
        assert_eq!(Filter::parse("after=7%3Aa%3Ab").unwrap().after, Some((7, "a:b".to_string())));
    }

    #[test]
    fn bad_filters_are_refused_with_what_to_write() {
        assert_eq!(Filter::parse("state=gone"), Err(FilterError::State("gone".into())));
        assert_eq!(Filter::parse("id=1;drop"), Err(FilterError::EventId("1;drop".into())));
        for pattern in ["order*", "*.x", "a.*.b", ".*"] {
            assert!(matches!(Filter::parse(&format!("topic={pattern}")), Err(FilterError::Topic(_))), "{pattern}");
        }
        assert_eq!(Filter::parse("after=x"), Err(FilterError::Cursor));
        assert_eq!(Filter::parse("order=1"), Err(FilterError::Unknown("order".into())));
    }
}
