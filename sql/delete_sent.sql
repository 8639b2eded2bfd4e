-- Retention: delete up to $2 events that were sent more than $1 milliseconds (float8) ago,
-- oldest first, skipping rows another session holds. Small batches keep each transaction and
-- its locks short. Dead and pending rows are never touched.
DELETE FROM @extschema@.outbox
 WHERE id IN (SELECT id
                FROM @extschema@.outbox
               WHERE sent_at < now() - $1 * interval '1 millisecond'
               ORDER BY id
               LIMIT $2
                 FOR UPDATE SKIP LOCKED)
