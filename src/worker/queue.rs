//! The worker's statements against the extension's tables (SPI, main thread only). Each function is
//! one short transaction; none is open while a request is in flight, and an ERROR in one
//! comes back as an `Err` (see `transaction`).

use std::sync::Arc;
use std::time::Duration;

use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient};

use super::transaction::{self, TransactionError};
use crate::catalog::Installation;
use outbox_core::delivery::{retry_delay, Attempt, AttemptKey, Event};
use outbox_core::endpoints::{ClaimPlan, EndpointRow};
use outbox_core::statements::{
    CLAIM_BATCH, DELETE_EMPTIED_EVENTS, DELETE_EXPIRED, DISABLE_FAILING_ENDPOINTS, ENDPOINTS_VERSION, LOAD_ENDPOINTS, MARK_SENT,
    NOTE_UNUSABLE_ENDPOINTS, RECORD_FAILURES, SEQUENCE, UNCOUNT_ABANDONED,
};

/// A delivery that ran out of attempts, and the last failure it had.
pub struct DeadDelivery {
    pub endpoint: String,
    pub event_id: i64,
    pub attempts: i32,
    pub last_error: String,
}

/// The worker's statements, with the extension's tables named by their schema. Those run for
/// every batch are prepared once (planning the claim took longer than running it); the
/// others run at most once a poll and are planned each time, with their arguments' values.
pub struct Queries {
    pub installation: Installation,
    endpoints_version: OwnedPreparedStatement,
    sequence: OwnedPreparedStatement,
    claim_batch: OwnedPreparedStatement,
    mark_sent: OwnedPreparedStatement,
    record_failures: OwnedPreparedStatement,
    disable_failing_endpoints: String,
    load_endpoints: String,
    note_unusable_endpoints: String,
    delete_expired: String,
    delete_emptied_events: String,
    uncount_abandoned: String,
}

/// The statements for `installation`, prepared in a transaction of their own.
pub fn prepare(installation: Installation) -> Result<Queries, TransactionError> {
    use pg_sys::{FLOAT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8OID, OIDOID, TEXTARRAYOID};
    let prepared = transaction::run(|| {
        Spi::connect_mut(|client| {
            let prepare = |sql: &str, types: &[pg_sys::Oid]| -> Result<OwnedPreparedStatement, pgrx::spi::SpiError> {
                let types: Vec<pg_sys::PgOid> = types.iter().map(|oid| (*oid).into()).collect();
                Ok(client.prepare_mut(installation.qualify(sql).as_str(), &types)?.keep())
            };
            Ok([
                prepare(ENDPOINTS_VERSION, &[])?,
                prepare(SEQUENCE, &[TEXTARRAYOID])?,
                prepare(CLAIM_BATCH, &[TEXTARRAYOID, INT8ARRAYOID, FLOAT8ARRAYOID, INT4ARRAYOID, INT8OID])?,
                prepare(MARK_SENT, &[TEXTARRAYOID, INT8ARRAYOID, INT4ARRAYOID, OIDOID])?,
                prepare(RECORD_FAILURES, &[TEXTARRAYOID, INT8ARRAYOID, INT4ARRAYOID, TEXTARRAYOID, FLOAT8ARRAYOID, INT4ARRAYOID, OIDOID])?,
            ])
        })
    })?;
    let [endpoints_version, sequence, claim_batch, mark_sent, record_failures] = prepared;
    Ok(Queries {
        endpoints_version,
        sequence,
        claim_batch,
        mark_sent,
        record_failures,
        disable_failing_endpoints: installation.qualify(DISABLE_FAILING_ENDPOINTS),
        load_endpoints: installation.qualify(LOAD_ENDPOINTS),
        note_unusable_endpoints: installation.qualify(NOTE_UNUSABLE_ENDPOINTS),
        delete_expired: installation.qualify(DELETE_EXPIRED),
        delete_emptied_events: installation.qualify(DELETE_EMPTIED_EVENTS),
        uncount_abandoned: installation.qualify(UNCOUNT_ABANDONED),
        installation,
    })
}

/// The claim as the workers run it; the EXPLAIN test plans the same text.
#[cfg(test)]
pub fn claim_batch_sql(installation: &Installation) -> String {
    installation.qualify(CLAIM_BATCH)
}

