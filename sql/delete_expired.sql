-- Retention: delete up to $2 deliveries sent more than $1 milliseconds (float8) ago, oldest
-- first (by the outbox_deliveries_sent index), and up to $2 unrouted events that old (by
-- outbox_unrouted_created_at); then
-- the events among them that have no delivery left. An event with a dead or pending delivery
-- stays. Rows another session holds are skipped; small batches keep each transaction and its
-- locks short. Returns how many deliveries and unrouted events went (a full batch means more).
WITH sent AS (
    DELETE FROM @extschema@.outbox_deliveries AS d
     WHERE (d.event_id, d.endpoint) IN (
            SELECT s.event_id, s.endpoint
              FROM @extschema@.outbox_deliveries AS s
             WHERE s.sent_at < now() - $1 * interval '1 millisecond'
             ORDER BY s.sent_at
             LIMIT $2
               FOR UPDATE SKIP LOCKED)
    RETURNING d.event_id, d.endpoint
), unrouted AS (
    DELETE FROM @extschema@.outbox_unrouted AS u
     WHERE u.event_id IN (
            SELECT x.event_id
              FROM @extschema@.outbox_unrouted AS x
             WHERE x.created_at < now() - $1 * interval '1 millisecond'
             ORDER BY x.created_at
             LIMIT $2
               FOR UPDATE SKIP LOCKED)
    RETURNING u.event_id
), events AS (
    -- This statement still sees the deliveries deleted above: leave those out.
    DELETE FROM @extschema@.outbox AS o
     WHERE o.id IN (SELECT sent.event_id FROM sent UNION SELECT unrouted.event_id FROM unrouted)
       AND NOT EXISTS (SELECT FROM @extschema@.outbox_deliveries AS d
                        WHERE d.event_id = o.id
                          AND NOT EXISTS (SELECT FROM sent
                                           WHERE sent.event_id = d.event_id
                                             AND sent.endpoint = d.endpoint))
)
SELECT (SELECT count(*) FROM sent) + (SELECT count(*) FROM unrouted)
