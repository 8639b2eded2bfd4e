-- The relays alive: `outbox relay` processes seen in the last minute, and the extension's
-- workers in this database (none in the SQL install).
SELECT pg_catalog.json_build_object(
           'processes', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                    'id', r.id, 'host', r.host, 'pid', r.pid, 'version', r.version,
                                    'started_at', r.started_at, 'seen_at', r.seen_at)), '[]')
                           FROM @extschema@.outbox_relay_processes() AS r),
           'workers', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                  'worker', w.worker, 'pid', w.pid, 'in_flight', w.in_flight,
                                  'delivered', w.delivered, 'failed', w.failed)), '[]')
                         FROM @extschema@.outbox_workers() AS w))::text
