-- The overview's endpoints: outbox_endpoint_stats() with each endpoint's health.
SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
           'name', s.endpoint,
           'kind', e.kind,
           'topics', e.topics,
           'ordered', e.ordered,
           'pending', s.pending,
           'waiting', s.waiting,
           'dead', s.dead,
           'oldest_pending_seconds', pg_catalog.date_part('epoch', s.oldest_pending_age),
           'blocked_keys', s.blocked_keys,
           'failing_since', s.failing_since,
           'last_success_at', e.last_success_at,
           'last_error', e.last_error,
           'disabled_at', s.disabled_at,
           'disabled_reason', e.disabled_reason) ORDER BY s.endpoint), '[]')::text
  FROM @extschema@.outbox_endpoint_stats() AS s
  JOIN @extschema@.outbox_endpoints AS e ON e.name OPERATOR(pg_catalog.=) s.endpoint
