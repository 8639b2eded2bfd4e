-- The user-facing functions. A fresh install runs this file last; the update from 0.1.0
-- includes it, so CREATE OR REPLACE throughout.
--
-- Privileges: every function below runs as the extension's owner (SECURITY DEFINER) with
-- search_path pinned to pg_catalog, so a role needs nothing but EXECUTE on a function to use
-- it, can do nothing through it but what it says, and nothing that role (or anyone) created
-- can run inside it. EXECUTE is granted to nobody by default: see the GRANT recipes of docs/security.md.

-- The patterns that match a topic: '*', the topic itself, and 'prefix.*' at each dot
-- ('order.a.b' gives {*, order.a.b, order.*, order.a.*}). An endpoint is subscribed to an
-- event when its topics share one with them (&&): one array comparison per endpoint, the
-- patterns computed once per event. outbox_enqueue calls it under its caller's search_path,
-- so it names every operator and function by schema. Declared STABLE, though it is
-- immutable: an immutable call on a parameter is folded into each custom plan, which made
-- the planner prefer planning outbox_enqueue's statement again on every call.
CREATE OR REPLACE FUNCTION @extschema@.outbox_topic_patterns(topic text)
RETURNS text[]
LANGUAGE plpgsql
STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    patterns pg_catalog.text[] := ARRAY['*', topic];
    upto pg_catalog.int4 := 0;
    dot pg_catalog.int4;
BEGIN
    LOOP
        dot := pg_catalog.strpos(pg_catalog.substr(topic, upto OPERATOR(pg_catalog.+) 1), '.');
        EXIT WHEN dot OPERATOR(pg_catalog.=) 0;
        upto := upto OPERATOR(pg_catalog.+) dot;
        patterns := patterns OPERATOR(pg_catalog.||) (pg_catalog.left(topic, upto) OPERATOR(pg_catalog.||) '*');
    END LOOP;
    RETURN patterns;
END
$$;

-- For consumers: call in the transaction that applies the event. True the first time this
-- consumer sees the id; false for a duplicate, whose effect the caller then skips.
-- PL/pgSQL, not SQL: a consumer calls it for every job, and PL/pgSQL keeps the INSERT's plan
-- for the session where a SQL function is planned again on each call.
CREATE OR REPLACE FUNCTION @extschema@.outbox_mark_processed(event_id bigint, consumer text DEFAULT 'default')
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF event_id IS NULL OR consumer IS NULL THEN
        RAISE EXCEPTION 'outbox_mark_processed: event_id and consumer must not be null'
              USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO @extschema@.processed_events (consumer, event_id)
    VALUES (outbox_mark_processed.consumer, outbox_mark_processed.event_id)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Puts the dead (or pending) deliveries of an event back in the queue with a fresh attempt
-- budget: to one endpoint, or to all of them when endpoint is null. Returns how many. On an
-- ordered endpoint, a dead head is retried at once, still ahead of its key; any other
-- delivery with a key waits for its turn again (by event id). Sent
-- deliveries are left alone (outbox_replay sends those again), and so is one a worker holds
-- right now (claimed, lease running, no failure recorded yet): its request may be in flight.
CREATE OR REPLACE FUNCTION @extschema@.outbox_requeue(event_id bigint, endpoint text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    how_many integer;
BEGIN
    IF $2 IS NOT NULL AND NOT EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = $2) THEN
        RAISE EXCEPTION 'outbox_requeue: endpoint % does not exist', quote_literal($2)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH requeued AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET dead_at = NULL, attempts = 0, available_at = now(), claimed_by = NULL,
               waiting = @extschema@.outbox_waits_for_key(d.endpoint, d.key, d.event_id)
         WHERE d.event_id = $1
           AND ($2 IS NULL OR d.endpoint = $2)
           AND d.sent_at IS NULL
           AND NOT (d.dead_at IS NULL AND d.claimed_by IS NOT NULL AND d.available_at > now())
        RETURNING d.endpoint, d.key, d.waiting
    ), arrived AS (
        INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
        SELECT requeued.endpoint, requeued.key FROM requeued WHERE requeued.waiting
    )
    SELECT count(*)::integer INTO how_many FROM requeued;
    RETURN how_many;
