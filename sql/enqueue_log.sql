-- outbox_enqueue's statement in log mode (sql/log.sql): the event ($1 topic, $2 payload,
-- $3 key) into the append-only log, and nothing more: the relay routes it when it reads it
-- back from the slot. Returns its id, and whether an outbox relay waits for a notification of
-- the commit (sql/relays.sql); nothing in table mode, or for an event scheduled with
-- deliver_at ($4), which takes the table path (sql/enqueue.sql). One statement that chose
-- between both tables (a CTE with an INSERT into each) made log mode's enqueue an eighth slower.
-- It runs under the caller's search_path, so every object is named by its schema.
INSERT INTO @extschema@.outbox_log (id, topic, payload, key)
SELECT pg_catalog.nextval('@extschema@.outbox_id_seq'), $1, $2, $3
  FROM @extschema@.outbox_log_state AS s
 WHERE s.enabled AND $4::pg_catalog.timestamptz IS NULL
RETURNING id, CASE WHEN EXISTS (SELECT FROM @extschema@.outbox_relays AS r
                         WHERE r.listening AND r.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '5 minutes'))
            THEN pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 ELSE false END
