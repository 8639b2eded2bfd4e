//! The relay's statements over a client connection. Each runs in a short transaction of its
//! own, opened with the relay's settings (`SET LOCAL`, so that a pooler in transaction mode
//! can hand the next transaction to another server process), as unnamed statements. A lost
//! connection is made again by the next statement.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use postgres::types::{ToSql, Type};
use postgres::Client;

use crate::connection::{connect, error_text, find_outbox, Outbox};
use crate::log_stream::{SlotToStream, StreamSignal, StreamedLog};
use crate::metrics::{say, Metrics};
use crate::presence::Presence;
use crate::server_settings::{self, ServerSettings};
use outbox_core::endpoints::EndpointRow;
use outbox_core::log::batch::Deferrals;
use outbox_core::log::routes::TopicRoute;
use outbox_core::queue::{
    millis, AttemptColumns, ClaimArguments, ClaimedRow, DeadDelivery, EndpointsRead, FailureColumns, LogLease, LogRows, Queue, QueueError,
};
use outbox_core::relay::Level;
use outbox_core::settings::defaults;
use outbox_core::statements::{
    CLAIM_BATCH, DELETE_EMPTIED_EVENTS, DELETE_EXPIRED, DISABLE_FAILING_ENDPOINTS, ENDPOINTS_VERSION, LOAD_ENDPOINTS, LOG_CONFIRM,
    LOG_CONFIRM_STREAMED, LOG_DEFER, LOG_LEASE, LOG_MAINTAIN, LOG_MAKE_SLOT, LOG_READ, LOG_READ_START, LOG_RECOVER, LOG_ROUTE, MARK_SENT,
    NOTE_UNUSABLE_ENDPOINTS, RECORD_FAILURES, SEQUENCE, SESSION_SETTINGS, UNCOUNT_ABANDONED,
};

/// The relay's statements for one outbox, with its tables named by their schema.
struct Statements {
    begin: String,
    endpoints_version: String,
    sequence: String,
    claim_batch: String,
    mark_sent: String,
    record_failures: String,
    disable_failing_endpoints: String,
    load_endpoints: String,
    note_unusable_endpoints: String,
    delete_expired: String,
    delete_emptied_events: String,
    uncount_abandoned: String,
    retention_lock: String,
    log_lease: String,
    log_make_slot: String,
    log_recover: String,
    log_read: String,
    log_read_start: String,
    log_route: String,
    log_defer: String,
    log_confirm: String,
    log_confirm_streamed: String,
    log_maintain: String,
}

pub struct ClientQueue {
    url: String,
    client: Option<Client>,
    outbox: Outbox,
    /// The schema of a SQL install, as `--schema` gives it (for looking the outbox up again).
    sql_schema: String,
    statements: Statements,
    /// The relay's row in outbox_relays; its id is who claims, as `claimed_by` records it.
    presence: Presence,
    metrics: Arc<Metrics>,
    /// Log mode: the slot streamed, while it can be.
    log_stream: StreamedLog,
    /// What the server said of this relay when it started (the extension's install): looked
    /// at again at every poll, and the loop ends when it changed (crate::relay starts it again).
    server: Option<ServerSettings>,
}

