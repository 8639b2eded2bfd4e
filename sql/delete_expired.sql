-- Retention, first statement: up to $2 deliveries sent more than $1 milliseconds (float8) ago,
-- oldest first (by the outbox_deliveries_sent index), and up to $2 unrouted events that old
-- (by outbox_unrouted_created_at), are deleted, with their events' rows locked for
-- sql/delete_emptied_events.sql, which deletes the events left with no delivery. An event with
-- a dead or pending delivery stays. Rows another session holds are skipped; small batches keep
-- each transaction and its locks short. Rows are deleted by their physical addresses (TID
-- scans), as in claim_batch.sql.
-- An event that outbox_replay is writing a delivery for holds a lock (FOR KEY SHARE): it is
-- skipped, with its expired rows, until the next pass. Otherwise an event whose deliveries this
-- snapshot does not show yet would be deleted under its new delivery.
-- Returns how many deliveries and unrouted events went (a full batch means more), and the
-- locked events.
WITH due AS (
    SELECT s.ctid AS row_id, s.event_id
      FROM @extschema@.outbox_deliveries AS s
     WHERE s.sent_at < now() - $1 * interval '1 millisecond'
     ORDER BY s.sent_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), due_unrouted AS (
    SELECT x.ctid AS row_id, x.event_id
      FROM @extschema@.outbox_unrouted AS x
     WHERE x.created_at < now() - $1 * interval '1 millisecond'
     ORDER BY x.created_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), events AS (
    SELECT o.id
      FROM @extschema@.outbox AS o
     WHERE o.id = ANY (ARRAY(SELECT due.event_id FROM due UNION SELECT due_unrouted.event_id FROM due_unrouted))
       FOR UPDATE SKIP LOCKED
), sent AS (
    DELETE FROM @extschema@.outbox_deliveries AS d
     WHERE d.ctid = ANY (ARRAY(SELECT due.row_id FROM due JOIN events ON events.id = due.event_id))
    RETURNING d.event_id
), unrouted AS (
    DELETE FROM @extschema@.outbox_unrouted AS u
     WHERE u.ctid = ANY (ARRAY(SELECT due_unrouted.row_id FROM due_unrouted JOIN events ON events.id = due_unrouted.event_id))
    RETURNING u.event_id
)
SELECT (SELECT count(*) FROM sent) + (SELECT count(*) FROM unrouted),
       ARRAY(SELECT events.id FROM events)
