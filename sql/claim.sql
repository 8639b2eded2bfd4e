-- The claim: due deliveries of the endpoints of one kind ('webhook' for the relay, 'pull' for
-- outbox_claim), locked, leased and counted as an attempt, in the one statement that the
-- relay workers, `outbox relay` and pull consumers all run (sql/claim_batch.sql calls it for
-- the relay; outbox_claim in sql/pull.sql for consumers). Call it in autocommit.
--
-- For each endpoint in endpoints at most the matching max_events, so a backlog at one
-- endpoint never stands in front of another's fresh events. Each inner SELECT walks that
-- endpoint's part of the outbox_deliveries_pending index in claim order and skips rows another
-- claimer has locked; the UPDATE pushes available_at forward by the endpoint's lease
-- (leases_ms, milliseconds: longer than its request timeout), so if the claimer dies the
-- deliveries become claimable again by themselves, and never while their request may still
-- run. The lease counts from when the row is taken (clock_timestamp), not from the
-- transaction's start: a claim that waited for a lock (an endpoint being dropped, say) must
-- not hand out leases already spent. A disabled (or dropped) endpoint gets nothing, even if
-- the claimer has not noticed yet.
-- A delivery that already had the endpoint's max_attempts is made dead instead of being
-- attempted again: its last lease ran out with no outcome recorded, or the cap was lowered
-- since. Its claimer died during the attempt, perhaps of this very delivery, which would
-- otherwise come back forever (a relay that stops takes its abandoned attempts back:
-- sql/uncount_abandoned.sql). So no claim starts an attempt numbered beyond max_attempts.
-- Counted by their size as sent, the claim takes about max_bytes of payload (no limit if
-- null): due rows are weighed oldest first over all endpoints and taken while their sizes add
-- up to no more (the first one whatever its size). Rows locked and not taken stay as they
-- were. Each payload is read once, where its delivery is locked, for its size and the rest.
-- Returns the claimed deliveries, with their event and, for a webhook, the delivery envelope
-- as body: {"type", "timestamp", "data"}; and the claim's fencing token (fence: every claim
-- raises it, nothing lowers it), by which the claimer records the attempt's outcome. Then
-- those made dead, with a null fence and their last_error; then, if the bytes budget left due
-- deliveries out, a row of nulls: the relay claims again as soon as a request ends. claimer
-- is kept in claimed_by: a worker's or consumer's process id, or an `outbox relay` process's
-- id, which is negative (its connections may be any server process behind a pooler).
--
-- Its plan is made once per session (force_generic_plan) and must suit the tables at any
-- size, whoever calls it first: see the settings in core/src/statements.rs. With exact
-- argument types, each operator and function resolves to pg_catalog. The statement names the
-- arguments by number ($1 kind ... $7 claimer), so that it also runs as a statement of its
-- own, as the tests that read its plan prepare it.
CREATE OR REPLACE FUNCTION @extschema@.outbox_claim_due(
    kind text,
    endpoints text[],
    max_events bigint[],
    leases_ms float8[],
    max_attempts integer[],
    max_bytes bigint,
    claimer integer)
RETURNS TABLE (
    endpoint text,
    event_id bigint,
    attempts integer,
    body text,
    last_error text,
    fence integer,
    topic text,
    payload jsonb,
    key text,
    created_at timestamptz)
LANGUAGE plpgsql
VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimable AS (
        SELECT c.row_id, c.event_id, w.endpoint, c.spent, o.topic, o.created_at, o.payload, o.key,
               sum(CASE WHEN c.spent THEN 0 ELSE o.size END)
                   OVER (ORDER BY c.available_at, c.event_id, w.endpoint ROWS UNBOUNDED PRECEDING) AS bytes,
               CASE WHEN c.spent THEN 0 ELSE o.size END AS size
          FROM unnest($2, $3, $5) AS w (endpoint, max_events, max_attempts)
          JOIN @extschema@.outbox_endpoints AS e
            ON e.name = w.endpoint AND e.kind = $1 AND e.disabled_at IS NULL
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
                SELECT o.topic, o.created_at, o.payload, o.key,
                       CASE WHEN pg_column_compression(o.payload) IS NULL THEN pg_column_size(o.payload)
                            ELSE octet_length(o.payload::text) END::bigint AS size
                  FROM @extschema@.outbox AS o
                 WHERE o.id = c.event_id
                OFFSET 0) AS o
    ), taken AS (
        SELECT claimable.row_id, claimable.spent
          FROM claimable
         WHERE claimable.spent OR $6 IS NULL OR claimable.bytes <= $6 OR claimable.bytes = claimable.size
    ), claimed AS (
        -- By the rows' physical addresses (a TID scan): the planner cannot know how few rows the
        -- claim took, and a join would make it read the whole table.
        UPDATE @extschema@.outbox_deliveries AS d
           SET attempts     = d.attempts + 1,
               fence        = d.fence + 1,
               available_at = clock_timestamp() + l.lease_ms * interval '1 millisecond',
               claimed_by   = $7
          FROM unnest($2, $4) AS l (endpoint, lease_ms)
         WHERE d.ctid = ANY (ARRAY(SELECT taken.row_id FROM taken WHERE NOT taken.spent))
           AND d.endpoint = l.endpoint
        RETURNING d.endpoint, d.event_id, d.attempts, d.fence
    ), spent AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET dead_at    = now(),
               claimed_by = NULL,
               last_error = CASE WHEN d.claimed_by IS NULL THEN d.last_error
                                 ELSE 'the lease of attempt ' || d.attempts || ' ran out with no '
                                      || CASE WHEN $1 = 'pull' THEN 'ack or nack' ELSE 'outcome recorded' END END
         WHERE d.ctid = ANY (ARRAY(SELECT taken.row_id FROM taken WHERE taken.spent))
        RETURNING d.endpoint, d.event_id, d.attempts, d.last_error
    )
    SELECT c.endpoint,
           c.event_id,
           c.attempts,
           CASE WHEN $1 = 'webhook'
                THEN json_build_object('type', claimable.topic, 'timestamp', claimable.created_at, 'data', claimable.payload)::text END,
           NULL,
           c.fence,
           claimable.topic,
           claimable.payload,
           claimable.key,
           claimable.created_at
      FROM claimed AS c
      JOIN claimable ON claimable.event_id = c.event_id AND claimable.endpoint = c.endpoint
    UNION ALL
    SELECT s.endpoint, s.event_id, s.attempts, NULL, s.last_error, NULL, NULL, NULL, NULL, NULL
      FROM spent AS s
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
     WHERE (SELECT count(*) FROM claimable) > (SELECT count(*) FROM taken);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_claim_due(text, text[], bigint[], float8[], integer[], bigint, integer) FROM PUBLIC;
