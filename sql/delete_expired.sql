-- Retention: delete up to $2 deliveries sent more than $1 milliseconds (float8) ago, oldest
-- first (by the outbox_deliveries_sent index), and up to $2 unrouted events that old (by
-- outbox_unrouted_created_at); then
-- the events among them that have no delivery left. An event with a dead or pending delivery
-- stays. Rows another session holds are skipped; small batches keep each transaction and its
-- locks short. Rows are deleted by their physical addresses (TID scans), as in claim_batch.sql. Returns how many deliveries and unrouted events went (a full batch means more).
WITH sent AS (
    DELETE FROM @extschema@.outbox_deliveries AS d
     WHERE d.ctid = ANY (ARRAY(
            SELECT s.ctid
              FROM @extschema@.outbox_deliveries AS s
             WHERE s.sent_at < now() - $1 * interval '1 millisecond'
             ORDER BY s.sent_at
             LIMIT $2
               FOR UPDATE SKIP LOCKED))
    RETURNING d.event_id, d.endpoint
), unrouted AS (
    DELETE FROM @extschema@.outbox_unrouted AS u
     WHERE u.ctid = ANY (ARRAY(
            SELECT x.ctid
              FROM @extschema@.outbox_unrouted AS x
             WHERE x.created_at < now() - $1 * interval '1 millisecond'
             ORDER BY x.created_at
             LIMIT $2
               FOR UPDATE SKIP LOCKED))
    RETURNING u.event_id
), events AS (
    -- This statement still sees the deliveries deleted above: an event goes when every
    -- delivery it has is among them (counted through the primary key), or when it is an
    -- expired unrouted one that has none.
    DELETE FROM @extschema@.outbox AS o
     WHERE o.id IN (SELECT sent.event_id
                      FROM sent
                     GROUP BY sent.event_id
                    HAVING count(*) = (SELECT count(*)
                                         FROM @extschema@.outbox_deliveries AS d
                                        WHERE d.event_id = sent.event_id)
                    UNION ALL
                    SELECT unrouted.event_id
                      FROM unrouted
                     WHERE NOT EXISTS (SELECT FROM @extschema@.outbox_deliveries AS d
                                        WHERE d.event_id = unrouted.event_id))
)
SELECT (SELECT count(*) FROM sent) + (SELECT count(*) FROM unrouted)
