//! What the console changes: each action is one call of a function the contract defines, so
//! the database's rules and the console role's privileges decide, in a transaction of its own.

use postgres::types::{ToSql, Type};
use postgres::Client;
use serde::Deserialize;

use super::filter::{with_filter, Filter, FilterError};
use super::reads::BULK_TIMEOUT;
use outbox_core::statements::qualify;

/// An action, as the console's page posts it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Puts the event's dead (or pending) deliveries back, to one endpoint or all.
    Requeue {
        event_id: i64,
        endpoint: Option<String>,
    },
    /// Unblocks an ordered key whose head is dead.
    Skip {
        endpoint: String,
        event_id: i64,
    },
    /// Delivers again what the endpoint was sent in a window.
    Replay {
        endpoint: String,
        since: String,
        until: Option<String>,
    },
    /// Requeues or skips every delivery a filter (a query string, as the events page has it)
    /// matches.
    Bulk {
        operation: Operation,
        filter: String,
    },
    /// Requeues or skips the deliveries chosen on the events page.
    Selection {
        operation: Operation,
        items: Vec<Delivery>,
    },
    /// Creates or replaces an endpoint.
    EndpointSet {
        name: String,
        url: Option<String>,
        topics: Vec<String>,
        kind: String,
        headers: serde_json::Map<String, serde_json::Value>,
        timeout: Option<String>,
        max_attempts: Option<i32>,
        max_in_flight: Option<i32>,
        ordered: bool,
    },
    /// A new signing secret, returned once.
    Rotate {
        name: String,
        grace: Option<String>,
    },
    Disable {
        name: String,
        reason: Option<String>,
    },
    Enable {
        name: String,
    },
    Drop {
        name: String,
    },
    /// A pull consumer's lease, pushed further.
    Extend {
        endpoint: String,
        event_id: i64,
        attempt: i32,
        lease: String,
    },
    /// A pull consumer's claim, given up as failed.
    Nack {
        endpoint: String,
        event_id: i64,
        attempt: i32,
        error: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Requeue,
    Skip,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Requeue => "requeue",
            Operation::Skip => "skip",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    pub event_id: i64,
    pub endpoint: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Filter(#[from] FilterError),
    #[error("{0}")]
    Database(#[from] postgres::Error),
}

/// The statements, named by the outbox's schema.
pub struct Actions {
    requeue: String,
    skip: String,
    replay: String,
    bulk: String,
    selection: String,
    endpoint_set: String,
    rotate: String,
    disable: String,
    enable: String,
    drop: String,
    extend: String,
    nack: String,
}

impl Actions {
    pub fn new(schema: &str) -> Actions {
        let call = |sql: &str| qualify(sql, schema);
        Actions {
            requeue: call("SELECT @extschema@.outbox_requeue($1, $2)::bigint"),
            skip: call("SELECT @extschema@.outbox_skip($1, $2)::integer::bigint"),
            replay: call("SELECT @extschema@.outbox_replay($1, $2::text::timestamptz, coalesce($3::text::timestamptz, pg_catalog.now()))"),
            bulk: with_filter(include_str!("sql/bulk.sql"), schema),
            selection: call(include_str!("sql/selection.sql")),
            endpoint_set: call(
                "SELECT 0::int8 FROM @extschema@.outbox_endpoint_set(name => $1, url => $2, topics => $3, kind => $4, \
                 headers => $5::text::jsonb, timeout => $6::text::interval, max_attempts => $7, max_in_flight => $8, ordered => $9)",
            ),
            rotate: call("SELECT @extschema@.outbox_endpoint_rotate_secret($1, NULL, coalesce($2::text::interval, interval '24 hours'))"),
            disable: call("SELECT 0::int8 FROM @extschema@.outbox_endpoint_disable($1, coalesce($2, 'disabled by an operator'))"),
            enable: call("SELECT 0::int8 FROM @extschema@.outbox_endpoint_enable($1)"),
            drop: call("SELECT 0::int8 FROM @extschema@.outbox_endpoint_drop($1)"),
            extend: call("SELECT @extschema@.outbox_extend($1, $2, $3, $4::text::interval)::integer::bigint"),
            nack: call("SELECT @extschema@.outbox_nack($1, $2, $3, $4)::integer::bigint"),
        }
    }

    /// Runs `action`; its result as JSON: a count of what changed, or the new secret.
    pub fn run(&self, client: &mut Client, action: &Action) -> Result<String, ActionError> {
        let mut transaction = client.transaction()?;
        transaction.batch_execute(&format!("SET LOCAL statement_timeout = '{BULK_TIMEOUT}'"))?;
        let one = |sql: &str, parameters: &[(&(dyn ToSql + Sync), Type)], transaction: &mut postgres::Transaction| {
            transaction.query_typed_one(sql, parameters)
        };
        let result = match action {
            Action::Requeue { event_id, endpoint } => {
                count(one(&self.requeue, &[(event_id, Type::INT8), (endpoint, Type::TEXT)], &mut transaction)?)
            }
            Action::Skip { endpoint, event_id } => {
                count(one(&self.skip, &[(endpoint, Type::TEXT), (event_id, Type::INT8)], &mut transaction)?)
            }
            Action::Replay { endpoint, since, until } => {
                count(one(&self.replay, &[(endpoint, Type::TEXT), (since, Type::TEXT), (until, Type::TEXT)], &mut transaction)?)
            }
            Action::Bulk { operation, filter } => {
                let filter = Filter::parse(filter)?;
                let mut parameters = filter.parameters();
                let operation = operation.name();
                parameters.push((&operation, Type::TEXT));
                count(one(&self.bulk, &parameters, &mut transaction)?)
            }
            Action::Selection { operation, items } => {
                let ids: Vec<i64> = items.iter().map(|d| d.event_id).collect();
                let endpoints: Vec<&str> = items.iter().map(|d| d.endpoint.as_str()).collect();
                let operation = operation.name();
                let parameters: [(&(dyn ToSql + Sync), Type); 3] =
                    [(&ids, Type::INT8_ARRAY), (&endpoints, Type::TEXT_ARRAY), (&operation, Type::TEXT)];
                count(one(&self.selection, &parameters, &mut transaction)?)
            }
            Action::EndpointSet { name, url, topics, kind, headers, timeout, max_attempts, max_in_flight, ordered } => {
                let headers = serde_json::Value::Object(headers.clone()).to_string();
                let parameters: [(&(dyn ToSql + Sync), Type); 9] = [
                    (name, Type::TEXT),
                    (url, Type::TEXT),
                    (topics, Type::TEXT_ARRAY),
                    (kind, Type::TEXT),
                    (&headers, Type::TEXT),
                    (timeout, Type::TEXT),
                    (max_attempts, Type::INT4),
                    (max_in_flight, Type::INT4),
                    (ordered, Type::BOOL),
                ];
                count(one(&self.endpoint_set, &parameters, &mut transaction)?)
            }
            Action::Rotate { name, grace } => {
                let secret: String = one(&self.rotate, &[(name, Type::TEXT), (grace, Type::TEXT)], &mut transaction)?.get(0);
                serde_json::json!({ "secret": secret }).to_string()
            }
            Action::Disable { name, reason } => count(one(&self.disable, &[(name, Type::TEXT), (reason, Type::TEXT)], &mut transaction)?),
            Action::Enable { name } => count(one(&self.enable, &[(name, Type::TEXT)], &mut transaction)?),
            Action::Drop { name } => count(one(&self.drop, &[(name, Type::TEXT)], &mut transaction)?),
            Action::Extend { endpoint, event_id, attempt, lease } => count(one(
                &self.extend,
                &[(endpoint, Type::TEXT), (event_id, Type::INT8), (attempt, Type::INT4), (lease, Type::TEXT)],
                &mut transaction,
            )?),
            Action::Nack { endpoint, event_id, attempt, error } => count(one(
                &self.nack,
                &[(endpoint, Type::TEXT), (event_id, Type::INT8), (attempt, Type::INT4), (error, Type::TEXT)],
                &mut transaction,
            )?),
        };
        transaction.commit()?;
        Ok(result)
    }
}

/// `{"changed": n}` from a statement's one bigint.
fn count(row: postgres::Row) -> String {
    format!("{{\"changed\":{}}}", row.get::<_, i64>(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_read_from_the_json_the_page_posts() {
        let requeue: Action = serde_json::from_str(r#"{"action":"requeue","event_id":7,"endpoint":null}"#).unwrap();
        assert_eq!(requeue, Action::Requeue { event_id: 7, endpoint: None });
        let bulk: Action = serde_json::from_str(r#"{"action":"bulk","operation":"skip","filter":"state=dead"}"#).unwrap();
        assert_eq!(bulk, Action::Bulk { operation: Operation::Skip, filter: "state=dead".into() });
        for refused in [
            r#"{"action":"truncate"}"#,
            r#"{"action":"requeue","event_id":"7; drop table outbox"}"#,
            r#"{"action":"drop","name":"a","cascade":true}"#,
            r#"{"action":"bulk","operation":"delete","filter":""}"#,
        ] {
            assert!(serde_json::from_str::<Action>(refused).is_err(), "{refused}");
        }
    }
}
