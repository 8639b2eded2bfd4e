-- A page of the deliveries an events filter matches, newest event first: at most 50, after the
-- cursor ($10 event id, $11 endpoint: the last row of the page before), served by the primary
-- key read backwards. `more` says whether another page follows.
WITH
--@include bounds.sql
, page AS (
    SELECT d.event_id, d.endpoint, o.topic, o.key, o.created_at, d.attempts, d.available_at,
           d.sent_at, d.dead_at, d.last_error,
           CASE WHEN d.sent_at IS NOT NULL THEN 'sent'
                WHEN d.dead_at IS NOT NULL THEN 'dead'
                WHEN d.waiting OR d.available_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'waiting'
                ELSE 'pending'
           END AS state
--@include filter.sql
       AND ($10::bigint IS NULL OR (d.event_id, d.endpoint) OPERATOR(pg_catalog.<) ($10::bigint, $11::text))
     ORDER BY d.event_id DESC, d.endpoint DESC
     LIMIT 51
), numbered AS (
    SELECT p.*, pg_catalog.row_number() OVER (ORDER BY p.event_id DESC, p.endpoint DESC) AS n
      FROM page AS p
)
SELECT pg_catalog.json_build_object(
           'rows', coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                        'event_id', n.event_id, 'endpoint', n.endpoint, 'topic', n.topic, 'key', n.key,
                        'created_at', n.created_at, 'state', n.state, 'attempts', n.attempts,
                        'available_at', n.available_at, 'sent_at', n.sent_at, 'dead_at', n.dead_at,
                        'last_error', n.last_error)
                        ORDER BY n.n) FILTER (WHERE n.n OPERATOR(pg_catalog.<=) 50), '[]'),
           'more', pg_catalog.count(*) OPERATOR(pg_catalog.>) 50)::text
  FROM numbered AS n
