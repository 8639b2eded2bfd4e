-- Deliveries sent and attempts failed per endpoint and minute over the last hour, read from
-- the sent index and the attempts' history; and the pull consumers holding leases now.
SELECT pg_catalog.json_build_object(
           'minutes', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                  'endpoint', m.endpoint, 'minute', m.minute, 'sent', m.sent, 'failed', m.failed)
                                  ORDER BY m.endpoint, m.minute), '[]')
                         FROM (SELECT x.endpoint, x.minute, pg_catalog.sum(x.sent)::bigint AS sent, pg_catalog.sum(x.failed)::bigint AS failed
                                 FROM (SELECT d.endpoint, pg_catalog.date_trunc('minute', d.sent_at) AS minute, pg_catalog.count(*) AS sent, 0 AS failed
                                         FROM @extschema@.outbox_deliveries AS d
                                        WHERE d.sent_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour')
                                        GROUP BY 1, 2
                                       UNION ALL
                                       SELECT a.endpoint, pg_catalog.date_trunc('minute', a.failed_at), 0, pg_catalog.count(*)
                                         FROM @extschema@.outbox_attempts AS a
                                        WHERE a.failed_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 hour')
                                        GROUP BY 1, 2) AS x
                                GROUP BY 1, 2) AS m),
           'consumers', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                    'endpoint', c.endpoint, 'session', c.claimed_by, 'leases', c.leases, 'until', c.until)
                                    ORDER BY c.endpoint, c.claimed_by), '[]')
                           FROM (SELECT d.endpoint, d.claimed_by, pg_catalog.count(*) AS leases, pg_catalog.max(d.available_at) AS until
                                   FROM @extschema@.outbox_deliveries AS d
                                   JOIN @extschema@.outbox_endpoints AS e ON e.name OPERATOR(pg_catalog.=) d.endpoint
                                  WHERE e.kind OPERATOR(pg_catalog.=) 'pull'
                                    AND d.sent_at IS NULL AND d.dead_at IS NULL AND NOT d.waiting
                                    AND d.claimed_by IS NOT NULL
                                    AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.now()
                                  GROUP BY 1, 2) AS c))::text