/// The worker's session settings, each with why.
const SESSION_SETTINGS: [(&str, &str); 8] = [
    // Every statement the worker runs resolves operators and functions in pg_catalog, and
    // names the extension's tables by schema, so nothing another role created (in public or in
    // the extension's schema) runs as this worker.
    ("search_path", "pg_catalog, pg_temp"),
    // The prepared statements' plans do not depend on their arguments' values: plan them once,
    // not again for each call as the plan cache may choose to.
    ("plan_cache_mode", "force_generic_plan"),
    // A plan made once must suit the tables at any size. Made while they were small (after
    // CREATE EXTENSION or a TRUNCATE, before autovacuum's ANALYZE), it would read the whole of
    // outbox_deliveries for each batch once the backlog grows, and each batch would then take
    // longer than the last. Every statement on the queue's tables finds its rows by an index
    // or by their addresses: rule table scans out.
    ("enable_seqscan", "off"),
    // A claim reads its endpoint's queue in claim order from outbox_deliveries_pending;
    // through any other index it would read all of the endpoint's rows and sort them, for each
    // batch. The planner chose that once (the primary key, whose second column is the
    // endpoint, and a sort) with statistics from a table where every delivery was sent: each
    // claim of a 100,000 backlog took 50-100 ms. Rule sorts out.
    ("enable_sort", "off"),
    // Needed with the two above: the scans and sorts left (of a sequence, of the few
    // endpoints, of a batch's rows) keep the penalty that rules them out elsewhere, which is
    // far above jit_above_cost, and would have every such statement compiled. The workers'
    // statements are short.
    ("jit", "off"),
    // A claim, a failure or a retention pass lost in a crash costs at most a request sent
    // again, which the lease allows anyway: their commits need not wait for the WAL to reach
    // disk (the claim is on every event's way to its receiver). Recording an acknowledgement
    // does wait, as the server is configured to (see `mark_sent`).
    ("synchronous_commit", "off"),
    // In a deadlock with someone's DDL (DROP EXTENSION, a TRUNCATE, an ALTER TABLE that locks
    // the tables in another order than a worker statement), the worker, which checks first, is
    // the one that gives way: its statement fails and is tried again; the user's command goes
    // through.
    ("deadlock_timeout", "100ms"),
    // Each statement sees what committed before it began, whatever default_transaction_isolation
    // the server or database sets: retention's second statement must see the deliveries that
    // a replay wrote before the first one locked their events (sql/delete_emptied_events.sql).
    ("default_transaction_isolation", "read committed"),
];

/// Sets up the worker's session for its statements (`SESSION_SETTINGS`), in one statement
/// that names everything by schema, since the search_path is not pinned yet.
pub fn prepare_session() -> Result<(), TransactionError> {
    let (names, values): (Vec<&str>, Vec<&str>) = SESSION_SETTINGS.iter().copied().unzip();
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update(
                "SELECT pg_catalog.set_config(s.name, s.value, false)
                   FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS s (name, value)",
                None,
                &[names.clone().into(), values.clone().into()],
            )?;
            Ok(())
        })
    })
}

/// The extension as installed in this database now, or `None`.
pub fn find_installation() -> Result<Option<Installation>, TransactionError> {
    transaction::run(|| Spi::connect(Installation::find))
}

/// What `load_endpoints` found.
pub enum Endpoints {
    /// The endpoints that were just disabled (name and reason), those to claim for, and the
    /// version of the endpoints they are (see `claim_batch`).
    Read { disabled: Vec<(String, String)>, endpoints: Vec<EndpointRow>, version: i64 },
    /// The extension these statements were made for is gone (dropped, perhaps created again:
    /// the same table names may now hold other rows).
    ExtensionGone,
}

/// Disables the endpoints that have been failing for `disable_after`, then reads the webhook
/// endpoints to claim for; first of all, checks that the extension is still the one the
/// worker knows.
pub fn load_endpoints(queries: &Queries, disable_after: Option<Duration>) -> Result<Endpoints, TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            let same = "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $1)";
            if client.select(same, None, &[queries.installation.oid.into()])?.first().get_one::<bool>()? != Some(true) {
                return Ok(Endpoints::ExtensionGone);
            }
            // Read first: a change after this makes the next claim see a newer version.
            let version = endpoints_version(client, queries)?;
            let mut disabled = Vec::new();
            if let Some(after) = disable_after {
                for row in client.update(queries.disable_failing_endpoints.as_str(), None, &[millis(after).into()])? {
                    disabled.push((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default()));
                }
            }
            let mut endpoints = Vec::new();
            for row in client.select(queries.load_endpoints.as_str(), None, &[])? {
                let names: Vec<String> = row.get(3)?.unwrap_or_default();
                let values: Vec<String> = row.get(4)?.unwrap_or_default();
                endpoints.push(EndpointRow {
                    name: row.get(1)?.unwrap_or_default(),
                    url: row.get(2)?,
                    headers: names.into_iter().zip(values).collect(),
                    timeout: row.get::<f64>(5)?.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)),
                    max_attempts: row.get(6)?,
                    max_in_flight: row.get(7)?,
                    secrets: row.get(8)?.unwrap_or_default(),
                    ordered: row.get(9)?.unwrap_or(false),
                });
            }
            Ok(Endpoints::Read { disabled, endpoints, version })
        })
    })
}

