-- Record failed attempts ($1 endpoints, $2 event ids, $3 the fencing token of each attempt's
-- claim, $4 what went wrong, $5 when to try again in milliseconds (at most an hour), $6 the
-- endpoint's attempt cap): last_error and the retry time, or dead_at at the cap; claimed_by is
-- cleared, as no request is in flight for the delivery any more. Matching on the fence skips
-- deliveries claimed again since this attempt started, also after a requeue or replay gave
-- them a fresh budget of attempts: the newer claim owns them.
-- Each endpoint's health notes the failure (failing_since keeps the first one since the last
-- success). $7 is the outbox_deliveries table the deliveries were claimed from, as in
-- mark_sent.sql.
-- The history of each recorded failure goes to outbox_attempts ($8 the HTTP status or null,
-- $9 how long the attempt took in milliseconds, $10 the start of the response or null), where
-- the oldest claims beyond outbox_attempts_kept() are deleted.
WITH failed AS (
    UPDATE @extschema@.outbox_deliveries AS d
       SET last_error   = f.error,
           available_at = now() + f.retry_ms * interval '1 millisecond',
           claimed_by   = NULL,
           dead_at      = CASE WHEN d.attempts >= f.max_attempts THEN now() END
      FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::text[], $5::float8[], $6::integer[])
           AS f (endpoint, event_id, fence, error, retry_ms, max_attempts)
     WHERE d.event_id = ANY ($2)
       AND d.event_id = f.event_id
       AND d.endpoint = f.endpoint
       AND d.fence = f.fence
       AND d.sent_at IS NULL
       AND d.dead_at IS NULL
       AND EXISTS (SELECT FROM pg_catalog.pg_class WHERE oid = $7)
    RETURNING d.endpoint, d.event_id, d.attempts, d.dead_at IS NOT NULL AS dead, d.last_error
), health AS (
    UPDATE @extschema@.outbox_endpoints AS e
       SET failing_since = coalesce(e.failing_since, now()),
           last_error    = l.error
      FROM (SELECT DISTINCT ON (f.endpoint) f.endpoint, f.error
              FROM unnest($1::text[], $4::text[]) AS f (endpoint, error)
             ORDER BY f.endpoint) AS l
     WHERE e.name = l.endpoint
       AND e.name IN (SELECT h.name
                        FROM @extschema@.outbox_endpoints AS h
                       WHERE h.name = ANY ($1)
                         AND EXISTS (SELECT FROM pg_catalog.pg_class WHERE oid = $7)
                         FOR NO KEY UPDATE SKIP LOCKED)
), history AS (
    INSERT INTO @extschema@.outbox_attempts AS a (event_id, endpoint, attempt, status, duration_ms, error, response)
    SELECT f.event_id, f.endpoint, f.fence, f.status, f.duration_ms, x.last_error, f.response
      FROM unnest($1::text[], $2::bigint[], $3::integer[], $8::integer[], $9::float8[], $10::text[])
           AS f (endpoint, event_id, fence, status, duration_ms, response)
      JOIN failed AS x ON x.endpoint = f.endpoint AND x.event_id = f.event_id
    ON CONFLICT DO NOTHING
), forgotten AS (
    DELETE FROM @extschema@.outbox_attempts AS a
     USING failed AS x, unnest($1::text[], $2::bigint[], $3::integer[]) AS f (endpoint, event_id, fence)
     WHERE x.endpoint = f.endpoint AND x.event_id = f.event_id
       AND a.event_id = f.event_id AND a.endpoint = f.endpoint
       AND a.attempt <= f.fence - @extschema@.outbox_attempts_kept()
)
SELECT endpoint, event_id, attempts, dead, last_error
  FROM failed
