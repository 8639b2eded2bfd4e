-- Retention, first statement: up to $2 deliveries sent more than $1 milliseconds (float8) ago,
-- oldest first (by the outbox_deliveries_sent index), up to $2 deliveries dead for more than $3
-- milliseconds (by outbox_deliveries_dead), and up to $2 unrouted events older than $1 (by
-- outbox_unrouted_created_at) are deleted, with their events' rows locked for
-- sql/delete_emptied_events.sql, which deletes the events left with no delivery. A null $1 or
-- $3 keeps those forever. An event with a pending delivery stays, and so does the dead head of
-- an ordered key. Rows another session holds are skipped, and so are those
-- whose event it holds: outbox_replay locks an event (FOR KEY SHARE) while it writes a
-- delivery for it, which this snapshot may not show yet. Each row and its event are locked
-- together, so the limit counts only rows this pass deletes. Small batches keep each
-- transaction and its locks short. Rows are deleted by their physical addresses (TID scans),
-- as in claim_batch.sql. Returns the most rows of one kind that went (reaching $2 means more),
-- and the locked events.
WITH due AS (
    SELECT s.ctid AS row_id, o.id AS event_id
      FROM @extschema@.outbox_deliveries AS s
      JOIN @extschema@.outbox AS o ON o.id = s.event_id
     WHERE s.sent_at < now() - $1 * interval '1 millisecond'
     ORDER BY s.sent_at
     LIMIT $2
       FOR UPDATE OF s, o SKIP LOCKED
), due_dead AS (
    SELECT s.ctid AS row_id, o.id AS event_id
      FROM @extschema@.outbox_deliveries AS s
      JOIN @extschema@.outbox AS o ON o.id = s.event_id
     WHERE s.dead_at < now() - $3 * interval '1 millisecond'
       -- The dead head of an ordered key stays: the deliveries behind it wait for it to be
       -- requeued or skipped, which needs it.
       AND NOT EXISTS (SELECT FROM @extschema@.outbox_keys AS k
                        WHERE k.endpoint = s.endpoint AND k.key = s.key AND k.head = s.event_id)
     ORDER BY s.dead_at
     LIMIT $2
       FOR UPDATE OF s, o SKIP LOCKED
), due_unrouted AS (
    SELECT x.ctid AS row_id, o.id AS event_id
      FROM @extschema@.outbox_unrouted AS x
      JOIN @extschema@.outbox AS o ON o.id = x.event_id
     WHERE x.created_at < now() - $1 * interval '1 millisecond'
     ORDER BY x.created_at
     LIMIT $2
       FOR UPDATE OF x, o SKIP LOCKED
), sent AS (
    DELETE FROM @extschema@.outbox_deliveries AS d
     WHERE d.ctid = ANY (ARRAY(SELECT due.row_id FROM due))
    RETURNING d.event_id
), dead AS (
    DELETE FROM @extschema@.outbox_deliveries AS d
     WHERE d.ctid = ANY (ARRAY(SELECT due_dead.row_id FROM due_dead))
    RETURNING d.event_id
), unrouted AS (
    DELETE FROM @extschema@.outbox_unrouted AS u
     WHERE u.ctid = ANY (ARRAY(SELECT due_unrouted.row_id FROM due_unrouted))
    RETURNING u.event_id
)
SELECT greatest((SELECT count(*) FROM sent), (SELECT count(*) FROM dead), (SELECT count(*) FROM unrouted)),
       ARRAY(SELECT due.event_id FROM due UNION SELECT due_dead.event_id FROM due_dead UNION SELECT due_unrouted.event_id FROM due_unrouted)
