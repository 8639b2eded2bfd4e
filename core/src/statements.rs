//! The relay's statements, as the files in `sql/` hold them: each names the outbox's tables
//! and functions by `@extschema@`, which a driver replaces by the schema the outbox is
//! installed in. Both drivers run these same texts.

/// Claims due deliveries over several endpoints (sql/claim_batch.sql).
pub const CLAIM_BATCH: &str = include_str!("../../sql/claim_batch.sql");
/// Records acknowledged deliveries (sql/mark_sent.sql).
pub const MARK_SENT: &str = include_str!("../../sql/mark_sent.sql");
/// Records failed attempts: a retry after backoff, or dead (sql/record_failures.sql).
pub const RECORD_FAILURES: &str = include_str!("../../sql/record_failures.sql");
/// Disables the endpoints failing for too long (sql/disable_failing_endpoints.sql).
pub const DISABLE_FAILING_ENDPOINTS: &str = include_str!("../../sql/disable_failing_endpoints.sql");
/// Reads the enabled webhook endpoints with their secrets (sql/load_endpoints.sql).
pub const LOAD_ENDPOINTS: &str = include_str!("../../sql/load_endpoints.sql");
/// Records why endpoints cannot be sent to (sql/note_unusable_endpoints.sql).
pub const NOTE_UNUSABLE_ENDPOINTS: &str = include_str!("../../sql/note_unusable_endpoints.sql");
/// Retention: sent and dead deliveries past their time (sql/delete_expired.sql).
pub const DELETE_EXPIRED: &str = include_str!("../../sql/delete_expired.sql");
/// Retention: events left with no delivery (sql/delete_emptied_events.sql).
pub const DELETE_EMPTIED_EVENTS: &str = include_str!("../../sql/delete_emptied_events.sql");
/// Takes back the attempts a stopping relay abandons (sql/uncount_abandoned.sql).
pub const UNCOUNT_ABANDONED: &str = include_str!("../../sql/uncount_abandoned.sql");
/// Ordered endpoints: keys without a head get one, so the claim can take it.
pub const SEQUENCE: &str = "SELECT @extschema@.outbox_sequence(name) FROM unnest($1::text[]) AS name";
/// Which version of the endpoints is current: 0 until an endpoint first changes, and after a
/// restore (which leaves the row out).
pub const ENDPOINTS_VERSION: &str = "SELECT coalesce((SELECT version FROM @extschema@.outbox_endpoints_version), 0)";

/// Log mode (sql/log.sql): the reader's lease, with the slot's state.
pub const LOG_LEASE: &str = "SELECT reader_fence, slot_state FROM @extschema@.outbox_log_lease($1, $2)";
/// Log mode: makes a missing or lost slot again.
pub const LOG_MAKE_SLOT: &str = "SELECT @extschema@.outbox_log_make_slot($1)";
/// Log mode: copies what a lost slot may have held into the table path.
pub const LOG_RECOVER: &str = "SELECT @extschema@.outbox_log_recover($1)";
/// Log mode: the slot's next changes.
pub const LOG_READ: &str =
    "SELECT data, xmin, began_at, flushed_at, endpoints_version, log_relation FROM @extschema@.outbox_log_read($1, $2)";
/// Log mode: where the topics read go.
pub const LOG_ROUTE: &str = "SELECT topic, endpoint, sendable, ordered FROM @extschema@.outbox_log_route($1)";
/// Log mode: deliveries copied into the table path.
pub const LOG_DEFER: &str = "SELECT @extschema@.outbox_log_defer($1, $2, $3, $4, $5, $6, $7, $8, $9)";
/// Log mode: the slot let go of what was delivered.
pub const LOG_CONFIRM: &str = "SELECT @extschema@.outbox_log_confirm($1, $2, $3)";
/// Log mode, the slot streamed (`outbox relay`): where a read of the stream begins.
pub const LOG_READ_START: &str =
    "SELECT enabled, slot, publication, confirmed, xmin, began_at, endpoints_version, timezone, log_relation FROM @extschema@.outbox_log_read_start($1)";
/// Log mode, the slot streamed: what was delivered recorded; the stream confirms the position.
pub const LOG_CONFIRM_STREAMED: &str = "SELECT @extschema@.outbox_log_confirm($1, $2, $3, false)";
/// Log mode: the log's partitions made ahead and dropped once read.
pub const LOG_MAINTAIN: &str = "SELECT @extschema@.outbox_log_maintain()";

/// The settings every relay statement runs with, each with why: the worker sets them for its
/// session, the `outbox` process for each transaction (a pooler may hand it another session).
pub const SESSION_SETTINGS: [(&str, &str); 8] = [
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
    // does wait, as the server is configured to (see `mark_sent`). This holds for a worker,
    // which a crash stops too; a driver outside the server leaves this setting out.
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

/// `sql` with `@extschema@` replaced by `schema` (an identifier, quoted if it needs to be), as
/// CREATE EXTENSION does for the install scripts.
pub fn qualify(sql: &str, schema: &str) -> String {
    sql.replace("@extschema@", schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_names_the_schema_by_placeholder_and_qualify_replaces_each_one() {
        for sql in [
            CLAIM_BATCH,
            MARK_SENT,
            RECORD_FAILURES,
            DISABLE_FAILING_ENDPOINTS,
            LOAD_ENDPOINTS,
            NOTE_UNUSABLE_ENDPOINTS,
            DELETE_EXPIRED,
            DELETE_EMPTIED_EVENTS,
            UNCOUNT_ABANDONED,
            SEQUENCE,
            ENDPOINTS_VERSION,
        ] {
            assert!(sql.contains("@extschema@."), "{sql}");
            let qualified = qualify(sql, "\"my outbox\"");
            assert!(!qualified.contains("@extschema@") && qualified.contains("\"my outbox\"."));
        }
    }
}
