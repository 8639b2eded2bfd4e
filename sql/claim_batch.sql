-- Claim due deliveries for this worker, in one autocommit statement: for each endpoint in $1
-- at most the matching count in $2, so a backlog at one endpoint never stands in front of
-- another's fresh events. Each inner SELECT walks that endpoint's part of the
-- outbox_deliveries_pending index in claim order and skips rows another claimer has locked;
-- the UPDATE pushes available_at forward by the endpoint's lease ($3, float8 milliseconds:
-- longer than its request timeout), so if this worker dies the deliveries become claimable
-- again by themselves, and never while their request may still run. The lease counts from
-- when the row is taken (clock_timestamp), not from the transaction's start: a claim that
-- waited for a lock (an endpoint being dropped, say) must not hand out leases already spent.
-- A disabled (or dropped) endpoint gets nothing, even if the worker has not noticed yet.
-- A delivery that already had the endpoint's max_attempts ($4) is made dead instead of being
-- attempted again: its last lease ran out with no outcome recorded, or the cap was lowered
-- since. Its worker died during the request, perhaps of this very delivery, which would
-- otherwise come back forever (a worker that stops takes its abandoned attempts back:
-- sql/uncount_abandoned.sql). So no claim starts an attempt numbered beyond max_attempts;
-- only a server crash that loses a claim, committed asynchronously, can repeat a number.
-- outbox_claim does the same for pull endpoints.
-- The worker keeps the limits within its requests budget; the claim takes, counted by their
-- size as sent, about $5 bytes of payload: what the worker's bytes budget leaves. Due rows are
-- weighed oldest first over all endpoints and taken while their sizes add up to no more than
-- $5 (the first one whatever its size). Rows locked and not taken stay as they were. Each
-- payload is read once, where its delivery is locked, for its size and for the body.
-- Returns the claimed deliveries, with the delivery envelope as body: {"type", "timestamp",
-- "data"}, and the claim's fencing token (fence: every claim raises it, nothing lowers it), by
-- which the worker records the attempt's outcome; then those made dead, with a null body and
-- their last_error; then, if the bytes budget left due deliveries out, a row of nulls: the worker
-- claims again as soon as a request ends. $6 is who claims, kept in claimed_by: a worker's
-- process id, or an `outbox relay` process's id, which is negative (its connections may be
-- any server process behind a pooler).
--
-- Like every statement the workers run, this one runs with search_path = pg_catalog, pg_temp
-- and names the extension's tables by their schema: with exact argument types, each operator
-- and function resolves to pg_catalog, whatever anyone created elsewhere.
WITH claimable AS (
    SELECT c.row_id, c.event_id, w.endpoint, c.spent, o.topic, o.created_at, o.payload,
           sum(CASE WHEN c.spent THEN 0 ELSE o.size END)
               OVER (ORDER BY c.available_at, c.event_id, w.endpoint ROWS UNBOUNDED PRECEDING) AS bytes,
           CASE WHEN c.spent THEN 0 ELSE o.size END AS size
      FROM unnest($1::text[], $2::bigint[], $4::integer[]) AS w (endpoint, max_events, max_attempts)
      JOIN @extschema@.outbox_endpoints AS e
        ON e.name = w.endpoint AND e.kind = 'webhook' AND e.disabled_at IS NULL
     CROSS JOIN LATERAL (
            SELECT d.ctid AS row_id, d.event_id, d.available_at, d.attempts >= w.max_attempts AS spent
              FROM @extschema@.outbox_deliveries AS d
             WHERE d.endpoint = w.endpoint
               AND d.sent_at IS NULL
               AND d.dead_at IS NULL
               AND NOT d.waiting
               AND d.available_at <= now()
             ORDER BY d.available_at, d.event_id
             LIMIT w.max_events
               FOR UPDATE SKIP LOCKED) AS c
     CROSS JOIN LATERAL (
            -- Each event looked up by id: OFFSET 0 keeps the planner from making this a join,
            -- which it may plan as a scan of outbox from its oldest event. The payload's size
            -- as sent: its stored size, unless compression made that smaller.
            SELECT o.topic, o.created_at, o.payload,
                   CASE WHEN pg_column_compression(o.payload) IS NULL THEN pg_column_size(o.payload)
                        ELSE octet_length(o.payload::text) END::bigint AS size
              FROM @extschema@.outbox AS o
             WHERE o.id = c.event_id
            OFFSET 0) AS o
), taken AS (
    SELECT claimable.row_id, claimable.spent
      FROM claimable
     WHERE claimable.spent OR claimable.bytes <= $5 OR claimable.bytes = claimable.size
), claimed AS (
    -- By the rows' physical addresses (a TID scan): the planner cannot know how few rows the
    -- claim took, and a join would make it read the whole table.
    UPDATE @extschema@.outbox_deliveries AS d
       SET attempts     = d.attempts + 1,
           fence        = d.fence + 1,
           available_at = clock_timestamp() + l.lease_ms * interval '1 millisecond',
           claimed_by   = $6
      FROM unnest($1::text[], $3::float8[]) AS l (endpoint, lease_ms)
     WHERE d.ctid = ANY (ARRAY(SELECT taken.row_id FROM taken WHERE NOT taken.spent))
       AND d.endpoint = l.endpoint
    RETURNING d.endpoint, d.event_id, d.attempts, d.fence
), spent AS (
    UPDATE @extschema@.outbox_deliveries AS d
       SET dead_at    = now(),
           claimed_by = NULL,
           last_error = CASE WHEN d.claimed_by IS NULL THEN d.last_error
                             ELSE 'the lease of attempt ' || d.attempts || ' ran out with no outcome recorded' END
     WHERE d.ctid = ANY (ARRAY(SELECT taken.row_id FROM taken WHERE taken.spent))
    RETURNING d.endpoint, d.event_id, d.attempts, d.last_error
)
SELECT c.endpoint,
       c.event_id,
       c.attempts,
       json_build_object('type', claimable.topic, 'timestamp', claimable.created_at, 'data', claimable.payload)::text AS body,
       NULL AS last_error,
       c.fence
  FROM claimed AS c
  JOIN claimable ON claimable.event_id = c.event_id AND claimable.endpoint = c.endpoint
UNION ALL
SELECT s.endpoint, s.event_id, s.attempts, NULL, s.last_error, NULL
  FROM spent AS s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL
 WHERE (SELECT count(*) FROM claimable) > (SELECT count(*) FROM taken)
