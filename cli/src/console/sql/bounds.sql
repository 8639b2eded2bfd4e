-- Where an events filter's walk of the deliveries, newest first, may stop (sql/filter.sql):
-- each bound is found once per statement, through an index, before the walk starts.
--
-- filter_window: the ids of the first and last event in the created_at window ($7 from, $8
-- until), from one scan of the BRIN index on created_at. The ends are read into a row of their
-- own first: the lossy BRIN scan rechecks every row of its block ranges, and would otherwise
-- cast the text of each end once per row.
filter_window AS MATERIALIZED (
    SELECT pg_catalog.min(b.id) AS first_id, pg_catalog.max(b.id) AS last_id
      FROM (SELECT $7::text::timestamptz AS since, $8::text::timestamptz AS until OFFSET 0) AS ends
      JOIN @extschema@.outbox AS b
        ON b.created_at OPERATOR(pg_catalog.>=) ends.since
       AND b.created_at OPERATOR(pg_catalog.<) ends.until
),
-- filter_state: with $1 pending or waiting, the oldest event with a delivery in that state, from
-- the queue's partial indexes. An empty or young queue then costs a short walk, not one through
-- the whole retained history.
filter_state AS MATERIALIZED (
    SELECT LEAST(ready.first_id, held.first_id) AS first_id
      FROM (SELECT pg_catalog.min(q.event_id) AS first_id
              FROM (SELECT q.event_id
                      FROM @extschema@.outbox_deliveries AS q
                     WHERE q.sent_at IS NULL AND q.dead_at IS NULL AND NOT q.waiting
                       AND CASE $1::text
                               WHEN 'pending' THEN q.available_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                               WHEN 'waiting' THEN q.available_at OPERATOR(pg_catalog.>) pg_catalog.now()
                               ELSE false
                           END
                    -- Kept a subquery: otherwise min becomes a walk of the primary key.
                    OFFSET 0) AS q) AS ready,
           (SELECT pg_catalog.min(q.event_id) AS first_id
              FROM (SELECT q.event_id
                      FROM @extschema@.outbox_deliveries AS q
                     WHERE q.waiting AND $1::text OPERATOR(pg_catalog.=) 'waiting'
                    OFFSET 0) AS q) AS held
)
