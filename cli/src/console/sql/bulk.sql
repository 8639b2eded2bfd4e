-- Requeues ($10 = 'requeue') or skips ($10 = 'skip') every delivery an events filter matches,
-- oldest event first, each through the contract's function, so its rules and the role's
-- privileges apply; returns how many it changed. Only a dead delivery can be skipped: the others
-- a filter matches are passed over, not an error that undoes the rest.
WITH
--@include bounds.sql
SELECT pg_catalog.count(*) FILTER (WHERE CASE $10::text
                                            WHEN 'requeue' THEN @extschema@.outbox_requeue(m.event_id, m.endpoint) OPERATOR(pg_catalog.>) 0
                                            WHEN 'skip' THEN CASE WHEN m.dead_at IS NULL THEN false
                                                                  ELSE @extschema@.outbox_skip(m.endpoint, m.event_id)
                                                             END
                                        END)
  FROM (SELECT d.event_id, d.endpoint, d.dead_at
--@include filter.sql
         ORDER BY d.event_id) AS m
