-- Disable every endpoint that has had no successful delivery for $1 milliseconds (float8,
-- outbox.endpoint_disable_after) while failing. Its deliveries wait; outbox_endpoint_enable
-- resumes them. Returns each endpoint disabled and why, for the worker's WARNING. A row
-- someone else holds is left for the next pass: a transaction left open on an endpoint must
-- not stop the claims of every endpoint.
UPDATE @extschema@.outbox_endpoints AS e
   SET disabled_at     = now(),
       disabled_reason = 'no successful delivery since ' || e.failing_since::text
                         || ' (outbox.endpoint_disable_after); last error: ' || coalesce(e.last_error, 'none')
 WHERE e.name IN (SELECT f.name
                    FROM @extschema@.outbox_endpoints AS f
                   WHERE f.disabled_at IS NULL
                     AND f.failing_since <= now() - $1 * interval '1 millisecond'
                     FOR NO KEY UPDATE SKIP LOCKED)
RETURNING e.name, e.disabled_reason