impl ClientQueue {
    /// The queue of `outbox`, using `client` until it fails.
    pub fn new(
        url: &str,
        client: Client,
        outbox: Outbox,
        sql_schema: &str,
        presence: Presence,
        metrics: Arc<Metrics>,
        log_streamed: Arc<StreamSignal>,
    ) -> ClientQueue {
        // The workers' session settings, for this transaction only; but the isolation level is
        // BEGIN's, and deadlock_timeout is a superuser's to set (the relay's role need not be).
        // Every commit waits for the WAL, as the server is configured to: unlike a worker, this
        // process outlives a server crash, and a claim lost in one would let another relay send
        // the delivery while this one still sends it (for an ordered key, two in flight at once).
        let settings: Vec<String> = SESSION_SETTINGS
            .iter()
            .filter(|(name, _)| !matches!(*name, "default_transaction_isolation" | "deadlock_timeout" | "synchronous_commit"))
            .map(|(name, value)| format!("pg_catalog.set_config({}, {}, true)", quote_literal(name), quote_literal(value)))
            .collect();
        let statements = Statements {
            begin: format!("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT {}", settings.join(", ")),
            endpoints_version: outbox.qualify(ENDPOINTS_VERSION),
            sequence: outbox.qualify(SEQUENCE),
            claim_batch: outbox.qualify(CLAIM_BATCH),
            mark_sent: outbox.qualify(MARK_SENT),
            record_failures: outbox.qualify(RECORD_FAILURES),
            disable_failing_endpoints: outbox.qualify(DISABLE_FAILING_ENDPOINTS),
            load_endpoints: outbox.qualify(LOAD_ENDPOINTS),
            note_unusable_endpoints: outbox.qualify(NOTE_UNUSABLE_ENDPOINTS),
            delete_expired: outbox.qualify(DELETE_EXPIRED),
            delete_emptied_events: outbox.qualify(DELETE_EMPTIED_EVENTS),
            uncount_abandoned: outbox.qualify(UNCOUNT_ABANDONED),
            log_lease: outbox.qualify(LOG_LEASE),
            log_make_slot: outbox.qualify(LOG_MAKE_SLOT),
            log_recover: outbox.qualify(LOG_RECOVER),
            log_read: outbox.qualify(LOG_READ),
            log_read_start: outbox.qualify(LOG_READ_START),
            log_route: outbox.qualify(LOG_ROUTE),
            log_defer: outbox.qualify(LOG_DEFER),
            log_confirm: outbox.qualify(LOG_CONFIRM),
            log_confirm_streamed: outbox.qualify(LOG_CONFIRM_STREAMED),
            log_maintain: outbox.qualify(LOG_MAINTAIN),
            // One relay at a time deletes what expired; the others go on delivering.
            retention_lock: format!(
                "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('outbox retention ' OPERATOR(pg_catalog.||) {}))",
                quote_literal(&outbox.schema)
            ),
        };
        ClientQueue {
            url: url.to_string(),
            client: Some(client),
            outbox,
            sql_schema: sql_schema.to_string(),
            statements,
            presence,
            metrics,
            log_stream: StreamedLog::new(url, log_streamed),
            server: None,
        }
    }

    /// The queue of a relay that started under `server`, what the server said of it.
    pub fn obeying(mut self, server: Option<ServerSettings>) -> ClientQueue {
        self.server = server;
        self
    }

    /// Runs `body` in a transaction with the relay's settings and commits it. On an error the
    /// transaction is rolled back (or the connection dropped, if it is lost) and the error says
    /// whether the outbox is still the one these statements are for.
    fn transaction<T>(&mut self, body: impl FnOnce(&mut Client, &Statements) -> Result<T, postgres::Error>) -> Result<T, QueueError> {
        self.transaction_refreshing(true, body)
    }

    /// A transaction at READ COMMITTED whatever the server's default; `refresh` says whether it
    /// also refreshes the relay's row when due, which writes first.
    fn transaction_refreshing<T>(
        &mut self,
        refresh: bool,
        body: impl FnOnce(&mut Client, &Statements) -> Result<T, postgres::Error>,
    ) -> Result<T, QueueError> {
        self.connect()?;
        let client = self.client.as_mut().expect("connected above");
        let presence = &mut self.presence;
        let result = client.batch_execute(&self.statements.begin).and_then(|()| {
            if refresh {
                presence.refresh_if_due(client)?;
            }
            let value = body(client, &self.statements)?;
            client.batch_execute("COMMIT")?;
            Ok(value)
        });
        match result {
            Ok(value) => {
                if refresh {
                    self.presence.committed();
                }
                self.metrics.database_up.store(true, Ordering::Relaxed);
                Ok(value)
            }
            Err(e) => {
                if refresh {
                    self.presence.unwritten();
                }
                Err(self.failure(e))
            }
        }
    }

