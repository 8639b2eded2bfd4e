-- Record failed attempts: what went wrong, when to try again ($4: milliseconds, at most an
-- hour), and whether the row is now dead ($5: outbox.max_attempts). Matching on attempts skips
-- rows that were claimed again since this attempt started: the newer claim owns them. $6 is
-- the extension the rows were claimed from, as in mark_sent.sql.
UPDATE @extschema@.outbox AS o
   SET last_error   = f.error,
       available_at = now() + f.retry_ms * interval '1 millisecond',
       dead_at      = CASE WHEN o.attempts >= $5 THEN now() END
  FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::float8[]) AS f (id, attempts, error, retry_ms)
 WHERE o.id = f.id
   AND o.attempts = f.attempts
   AND o.sent_at IS NULL
   AND o.dead_at IS NULL
   AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $6)
RETURNING o.id, o.topic, o.attempts, o.dead_at IS NOT NULL, o.last_error
