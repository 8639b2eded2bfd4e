-- Record acknowledged events ($1: ids). sent_at is written here and nowhere else.
-- A row that another claimer already marked keeps its first sent_at.
-- $2 is the extension the ids were claimed from: if it was dropped and created again since,
-- these ids now name other events, and nothing is marked.
UPDATE @extschema@.outbox
   SET sent_at = now(),
       dead_at = NULL
 WHERE id = ANY ($1)
   AND sent_at IS NULL
   AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE oid = $2)
