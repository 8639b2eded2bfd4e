-- The deliveries an events filter matches: $1 state (pending, waiting, dead or sent), $2
-- endpoint, $3 topic, exact or, when $4, a prefix; $5 key, $6 event id, $7 and $8 the window
-- of created_at, $9 a JSON path the payload must match. A null filters nothing. Each query is
-- planned for its values (an unnamed statement), so the conditions left null cost nothing. The
-- statement defines the bounds of sql/bounds.sql, which sql/within_bounds.sql applies.
  FROM @extschema@.outbox_deliveries AS d
  JOIN @extschema@.outbox AS o ON o.id OPERATOR(pg_catalog.=) d.event_id
 WHERE CASE $1::text
           WHEN 'pending' THEN d.sent_at IS NULL AND d.dead_at IS NULL AND NOT d.waiting
                               AND d.available_at OPERATOR(pg_catalog.<=) pg_catalog.now()
           WHEN 'waiting' THEN d.sent_at IS NULL AND d.dead_at IS NULL
                               AND (d.waiting OR d.available_at OPERATOR(pg_catalog.>) pg_catalog.now())
           WHEN 'dead'    THEN d.dead_at IS NOT NULL
           WHEN 'sent'    THEN d.sent_at IS NOT NULL
           ELSE true
       END
   AND ($2::text IS NULL OR d.endpoint OPERATOR(pg_catalog.=) $2)
   AND ($3::text IS NULL OR CASE WHEN $4::boolean THEN pg_catalog.starts_with(o.topic, $3) ELSE o.topic OPERATOR(pg_catalog.=) $3 END)
   AND ($5::text IS NULL OR o.key OPERATOR(pg_catalog.=) $5)
   AND ($6::bigint IS NULL OR d.event_id OPERATOR(pg_catalog.=) $6)
   AND ($7::text IS NULL OR o.created_at OPERATOR(pg_catalog.>=) $7::text::timestamptz)
   AND ($8::text IS NULL OR o.created_at OPERATOR(pg_catalog.<) $8::text::timestamptz)
   AND ($9::text IS NULL OR o.payload OPERATOR(pg_catalog.@?) $9::text::jsonpath)
--@include within_bounds.sql
