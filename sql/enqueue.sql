-- outbox_enqueue's first statement in table mode: the event ($1 topic, $2 payload, $3 key,
-- $4 deliver_at) into outbox, for sql/route.sql; returns its id. Nothing, in log mode, unless
-- $5 says to write it here whatever the mode (sql/enqueue_log.sql wrote nothing: the mode
-- changed, or this is an event scheduled with deliver_at, which the table path keeps until
-- it is due). The mode is read in the same statement, which costs less than a statement of
-- its own; so is whether an outbox relay waits for a notification of the commit
-- (sql/relays.sql; a row not refreshed for 5 minutes is a killed relay's, as a starting relay
-- removes it), which outbox_enqueue then sends, as the SQL install's does, unless the
-- server's notification queue is half full: any role may fill it, and a commit whose
-- notification finds it full fails.
-- It runs under the caller's search_path, so every object is named by its schema.
INSERT INTO @extschema@.outbox (topic, payload, key)
SELECT $1, $2, $3
 WHERE $5 OR $4::pg_catalog.timestamptz IS NOT NULL
    OR NOT coalesce((SELECT s.enabled FROM @extschema@.outbox_log_state AS s), false)
RETURNING id, CASE WHEN EXISTS (SELECT FROM @extschema@.outbox_relays AS r
                         WHERE r.listening AND r.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '5 minutes'))
            THEN pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 ELSE false END
