-- outbox_enqueue's statement: the event and one delivery per endpoint whose topics match;
-- returns the event's id and how many deliveries it got (none: sql/note_unrouted.sql runs).
-- A delivery to an ordered endpoint notes its key for the sequencer (sql/ordering.sql).
-- A pull endpoint with notify set is notified on channel "outbox.<name>" at commit (the third
-- column counts the notifications; naming it is what makes that step run).
-- $1 topic, $2 payload, $3 key, $4 deliver_at (null or past: now, so that a past time cannot
-- jump the queue).
-- It runs under the caller's search_path, so every object, function and operator is named by
-- its schema.
WITH event AS (
    INSERT INTO @extschema@.outbox (topic, payload, key)
    VALUES ($1, $2, $3)
    RETURNING id
), patterns AS (
    SELECT @extschema@.outbox_topic_patterns($1) AS topics
), routed AS (
    -- On an ordered endpoint an event with a key waits for its turn (sql/ordering.sql).
    INSERT INTO @extschema@.outbox_deliveries (event_id, endpoint, available_at, key, waiting)
    SELECT event.id, e.name, greatest($4, pg_catalog.now()),
           CASE WHEN e.ordered THEN $3 END, e.ordered AND $3 IS NOT NULL
      FROM event, patterns, @extschema@.outbox_endpoints AS e
     WHERE e.topics OPERATOR(pg_catalog.&&) patterns.topics
    RETURNING endpoint, key, waiting
), arrived AS (
    INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
    SELECT routed.endpoint, routed.key FROM routed WHERE routed.waiting
), notified AS (
    SELECT pg_catalog.pg_notify('outbox.' OPERATOR(pg_catalog.||) e.name, '')
      FROM patterns, @extschema@.outbox_endpoints AS e
     WHERE e.notify
       AND e.topics OPERATOR(pg_catalog.&&) patterns.topics
)
SELECT event.id, (SELECT pg_catalog.count(*) FROM routed), (SELECT pg_catalog.count(*) FROM notified) FROM event