    /// Reads the slot itself (outbox_log_read), not consuming what it reads.
    fn log_read_slot(&mut self, fence: i64, max_changes: i32) -> Result<Option<LogRows>, QueueError> {
        let statement = self.statements.log_read.clone();
        let rows = self.autocommit(&statement, &[(&fence, Type::INT8), (&max_changes, Type::INT4)])?;
        // The last row, with no message, says where the read began; none: not the reader.
        Ok(rows.last().map(|last| LogRows {
            messages: rows.iter().filter_map(|row| row.get(0)).collect(),
            oldest: last.get(1),
            began_at: last.get(2),
            flushed_at: last.get(3),
            endpoints_version: last.get(4),
            log_relation: last.get::<_, i64>(5) as u32,
        }))
    }

    /// Runs `statement` with `arguments` on its own, in autocommit: log mode's statements that
    /// make or read a replication slot, which no transaction that wrote may do.
    fn autocommit(&mut self, statement: &str, arguments: &[(&(dyn ToSql + Sync), Type)]) -> Result<Vec<postgres::Row>, QueueError> {
        self.connect()?;
        let client = self.client.as_mut().expect("connected above");
        match client.query_typed(statement, arguments) {
            Ok(rows) => {
                self.metrics.database_up.store(true, Ordering::Relaxed);
                Ok(rows)
            }
            Err(e) => Err(self.failure(e)),
        }
    }