END
$$;

-- Delivers again every retained event created in [since, until) whose topic the endpoint
-- matches, sent or not: how a new endpoint back-fills and how one recovers after an incident.
-- Returns the number of deliveries created or reset (one a worker holds right now is left to
-- its claim). On an ordered endpoint they wait for their keys' turns, in event-id order.
CREATE OR REPLACE FUNCTION @extschema@.outbox_replay(endpoint text, since timestamptz, until timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    patterns text[];
    is_ordered boolean;
    replayed bigint;
BEGIN
    IF since IS NULL OR until IS NULL THEN
        RAISE EXCEPTION 'outbox_replay: since and until must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- The table before the endpoint's row, as outbox_endpoint_set and _drop take them: a drop
    -- of the endpoint, or a change of its ordering, that is in progress finishes first and
    -- none starts before this commits, so the replay writes what the endpoint is now.
    LOCK TABLE @extschema@.outbox_deliveries IN ROW EXCLUSIVE MODE;
    SELECT e.topics, e.ordered INTO patterns, is_ordered
      FROM @extschema@.outbox_endpoints AS e
     WHERE e.name = outbox_replay.endpoint
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_replay: endpoint % does not exist', quote_nullable(outbox_replay.endpoint)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each event is locked (FOR KEY SHARE) before its delivery is written: retention skips an
    -- event so locked, and deletes one only once it sees every delivery of it
    -- (sql/delete_expired.sql).
    WITH replayed AS (
        INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, key, waiting)
        SELECT o.id, outbox_replay.endpoint, CASE WHEN is_ordered THEN o.key END, is_ordered AND o.key IS NOT NULL
          FROM @extschema@.outbox AS o
         WHERE o.created_at >= since AND o.created_at < until
           AND patterns OPERATOR(pg_catalog.&&) @extschema@.outbox_topic_patterns(o.topic)
           FOR KEY SHARE OF o
        ON CONFLICT ON CONSTRAINT outbox_deliveries_pkey DO UPDATE
           SET sent_at = NULL, dead_at = NULL, attempts = 0, available_at = now(), last_error = NULL, claimed_by = NULL,
               key = excluded.key, waiting = @extschema@.outbox_waits_for_key(d.endpoint, excluded.key, d.event_id)
         WHERE NOT (d.sent_at IS NULL AND d.dead_at IS NULL AND d.claimed_by IS NOT NULL AND d.available_at > now())
        RETURNING d.event_id, d.key, d.waiting
    ), arrived AS (
        INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
        SELECT DISTINCT outbox_replay.endpoint, replayed.key FROM replayed WHERE replayed.waiting
    ), routed AS (
        -- The events this statement gave a delivery, not those a later snapshot would match.
        DELETE FROM @extschema@.outbox_unrouted AS u
         USING replayed
         WHERE u.event_id = replayed.event_id
    )
    SELECT count(*) INTO replayed FROM replayed;
    RETURN replayed;
END
$$;

-- Per endpoint: how many of its deliveries are pending (due now), waiting (leased, backing
-- off, scheduled, behind their key on an ordered endpoint, or the endpoint is disabled) and
-- dead, how many keys a dead head blocks, how long the oldest due one has waited, and its
-- health. Read from the pending, waiting and dead indexes, never the sent history. In log
-- mode, the events routed to it that the log holds unread while its reading stalls
-- (outbox_log_unread) are pending too.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_stats(
    OUT endpoint text,
    OUT pending bigint,
    OUT waiting bigint,
    OUT dead bigint,
    OUT oldest_pending_age interval,
    OUT failing_since timestamptz,
    OUT disabled_at timestamptz,
    OUT blocked_keys bigint)
