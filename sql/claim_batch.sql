-- Claim up to $1 due events for this worker, in one autocommit statement.
-- The inner SELECT walks the outbox_pending index in claim order and skips rows another
-- claimer has locked; the UPDATE pushes available_at forward by the lease ($2 milliseconds,
-- float8), so if this worker dies the rows become claimable again by themselves.
-- The body is the delivery envelope: {"type", "timestamp", "data"}.
--
-- Like every statement the workers run, this one runs with search_path = pg_catalog, pg_temp
-- and names the extension's tables by their schema: with exact argument types, each operator
-- and function resolves to pg_catalog, whatever anyone created elsewhere.
UPDATE @extschema@.outbox
   SET attempts     = attempts + 1,
       available_at = now() + $2 * interval '1 millisecond',
       claimed_by   = pg_backend_pid()
 WHERE id IN (SELECT id
                FROM @extschema@.outbox
               WHERE sent_at IS NULL
                 AND dead_at IS NULL
                 AND available_at <= now()
               ORDER BY available_at, id
               LIMIT $1
                 FOR UPDATE SKIP LOCKED)
RETURNING id,
          attempts,
          json_build_object('type', topic, 'timestamp', created_at, 'data', payload)::text