    fn connect(&mut self) -> Result<(), QueueError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            match connect(&self.url, "outbox relay") {
                Ok(client) => self.client = Some(client),
                Err(e) => {
                    self.client = None;
                    self.metrics.database_up.store(false, Ordering::Relaxed);
                    return Err(QueueError::Failed(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// What a failed statement means to the loop: `Gone` if the outbox was dropped or changed
    /// since (looked up again on the same connection), `Failed` otherwise.
    fn failure(&mut self, error: postgres::Error) -> QueueError {
        let message = error_text(&error);
        let Some(client) = self.client.as_mut().filter(|client| !client.is_closed()) else {
            self.client = None;
            self.metrics.database_up.store(false, Ordering::Relaxed);
            return QueueError::Failed(message);
        };
        if client.batch_execute("ROLLBACK").is_err() {
            self.client = None;
            return QueueError::Failed(message);
        }
        match find_outbox(client, &self.sql_schema) {
            Ok(Some(outbox)) if outbox == self.outbox => QueueError::Failed(message),
            Ok(_) => QueueError::Gone,
            Err(_) => QueueError::Failed(message),
        }
    }
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn endpoints_version(client: &mut Client, statements: &Statements) -> Result<i64, postgres::Error> {
    Ok(client.query_typed_one(&statements.endpoints_version, &[])?.get(0))
}

impl Queue for ClientQueue {
    fn load_endpoints(&mut self, disable_after: Option<Duration>) -> Result<EndpointsRead, QueueError> {
        // At every poll: outbox.relay turned off, or allowed_destinations changed, ends the
        // loop; crate::relay waits while it is off, and starts again under the new settings.
        let outbox = self.outbox.clone();
        let (server, read) = self.transaction(|client, statements| {
            let server = server_settings::read(client, &outbox)?;
            // Read first: a change after this makes the next claim see a newer version.
            let version = endpoints_version(client, statements)?;
            let mut disabled = Vec::new();
            if let Some(after) = disable_after {
                for row in client.query_typed(&statements.disable_failing_endpoints, &[(&millis(after), Type::FLOAT8)])? {
                    disabled
                        .push((row.get::<_, Option<String>>(0).unwrap_or_default(), row.get::<_, Option<String>>(1).unwrap_or_default()));
                }
            }
            let mut endpoints = Vec::new();
            for row in client.query_typed(&statements.load_endpoints, &[])? {
                let names: Vec<String> = row.get::<_, Option<_>>(2).unwrap_or_default();
                let values: Vec<String> = row.get::<_, Option<_>>(3).unwrap_or_default();
                endpoints.push(EndpointRow {
                    name: row.get(0),
                    url: row.get(1),
                    headers: names.into_iter().zip(values).collect(),
                    timeout: row.get::<_, Option<f64>>(4).map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1000.0)),
                    max_attempts: row.get::<_, Option<i32>>(5).unwrap_or(defaults::MAX_ATTEMPTS),
                    max_in_flight: row.get(6),
                    secrets: row.get::<_, Option<_>>(7).unwrap_or_default(),
                    ordered: row.get::<_, Option<bool>>(8).unwrap_or(false),
                });
            }
            Ok((server, EndpointsRead { disabled, endpoints, version }))
        })?;
        if server != self.server {
            match server.as_ref().and_then(ServerSettings::refusal) {
                Some(refusal) => say(Level::Log, &refusal),
                None => {
                    say(Level::Log, "the server's outbox.allowed_destinations or outbox.webhook_url changed: starting again under them")
                }
            }
            return Err(QueueError::Gone);
        }
        Ok(read)
    }

    fn claim_batch(&mut self, claim: &ClaimArguments, version: i64) -> Result<Option<Vec<ClaimedRow>>, QueueError> {
        let claimer = self.presence.id;
        self.transaction(|client, statements| {
            if endpoints_version(client, statements)? != version {
                return Ok(None);
            }
            if !claim.ordered.is_empty() {
                client.query_typed(&statements.sequence, &[(&claim.ordered, Type::TEXT_ARRAY)])?;
            }
            let arguments: [(&(dyn ToSql + Sync), Type); 6] = [
                (&claim.endpoints, Type::TEXT_ARRAY),
                (&claim.limits, Type::INT8_ARRAY),
                (&claim.leases, Type::FLOAT8_ARRAY),
                (&claim.caps, Type::INT4_ARRAY),
                (&claim.bytes, Type::INT8),
                (&claimer, Type::INT4),
            ];
            let rows = client.query_typed(&statements.claim_batch, &arguments)?;
            Ok(Some(
                rows.iter()
                    .map(|row| ClaimedRow {
                        endpoint: row.get(0),
                        event_id: row.get::<_, Option<i64>>(1).unwrap_or_default(),
                        attempts: row.get::<_, Option<i32>>(2).unwrap_or_default(),
                        body: row.get(3),
                        last_error: row.get(4),
                        fence: row.get::<_, Option<i32>>(5).unwrap_or_default(),
                    })
                    .collect(),
            ))
        })
    }

    fn mark_sent(&mut self, acks: &AttemptColumns) -> Result<i64, QueueError> {
        let deliveries = self.outbox.deliveries;
        self.transaction(|client, statements| {
            let arguments: [(&(dyn ToSql + Sync), Type); 4] = [
                (&acks.endpoints, Type::TEXT_ARRAY),
                (&acks.ids, Type::INT8_ARRAY),
                (&acks.fences, Type::INT4_ARRAY),
                (&deliveries, Type::OID),
            ];
            let rows = client.query_typed(&statements.mark_sent, &arguments)?;
            Ok(rows.iter().map(|row| i64::from(row.get::<_, Option<i32>>(1).unwrap_or(0))).sum())
        })
    }

    fn record_failures(&mut self, failures: &FailureColumns) -> Result<Vec<DeadDelivery>, QueueError> {
        let deliveries = self.outbox.deliveries;
        self.transaction(|client, statements| {
            let attempts = &failures.attempts;
            let arguments: [(&(dyn ToSql + Sync), Type); 10] = [
                (&attempts.endpoints, Type::TEXT_ARRAY),
                (&attempts.ids, Type::INT8_ARRAY),
                (&attempts.fences, Type::INT4_ARRAY),
                (&failures.errors, Type::TEXT_ARRAY),
                (&failures.retry_ms, Type::FLOAT8_ARRAY),
                (&failures.caps, Type::INT4_ARRAY),
                (&deliveries, Type::OID),
                (&failures.statuses, Type::INT4_ARRAY),
                (&failures.took_ms, Type::FLOAT8_ARRAY),
                (&failures.responses, Type::TEXT_ARRAY),
            ];
            let rows = client.query_typed(&statements.record_failures, &arguments)?;
            Ok(rows
                .iter()
                .filter(|row| row.get::<_, Option<bool>>(3).unwrap_or(false))
                .map(|row| DeadDelivery {
                    endpoint: row.get::<_, Option<String>>(0).unwrap_or_default(),
                    event_id: row.get::<_, Option<i64>>(1).unwrap_or_default(),
                    attempts: row.get::<_, Option<i32>>(2).unwrap_or_default(),
                    last_error: row.get::<_, Option<String>>(4).unwrap_or_default(),
                })
                .collect())
        })
    }

    fn uncount_abandoned(&mut self, abandoned: &AttemptColumns) -> Result<(), QueueError> {
        let (deliveries, claimer) = (self.outbox.deliveries, self.presence.id);
        self.transaction(|client, statements| {
            // A stopping relay must exit within seconds: if a row is locked, the attempt counts.
            client.batch_execute("SET LOCAL lock_timeout = '500ms'")?;
            let arguments: [(&(dyn ToSql + Sync), Type); 5] = [
                (&abandoned.endpoints, Type::TEXT_ARRAY),
                (&abandoned.ids, Type::INT8_ARRAY),
                (&abandoned.fences, Type::INT4_ARRAY),
                (&deliveries, Type::OID),
                (&claimer, Type::INT4),
            ];
            client.query_typed(&statements.uncount_abandoned, &arguments)?;
            Ok(())
        })
    }

    fn note_unusable_endpoints(&mut self, names: &[String], reasons: &[String]) -> Result<(), QueueError> {
        self.transaction(|client, statements| {
            client.query_typed(&statements.note_unusable_endpoints, &[(&names, Type::TEXT_ARRAY), (&reasons, Type::TEXT_ARRAY)])?;
            Ok(())
        })
    }

    fn delete_expired(&mut self, retention: Option<Duration>, dead_retention: Option<Duration>, limit: usize) -> Result<usize, QueueError> {
        self.transaction(|client, statements| {
            if !client.query_typed_one(&statements.retention_lock, &[])?.get::<_, bool>(0) {
                return Ok(0);
            }
            let arguments: [(&(dyn ToSql + Sync), Type); 3] =
                [(&retention.map(millis), Type::FLOAT8), (&(limit as i64), Type::INT8), (&dead_retention.map(millis), Type::FLOAT8)];
            let row = client.query_typed_one(&statements.delete_expired, &arguments)?;
            let (deleted, events): (Option<i64>, Option<Vec<i64>>) = (row.get(0), row.get(1));
            let events = events.unwrap_or_default();
            if !events.is_empty() {
                client.query_typed(&statements.delete_emptied_events, &[(&events, Type::INT8_ARRAY)])?;
            }
            Ok(deleted.unwrap_or(0) as usize)
        })
    }

    /// A stream under a lease no longer held ends here: it holds the slot, which the relay
    /// that took the lease could neither stream nor read meanwhile.
    fn log_lease(&mut self, fence: i64, lease: Duration) -> Result<Option<LogLease>, QueueError> {
        let leased = self.transaction(|client, statements| {
            let rows = client.query_typed(&statements.log_lease, &[(&fence, Type::INT8), (&millis(lease), Type::FLOAT8)])?;
            Ok(rows.first().map(|row| LogLease { fence: row.get(0), slot_ready: row.get::<_, String>(1) == "ready" }))
        })?;
        if !leased.as_ref().is_some_and(|leased| self.log_stream.streams(leased.fence)) {
            self.log_stream.stop();
        }
        Ok(leased)
    }

    /// First in its transaction (a slot cannot be made in one that wrote), which is at READ
    /// COMMITTED (outbox_log_make_slot refuses any other).
    fn log_make_slot(&mut self, fence: i64) -> Result<bool, QueueError> {
        self.log_stream.stop();
        self.transaction_refreshing(false, |client, statements| {
            Ok(client.query_typed_one(&statements.log_make_slot, &[(&fence, Type::INT8)])?.get(0))
        })
    }

    fn log_recover(&mut self, fence: i64) -> Result<i64, QueueError> {
        self.transaction(|client, statements| Ok(client.query_typed_one(&statements.log_recover, &[(&fence, Type::INT8)])?.get(0)))
    }

    /// From the slot's stream while log mode is on and the stream can be had (crate::log_stream);
    /// else from the slot itself.
    fn log_read(&mut self, fence: i64, max_changes: i32, after: u64) -> Result<Option<LogRows>, QueueError> {
        if !self.log_stream.may_stream(fence) {
            return self.log_read_slot(fence, max_changes);
        }
        self.log_stream.receive();
        let statement = self.statements.log_read_start.clone();
        let rows = self.autocommit(&statement, &[(&fence, Type::INT8)])?;
        let Some(start) = rows.first() else {
            self.log_stream.stop();
            return Ok(None);
        };
        if !start.get::<_, bool>(0) {
            // Back in table mode: read from the slot, whose confirmation drops it once the log
            // is delivered; not before the reads on their way are confirmed through the stream,
            // since the slot would hand them out again.
            if after != 0 {
                let (oldest, began_at, endpoints_version, log_relation) =
                    (start.get(4), start.get(5), start.get(6), start.get::<_, i64>(8) as u32);
                return Ok(Some(LogRows { messages: Vec::new(), oldest, began_at, flushed_at: 0, endpoints_version, log_relation }));
            }
            self.log_stream.stop();
            return self.log_read_slot(fence, max_changes);
        }
        let slot = SlotToStream {
            name: start.get(1),
            publication: start.get(2),
            from: start.get::<_, Option<i64>>(3).unwrap_or(0) as u64,
            timezone: start.get(7),
        };
        let (oldest, began_at, endpoints_version, log_relation) = (start.get(4), start.get(5), start.get(6), start.get::<_, i64>(8) as u32);
        match self.log_stream.read(fence, &slot, max_changes as usize, after, |text| say(Level::Warning, text)) {
            None => self.log_read_slot(fence, max_changes),
            Some(Err(reason)) => Err(QueueError::Failed(reason)),
            Some(Ok(read)) => {
                let flushed_at = read.idle_at.unwrap_or(0) as i64;
                Ok(Some(LogRows { messages: read.messages, oldest, began_at, flushed_at, endpoints_version, log_relation }))
            }
        }
    }

    fn log_route(&mut self, topics: &[String]) -> Result<Vec<TopicRoute>, QueueError> {
        let statement = self.statements.log_route.clone();
        let rows = self.autocommit(&statement, &[(&topics, Type::TEXT_ARRAY)])?;
        Ok(rows
            .iter()
            .map(|row| TopicRoute { topic: row.get(0), endpoint: row.get(1), sendable: row.get(2), ordered: row.get(3) })
            .collect())
    }

    fn log_defer(&mut self, deferrals: &Deferrals) -> Result<i64, QueueError> {
        self.transaction(|client, statements| {
            let arguments: [(&(dyn ToSql + Sync), Type); 9] = [
                (&deferrals.ids, Type::INT8_ARRAY),
                (&deferrals.topics, Type::TEXT_ARRAY),
                (&deferrals.payloads, Type::TEXT_ARRAY),
                (&deferrals.keys, Type::TEXT_ARRAY),
                (&deferrals.created, Type::TEXT_ARRAY),
                (&deferrals.endpoints, Type::TEXT_ARRAY),
                (&deferrals.attempts, Type::INT4_ARRAY),
                (&deferrals.errors, Type::TEXT_ARRAY),
                (&deferrals.due_in_ms, Type::FLOAT8_ARRAY),
            ];
            Ok(client.query_typed_one(&statements.log_defer, &arguments)?.get(0))
        })
    }

    fn log_reads_ahead(&self, fence: i64) -> bool {
        self.log_stream.streams(fence)
    }

    fn log_confirm(&mut self, fence: i64, end: u64, oldest: i64) -> Result<bool, QueueError> {
        let streamed = self.log_stream.streams(fence);
        let position = end as i64;
        let confirmed = self.transaction(|client, statements| {
            let statement = if streamed { &statements.log_confirm_streamed } else { &statements.log_confirm };
            let arguments: [(&(dyn ToSql + Sync), Type); 3] = [(&fence, Type::INT8), (&position, Type::INT8), (&oldest, Type::INT8)];
            Ok(client.query_typed_one(statement, &arguments)?.get(0))
        })?;
        match confirmed {
            true if streamed => self.log_stream.confirmed(end),
            // Another relay holds the lease: this one's stream must not hold the slot.
            false => self.log_stream.stop(),
            true => {}
        }
        Ok(confirmed)
    }

    fn log_maintain(&mut self) -> Result<i32, QueueError> {
        self.transaction(|client, statements| Ok(client.query_typed_one(&statements.log_maintain, &[])?.get(0)))
    }
}