RETURNS SETOF record
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH queued AS (
        SELECT d.endpoint,
               count(*) FILTER (WHERE d.available_at <= now()) AS due,
               count(*) FILTER (WHERE d.available_at > now()) AS later,
               min(d.available_at) FILTER (WHERE d.available_at <= now()) AS oldest_due,
               -- Heads of ordered keys (the one delivery of a key not waiting), never attempted,
               -- that are not due for more than an hour: a far deliver_at holds the key.
               count(*) FILTER (WHERE d.key IS NOT NULL AND d.attempts = 0 AND d.claimed_by IS NULL
                                  AND d.available_at > now() + interval '1 hour') AS far_heads
          FROM @extschema@.outbox_deliveries AS d
         WHERE d.sent_at IS NULL AND d.dead_at IS NULL AND NOT d.waiting
         GROUP BY d.endpoint
    ), behind AS (
        SELECT d.endpoint, count(*) AS behind
          FROM @extschema@.outbox_deliveries AS d
         WHERE d.waiting
         GROUP BY d.endpoint
    ), dead AS (
        SELECT d.endpoint,
               count(*) AS dead,
               count(*) FILTER (WHERE EXISTS (SELECT FROM @extschema@.outbox_keys AS k
                                               WHERE k.endpoint = d.endpoint AND k.key = d.key
                                                 AND k.head = d.event_id)) AS blocked_keys
          FROM @extschema@.outbox_deliveries AS d
         WHERE d.dead_at IS NOT NULL
         GROUP BY d.endpoint
    ), unread AS (
        SELECT u.endpoint, u.unread, u.oldest FROM @extschema@.outbox_log_unread() AS u
    )
    SELECT e.name,
           CASE WHEN e.disabled_at IS NULL THEN coalesce(q.due, 0) + coalesce(u.unread, 0) ELSE 0 END,
           coalesce(b.behind, 0)
             + CASE WHEN e.disabled_at IS NULL THEN coalesce(q.later, 0)
                    ELSE coalesce(q.due, 0) + coalesce(q.later, 0) + coalesce(u.unread, 0) END,
           coalesce(x.dead, 0),
           CASE WHEN e.disabled_at IS NULL THEN now() - least(q.oldest_due, u.oldest) END,
           e.failing_since,
           e.disabled_at,
           coalesce(x.blocked_keys, 0) + coalesce(q.far_heads, 0)
      FROM @extschema@.outbox_endpoints AS e
      LEFT JOIN queued AS q ON q.endpoint = e.name
      LEFT JOIN behind AS b ON b.endpoint = e.name
      LEFT JOIN dead AS x ON x.endpoint = e.name
      LEFT JOIN unread AS u ON u.endpoint = e.name
     ORDER BY e.name
$$;

-- The numbers an alert watches, over all endpoints: outbox_endpoint_stats() summed, with the
-- deliveries acknowledged so far (counted as they were recorded) and the unrouted events.
CREATE OR REPLACE FUNCTION @extschema@.outbox_stats(
    OUT pending bigint,
    OUT waiting bigint,
    OUT sent bigint,
    OUT dead bigint,
    OUT unrouted bigint,
    OUT oldest_pending_age interval)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(s.pending), 0)::bigint,
           coalesce(sum(s.waiting), 0)::bigint,
           (SELECT coalesce(sum(c.sent), 0)::bigint FROM @extschema@.outbox_delivery_counts AS c),
           coalesce(sum(s.dead), 0)::bigint,
           (SELECT count(*) FROM @extschema@.outbox_unrouted),
           max(s.oldest_pending_age)
      FROM @extschema@.outbox_endpoint_stats() AS s
$$;

-- PostgreSQL lets PUBLIC execute every new function; take that back.
REVOKE ALL ON FUNCTION @extschema@.outbox_topic_patterns(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_mark_processed(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_requeue(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_replay(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_stats() FROM PUBLIC;
