-- An event no endpoint was subscribed to ($1): kept, counted by outbox_stats(), replayable.
-- A statement of its own, run only then, so that an ordinary enqueue does not open this table.
INSERT INTO @extschema@.outbox_unrouted (event_id, created_at)
VALUES ($1, pg_catalog.now())
