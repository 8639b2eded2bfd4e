-- One event ($1): its payload, and for each endpoint its delivery, with where it stands in its
-- key on an ordered endpoint (0: the key's head, the one that may go now) and the history of
-- its failed attempts, newest first.
SELECT pg_catalog.json_build_object(
           'id', o.id, 'topic', o.topic, 'key', o.key, 'created_at', o.created_at, 'payload', o.payload,
           'deliveries', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                     'endpoint', d.endpoint, 'attempts', d.attempts, 'attempt', d.fence,
                                     'available_at', d.available_at, 'sent_at', d.sent_at, 'dead_at', d.dead_at,
                                     'last_error', d.last_error, 'key', d.key,
                                     'leased', d.claimed_by IS NOT NULL AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.now(),
                                     'position', CASE WHEN d.key IS NULL OR d.sent_at IS NOT NULL THEN NULL
                                                      WHEN NOT d.waiting THEN 0
                                                      ELSE 1 OPERATOR(pg_catalog.+) (
                                                          SELECT pg_catalog.count(*) FROM @extschema@.outbox_deliveries AS w
                                                           WHERE w.waiting AND w.endpoint OPERATOR(pg_catalog.=) d.endpoint
                                                             AND w.key OPERATOR(pg_catalog.=) d.key
                                                             AND w.event_id OPERATOR(pg_catalog.<) d.event_id) END,
                                     'failures', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                                          'attempt', a.attempt, 'failed_at', a.failed_at, 'status', a.status,
                                                          'duration_ms', a.duration_ms, 'error', a.error, 'response', a.response)
                                                          ORDER BY a.attempt DESC), '[]')
                                                    FROM @extschema@.outbox_attempts AS a
                                                   WHERE a.event_id OPERATOR(pg_catalog.=) d.event_id
                                                     AND a.endpoint OPERATOR(pg_catalog.=) d.endpoint))
                                     ORDER BY d.endpoint), '[]')
                            FROM @extschema@.outbox_deliveries AS d
                           WHERE d.event_id OPERATOR(pg_catalog.=) o.id))::text
  FROM @extschema@.outbox AS o
 WHERE o.id OPERATOR(pg_catalog.=) $1
