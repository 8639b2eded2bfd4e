-- The claims held now on the pull endpoints the role may consume.
SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
           'endpoint', l.endpoint, 'event_id', l.event_id, 'attempt', l.attempt, 'topic', l.topic,
           'attempts', l.attempts, 'leased_until', l.leased_until)), '[]')::text
  FROM @extschema@.outbox_leases() AS l
