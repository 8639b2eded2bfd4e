-- outbox_enqueue's statement: the event, one delivery per endpoint whose topics match, or a
-- note that none did. $1 topic, $2 payload, $3 key, $4 deliver_at (null or past: now, so that
-- a past time cannot jump the queue).
-- It runs under the caller's search_path, so every object, function and operator is named by
-- its schema.
WITH event AS (
    INSERT INTO @extschema@.outbox (topic, payload, key)
    VALUES ($1, $2, $3)
    RETURNING id
), routed AS (
    INSERT INTO @extschema@.outbox_deliveries (event_id, endpoint, available_at)
    SELECT event.id, e.name, greatest($4, pg_catalog.now())
      FROM event, @extschema@.outbox_endpoints AS e
     WHERE @extschema@.outbox_topic_matches(e.topics, $1)
    RETURNING 1
), unrouted AS (
    INSERT INTO @extschema@.outbox_unrouted (event_id, created_at)
    SELECT event.id, pg_catalog.now() FROM event WHERE NOT EXISTS (SELECT FROM routed)
)
SELECT id FROM event