/// `outbox_endpoints_version`, which every change to an endpoint moves on as it commits.
fn endpoints_version(client: &mut SpiClient<'_>, queries: &Queries) -> Result<i64, pgrx::spi::SpiError> {
    Ok(client.update(&queries.endpoints_version, None, &[])?.first().get_one::<i64>()?.unwrap_or(0))
}

/// What a claim got: the deliveries to send, those it found out of attempts (made dead), and
/// whether the worker's budgets left due deliveries out; or nothing because the endpoints
/// changed since the worker read them at `version` (it reads them again and claims then: a new
/// secret signs every attempt started after its rotation committed).
pub enum Claimed {
    Deliveries { claimed: Vec<Event>, dead: Vec<DeadDelivery>, left_out: bool },
    EndpointsChanged,
}

/// Claims up to the given number of due deliveries of each endpoint, with
/// `synchronous_commit = off`: losing a claim in a crash only makes its deliveries claimable
/// again (they were at most in flight), and the next acknowledgement, committed synchronously,
/// flushes the claim's WAL with its own. One WAL flush per batch is saved. (A sequencing lost
/// the same way is done again: its arrivals come back with it.)
pub fn claim_batch(queries: &Queries, plan: &ClaimPlan, version: i64) -> Result<Claimed, TransactionError> {
    let wanted = &plan.claims;
    let endpoints: Vec<String> = wanted.iter().map(|claim| claim.endpoint.to_string()).collect();
    let limits: Vec<i64> = wanted.iter().map(|claim| claim.limit as i64).collect();
    let leases: Vec<f64> = wanted.iter().map(|claim| millis(claim.lease)).collect();
    let caps: Vec<i32> = wanted.iter().map(|claim| claim.max_attempts).collect();
    let ordered: Vec<String> = wanted.iter().filter(|claim| claim.ordered).map(|claim| claim.endpoint.to_string()).collect();
    let claimed = transaction::run(|| {
        Spi::connect_mut(|client| {
            if endpoints_version(client, queries)? != version {
                return Ok(None);
            }
            client.update("SET LOCAL synchronous_commit = off", None, &[])?;
            if !ordered.is_empty() {
                client.update(&queries.sequence, None, &[ordered.clone().into()])?;
            }
            let args = [endpoints.into(), limits.into(), leases.into(), caps.into(), (plan.bytes as i64).into()];
            let mut claimed = Vec::new();
            let mut dead = Vec::new();
            let mut left_out = plan.cut_short;
            for row in client.update(&queries.claim_batch, None, &args)? {
                let Some(endpoint) = row.get::<String>(1)? else {
                    left_out = true;
                    continue;
                };
                let event_id = row.get::<i64>(2)?.unwrap_or_default();
                let attempts = row.get::<i32>(3)?.unwrap_or_default();
                match row.get::<String>(4)? {
                    Some(body) => claimed.push((endpoint, event_id, attempts, row.get::<i32>(6)?.unwrap_or_default(), body)),
                    None => dead.push(DeadDelivery { endpoint, event_id, attempts, last_error: row.get(5)?.unwrap_or_default() }),
                }
            }
            Ok(Some((claimed, dead, left_out)))
        })
    })?;
    let Some((claimed, dead, left_out)) = claimed else { return Ok(Claimed::EndpointsChanged) };
    // Share the endpoint names the worker already holds instead of one copy per delivery.
    let claimed = claimed
        .into_iter()
        .filter_map(|(endpoint, id, attempts, fence, body)| {
            let endpoint = wanted.iter().find(|claim| *claim.endpoint == *endpoint)?.endpoint.clone();
            Some(Event { endpoint, id, attempts, fence, body: body.into() })
        })
        .collect();
    Ok(Claimed::Deliveries { claimed, dead, left_out })
}

/// Records acknowledged deliveries (endpoint, event id, fencing token) in a transaction of
/// their own, so that nothing else that fails can take an acknowledgement with it. Returns how
/// many deliveries of ordered endpoints that made claimable (the next of each key sent).
pub fn mark_sent(queries: &Queries, acks: &[(Arc<str>, i64, i32)]) -> Result<i64, TransactionError> {
    let endpoints: Vec<String> = acks.iter().map(|(endpoint, _, _)| endpoint.to_string()).collect();
    let ids: Vec<i64> = acks.iter().map(|(_, id, _)| *id).collect();
    let fences: Vec<i32> = acks.iter().map(|(_, _, fence)| *fence).collect();
    transaction::run(|| {
        Spi::connect_mut(|client| {
            // Durable before the worker goes on: an acknowledged delivery is not sent again
            // after a crash. The server's own setting, not the session's (prepare_session).
            client.update("SET LOCAL synchronous_commit TO DEFAULT", None, &[])?;
            let args = [endpoints.into(), ids.into(), fences.into(), queries.installation.oid.into()];
            let rows = client.update(&queries.mark_sent, None, &args)?;
            let mut released = 0;
            for row in rows {
                released += i64::from(row.get::<i32>(2)?.unwrap_or(0));
            }
            Ok(released)
        })
    })
}

