-- The ordered endpoints ($1) where an event with key $2 got a delivery that waits for its
-- turn: outbox_sequence() (sql/ordering.sql) reads these once they are committed.
-- Run by outbox_enqueue only then, under its caller's search_path.
INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
SELECT endpoint, $2 FROM pg_catalog.unnest($1::pg_catalog.text[]) AS endpoint
