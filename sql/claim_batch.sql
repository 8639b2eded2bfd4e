-- The relay's claim, for its webhook endpoints (sql/claim.sql): $1 the endpoints, $2 the most
-- deliveries to take of each, $3 their leases (float8 milliseconds), $4 their max_attempts,
-- $5 about how many bytes of payload to take in all, $6 who claims. Run in autocommit.
-- Returns (endpoint, event_id, attempts, body, last_error, fence) rows: the claimed
-- deliveries, then those made dead (null fence), then a row of nulls if the bytes budget left
-- due deliveries out.
SELECT c.endpoint, c.event_id, c.attempts, c.body, c.last_error, c.fence
  FROM @extschema@.outbox_claim_due('webhook', $1, $2, $3, $4, $5, $6) AS c
