-- Record acknowledged deliveries ($1 endpoints, $2 event ids, pairwise). sent_at is written
-- here and nowhere else; a delivery that another claimer already marked keeps its first
-- sent_at. The same statement counts them (outbox_stats().sent, in this session's shard) and
-- notes each endpoint's success, at most once a second, skipping an endpoint row that someone
-- else is changing right now rather than waiting for it.
-- $3 is the extension the deliveries were claimed from: if it was dropped and created again
-- since, these ids now name other events, and nothing is marked.
WITH sent AS (
    UPDATE @extschema@.outbox_deliveries AS d
       SET sent_at = now(),
           dead_at = NULL
      FROM unnest($1::text[], $2::bigint[]) AS a (endpoint, event_id)
     WHERE d.event_id = a.event_id
       AND d.endpoint = a.endpoint
       AND d.sent_at IS NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $3)
    RETURNING d.endpoint
), counted AS (
    INSERT INTO @extschema@.outbox_delivery_counts AS n (endpoint, shard, sent)
    SELECT sent.endpoint, pg_backend_pid() % 16, count(*)
      FROM sent
     GROUP BY sent.endpoint
     ORDER BY sent.endpoint
    ON CONFLICT (endpoint, shard) DO UPDATE SET sent = n.sent + excluded.sent
)
UPDATE @extschema@.outbox_endpoints AS e
   SET last_success_at = now(),
       failing_since   = NULL
 WHERE e.name IN (SELECT h.name
                    FROM @extschema@.outbox_endpoints AS h
                   WHERE h.name = ANY ($1)
                     AND (h.failing_since IS NOT NULL
                          OR h.last_success_at IS NULL
                          OR h.last_success_at < now() - interval '1 second')
                     AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $3)
                     FOR NO KEY UPDATE SKIP LOCKED)
