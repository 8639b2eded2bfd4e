-- outbox_enqueue's first statement: the event ($1 topic, $2 payload, $3 key); returns its id
-- for sql/route.sql.
-- It runs under the caller's search_path, so every object is named by its schema.
INSERT INTO @extschema@.outbox (topic, payload, key)
VALUES ($1, $2, $3)
RETURNING id
