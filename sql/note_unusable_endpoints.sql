-- Enabled endpoints the workers cannot send to ($1 names, $2 reasons, pairwise): no URL, or a
-- URL, header or secret the HTTP client refuses. Their deliveries wait, unclaimed; their
-- health says why, so that outbox_endpoint_stats(), the alerts on failing_since and
-- outbox.endpoint_disable_after treat them as endpoints that keep failing. Writes nothing
-- once recorded. An endpoint's row someone is changing right now is skipped, as in
-- sql/record_failures.sql: a transaction left open on it must not stop the worker, and the
-- change is read before this runs again.
UPDATE @extschema@.outbox_endpoints AS e
   SET failing_since = coalesce(e.failing_since, now()),
       last_error    = u.reason
  FROM unnest($1::text[], $2::text[]) AS u (name, reason)
 WHERE e.name = u.name
   AND (e.failing_since IS NULL OR e.last_error IS DISTINCT FROM u.reason)
   AND e.name IN (SELECT h.name
                    FROM @extschema@.outbox_endpoints AS h
                   WHERE h.name = ANY ($1)
                     FOR NO KEY UPDATE SKIP LOCKED)