/// Records failed attempts, each with its endpoint's attempt cap: `last_error` and the retry
/// time, or `dead_at` at the cap; and the endpoints' health.
pub fn record_failures(queries: &Queries, failed: &[(&Attempt, i32)]) -> Result<Vec<DeadDelivery>, TransactionError> {
    let endpoints: Vec<String> = failed.iter().map(|(a, _)| a.endpoint.to_string()).collect();
    let ids: Vec<i64> = failed.iter().map(|(a, _)| a.id).collect();
    let fences: Vec<i32> = failed.iter().map(|(a, _)| a.fence).collect();
    let errors: Vec<String> = failed.iter().map(|(a, _)| a.outcome.last_error().unwrap_or_default()).collect();
    let retry_ms: Vec<f64> =
        failed.iter().map(|(a, _)| millis(retry_delay(a.attempts, a.outcome.retry_after(), fastrand::f64()))).collect();
    let caps: Vec<i32> = failed.iter().map(|(_, cap)| *cap).collect();
    transaction::run(|| {
        Spi::connect_mut(|client| {
            let args =
                [endpoints.into(), ids.into(), fences.into(), errors.into(), retry_ms.into(), caps.into(), queries.installation.oid.into()];
            let rows = client.update(&queries.record_failures, None, &args)?;
            let mut dead = Vec::new();
            for row in rows {
                if row.get::<bool>(4)?.unwrap_or(false) {
                    dead.push(DeadDelivery {
                        endpoint: row.get(1)?.unwrap_or_default(),
                        event_id: row.get(2)?.unwrap_or_default(),
                        attempts: row.get(3)?.unwrap_or_default(),
                        last_error: row.get(5)?.unwrap_or_default(),
                    });
                }
            }
            Ok(dead)
        })
    })
}

/// Takes back the attempts a stopping worker abandons (endpoint, event id, fencing token), so
/// that a restart never uses up a delivery's last attempt.
pub fn uncount_abandoned<'a>(queries: &Queries, abandoned: impl Iterator<Item = &'a AttemptKey>) -> Result<(), TransactionError> {
    let mut endpoints = Vec::new();
    let mut ids = Vec::new();
    let mut fences = Vec::new();
    for (endpoint, id, fence) in abandoned {
        endpoints.push(endpoint.to_string());
        ids.push(*id);
        fences.push(*fence);
    }
    transaction::run(|| {
        Spi::connect_mut(|client| {
            // A stopping worker must exit within seconds: if a row is locked, the attempt counts.
            client.update("SET LOCAL lock_timeout = '500ms'", None, &[])?;
            let args = [endpoints.into(), ids.into(), fences.into(), queries.installation.oid.into()];
            client.update(queries.uncount_abandoned.as_str(), None, &args)?;
            Ok(())
        })
    })
}

/// Records, in the health of each endpoint named, why the workers cannot send to it.
pub fn note_unusable_endpoints(queries: &Queries, names: Vec<String>, reasons: Vec<String>) -> Result<(), TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            client.update(queries.note_unusable_endpoints.as_str(), None, &[names.into(), reasons.into()])?;
            Ok(())
        })
    })
}

/// Deletes up to `limit` deliveries sent longer than `retention` ago (and as many unrouted
/// events that old), then their events once nothing else waits for them; returns how many
/// deliveries and unrouted events went.
pub fn delete_expired(
    queries: &Queries,
    retention: Option<Duration>,
    dead_retention: Option<Duration>,
    limit: usize,
) -> Result<usize, TransactionError> {
    transaction::run(|| {
        Spi::connect_mut(|client| {
            let args = [retention.map(millis).into(), (limit as i64).into(), dead_retention.map(millis).into()];
            let (deleted, events) = client.update(queries.delete_expired.as_str(), None, &args)?.first().get_two::<i64, Vec<i64>>()?;
            let events = events.unwrap_or_default();
            if !events.is_empty() {
                client.update(queries.delete_emptied_events.as_str(), None, &[events.into()])?;
            }
            Ok(deleted.unwrap_or(0) as usize)
        })
    })
}

/// A duration as float8 milliseconds, the type the statements multiply an interval by.
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
