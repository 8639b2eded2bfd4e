-- The SQL install's forms of the functions the extension's library provides (sql/library.sql),
-- for servers that load no custom library. `outbox migrate` runs this file after the
-- extension's own files, and again after each update, so CREATE OR REPLACE throughout. Same
-- names, arguments, results and errors as the library's; what differs is said at each one.

-- outbox_enqueue as src/api.rs writes it, statement for statement (sql/enqueue.sql,
-- sql/route.sql, and when needed sql/note_unrouted.sql, sql/note_key_arrivals.sql,
-- sql/notify_endpoints.sql, sql/hold_routed_endpoints.sql). With no library to wake the relay
-- at commit, it notifies outbox_enqueued, which `outbox relay` listens on, while a relay says
-- it waits (sql/relays.sql): a NOTIFY makes the commits that send one take turns, which halved
-- the enqueue rate, so a relay with a backlog, which needs no wakeup, turns it off. A
-- rolled-back transaction's notification is never sent.
CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueue(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    size bigint;
    limit_bytes bigint;
    horizon interval;
    event_id bigint;
    deliveries bigint;
    waiting text[];
    notify text[];
    routed_to text[];
    relay_listens boolean;
BEGIN
    IF topic IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: topic must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF btrim(topic) = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: topic must not be empty' USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(topic) > 255 THEN
        RAISE EXCEPTION 'outbox_enqueue: topic is % bytes, more than 255', octet_length(topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: payload must not be null (use ''{}'' for an event without data)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- The settings as the library reads them: shown with units where it is loaded, or set as
    -- placeholders; else the library's defaults.
    size := octet_length(payload::text);
    limit_bytes := pg_size_bytes(coalesce(nullif(current_setting('outbox.max_payload_bytes', true), ''), '1MB'));
    IF size > limit_bytes THEN
        RAISE EXCEPTION 'outbox_enqueue: payload is % bytes of JSON text, more than outbox.max_payload_bytes (% bytes)',
            size, limit_bytes USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(key) > 255 THEN
        RAISE EXCEPTION 'outbox_enqueue: key is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF deliver_at IS NOT NULL THEN
        horizon := coalesce(nullif(current_setting('outbox.deliver_at_horizon', true), ''), '90d')::interval;
        IF NOT isfinite(deliver_at) THEN
            RAISE EXCEPTION 'outbox_enqueue: deliver_at must be a finite time (null: now)' USING ERRCODE = 'invalid_parameter_value';
        ELSIF deliver_at > now() + horizon THEN
            RAISE EXCEPTION 'outbox_enqueue: deliver_at is more than outbox.deliver_at_horizon (% s) from now', extract(epoch FROM horizon)::bigint
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- The event and its deliveries in one statement, which also reads whether a relay waits
    -- for a notification: each statement run costs a call a few µs.
    WITH event AS (
        INSERT INTO @extschema@.outbox (topic, payload, key)
        VALUES (outbox_enqueue.topic, outbox_enqueue.payload, outbox_enqueue.key)
        RETURNING id
    ), routed AS (
        INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, available_at, key, waiting)
        SELECT event.id, e.name, greatest(outbox_enqueue.deliver_at, now()),
               CASE WHEN e.ordered THEN outbox_enqueue.key END, e.ordered AND outbox_enqueue.key IS NOT NULL
          FROM event, @extschema@.outbox_endpoints AS e
         WHERE e.topics && (SELECT @extschema@.outbox_topic_patterns(outbox_enqueue.topic))
        RETURNING d.endpoint,
                  d.waiting,
                  (SELECT n.notify FROM @extschema@.outbox_endpoints AS n WHERE n.name = d.endpoint) AS notify
    )
    SELECT (SELECT event.id FROM event),
           count(*),
           array_agg(routed.endpoint) FILTER (WHERE routed.waiting),
           array_agg(routed.endpoint) FILTER (WHERE routed.notify),
           array_agg(routed.endpoint),
           EXISTS (SELECT FROM @extschema@.outbox_relays AS r WHERE r.listening)
      INTO event_id, deliveries, waiting, notify, routed_to, relay_listens
      FROM routed;

    IF deliveries = 0 THEN
        INSERT INTO @extschema@.outbox_unrouted (event_id, created_at) VALUES (event_id, now());
    END IF;
    IF waiting IS NOT NULL THEN
        INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
        SELECT endpoint, outbox_enqueue.key FROM unnest(waiting) AS endpoint;
    END IF;
    IF notify IS NOT NULL THEN
        PERFORM pg_notify('outbox.' || endpoint, '') FROM unnest(notify) AS endpoint;
    END IF;
    -- A transaction reading from one snapshot routed by the endpoints as they were when it
    -- began: fail if they were dropped or changed since, as sql/hold_routed_endpoints.sql does.
    IF routed_to IS NOT NULL AND current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        PERFORM FROM @extschema@.outbox_endpoints AS e WHERE e.name = ANY (routed_to) FOR KEY SHARE OF e;
    END IF;
    IF relay_listens THEN
        PERFORM pg_notify('outbox_enqueued', '');
    END IF;
    RETURN event_id;
END
$$;

-- The relay workers' counters live in the library's shared memory; the SQL install runs no
-- workers (`outbox relay` serves its own counters on /metrics): no rows.
CREATE OR REPLACE FUNCTION @extschema@.outbox_workers()
RETURNS TABLE (
    worker integer,
    pid integer,
    settings_loaded_at timestamptz,
    in_flight bigint,
    delivered bigint,
    failed bigint)
LANGUAGE sql
VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT NULL::integer, NULL::integer, NULL::timestamptz, NULL::bigint, NULL::bigint, NULL::bigint WHERE false $$;

CREATE OR REPLACE FUNCTION @extschema@.outbox_worker_attempts()
RETURNS TABLE (
    worker integer,
    outcome text,
    attempts bigint)
LANGUAGE sql
VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT NULL::integer, NULL::text, NULL::bigint WHERE false $$;

-- Events enqueued: the library counts those of committed transactions since the server
-- started; here, every id handed out (rolled-back ones too), which only grows, so a rate of
-- it is the enqueue rate.
CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueued()
RETURNS bigint
LANGUAGE sql
VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END FROM @extschema@.outbox_id_seq AS s $$;

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, jsonb, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_workers() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_worker_attempts() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueued() FROM PUBLIC;
