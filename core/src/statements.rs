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
