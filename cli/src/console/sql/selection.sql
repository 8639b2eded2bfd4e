-- Requeues ($3 = 'requeue') or skips ($3 = 'skip') the deliveries chosen on the events page
-- ($1 event ids, $2 their endpoints), each through the contract's function; returns how many
-- it changed.
SELECT pg_catalog.count(*) FILTER (WHERE CASE $3::text
                                            WHEN 'requeue' THEN @extschema@.outbox_requeue(s.event_id, s.endpoint) OPERATOR(pg_catalog.>) 0
                                            WHEN 'skip' THEN @extschema@.outbox_skip(s.endpoint, s.event_id)
                                        END)
  FROM pg_catalog.unnest($1::bigint[], $2::text[]) AS s (event_id, endpoint)
