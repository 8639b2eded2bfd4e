-- The webhook endpoints to claim for, with what the worker needs to send to them: read in the
-- claim's transaction, so a change (or a secret rotation) applies to the next claim. The
-- secrets are the live ones, newest first. Timeout in milliseconds (float8), null = setting;
-- max_attempts the endpoint's, else the outbox's (outbox.max_attempts, as sql/limits.sql reads it).
SELECT e.name,
       e.url,
       array(SELECT h.key FROM jsonb_each_text(e.headers) AS h ORDER BY h.key),
       array(SELECT h.value FROM jsonb_each_text(e.headers) AS h ORDER BY h.key),
       date_part('epoch', e.timeout) * 1000,
       coalesce(e.max_attempts, (SELECT @extschema@.outbox_max_attempts())),
       e.max_in_flight,
       array(SELECT s.secret
               FROM @extschema@.outbox_endpoint_secrets AS s
              WHERE s.endpoint = e.name
                AND (s.expires_at IS NULL OR s.expires_at > now())
              ORDER BY s.generation DESC),
       e.ordered
  FROM @extschema@.outbox_endpoints AS e
 WHERE e.kind = 'webhook'
   AND e.disabled_at IS NULL
 ORDER BY e.name
