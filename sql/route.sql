-- outbox_enqueue's second statement: one delivery of event $1 per endpoint whose topics share
-- one with the patterns of its topic $2 (outbox_topic_patterns, computed once). $3 is the key,
-- $4 deliver_at (null or past: now, so that a past time cannot jump the queue). Returns one
-- row per delivery; none, and sql/note_unrouted.sql runs.
-- On an ordered endpoint an event with a key waits for its turn (sql/ordering.sql): such a
-- delivery comes back with waiting, and sql/note_key_arrivals.sql tells the sequencer. notify
-- says whether the endpoint asked to be notified (sql/notify_endpoints.sql); read in this
-- statement, so that it is about the endpoints this event was routed to.
-- It runs under the caller's search_path, so every object, function and operator is named by
-- its schema.
INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, available_at, key, waiting)
SELECT $1, e.name, greatest($4, pg_catalog.now()), CASE WHEN e.ordered THEN $3 END, e.ordered AND $3 IS NOT NULL
  FROM @extschema@.outbox_endpoints AS e
 WHERE e.topics OPERATOR(pg_catalog.&&) (SELECT @extschema@.outbox_topic_patterns($2))
RETURNING d.endpoint,
          d.waiting,
          (SELECT n.notify FROM @extschema@.outbox_endpoints AS n WHERE n.name OPERATOR(pg_catalog.=) d.endpoint)
