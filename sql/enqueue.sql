-- outbox_enqueue's first statement: the event ($1 topic, $2 payload, $3 key, $4 deliver_at);
-- returns its id, and whether it went into the log (log mode, sql/log.sql: nothing more to do,
-- the relay routes it when it reads it back) or into outbox, for sql/route.sql. An event
-- scheduled with deliver_at takes the table path, which keeps it until it is due.
-- It runs under the caller's search_path, so every object is named by its schema.
WITH mode AS (
    SELECT s.enabled AND $4::pg_catalog.timestamptz IS NULL AS logged FROM @extschema@.outbox_log_state AS s
), logged AS (
    INSERT INTO @extschema@.outbox_log (id, topic, payload, key)
    SELECT pg_catalog.nextval('@extschema@.outbox_id_seq'), $1, $2, $3 FROM mode WHERE mode.logged
    RETURNING id
), tabled AS (
    INSERT INTO @extschema@.outbox (topic, payload, key)
    SELECT $1, $2, $3 WHERE NOT coalesce((SELECT mode.logged FROM mode), false)
    RETURNING id
)
SELECT logged.id, true FROM logged
UNION ALL
SELECT tabled.id, false FROM tabled
