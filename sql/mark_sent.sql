-- Record acknowledged events ($1: ids). sent_at is written here and nowhere else.
-- A row that another claimer already marked keeps its first sent_at.
UPDATE @extschema@.outbox
   SET sent_at = now(),
       dead_at = NULL
 WHERE id = ANY ($1)
   AND sent_at IS NULL
