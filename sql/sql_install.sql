-- The SQL install's forms of the functions the extension's library provides (sql/library.sql),
-- for servers that load no custom library. `outbox migrate` runs this file after the
-- extension's own files, and again after each update, so CREATE OR REPLACE throughout. Same
-- names, arguments, results and errors as the library's; what differs is said at each one.

-- outbox_enqueue with the library's checks, errors and rows (src/api.rs): the event
-- (sql/enqueue.sql), one delivery per endpoint whose topics match (sql/route.sql), and only
-- when needed the unrouted note, the key arrivals, the pull endpoints' notifications and the
-- hold on the routed endpoints. A call costs about 25 µs, a statement run 3-5 µs and each
-- expression or RETURNING list a fraction of one, so the common case runs two statements.
-- With no library to wake the relay at commit, it notifies outbox_enqueued, which
-- `outbox relay` listens on, while a relay says it waits (sql/relays.sql): a NOTIFY makes the
-- commits that send one take turns, which halved the enqueue rate, so a relay with a backlog,
-- which needs no wakeup, turns it off. A rolled-back transaction's notification is never sent,
-- none for a relay's row not refreshed for 5 minutes (a killed relay's, which a starting relay
-- removes), and none while the server's notification queue is half full: any role may fill it,
-- and a commit whose notification finds it full fails.
-- Like the library's, it runs under the caller's search_path, so every type, function and
-- operator is named by its schema (none is left to NULLIF or IN, which look up = by the path):
-- a SET search_path clause would cost a tenth of each call.
CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueue(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
AS $$
DECLARE
    new_event bigint;
    relay_listens boolean;
    endpoint_notifies boolean;
    one_snapshot boolean;
    deliveries bigint;
    log_mode boolean;
    payload_limit integer;
    horizon interval;
BEGIN
    -- What decides the path, in one statement that reads two one-row tables: whether log mode
    -- is on (sql/log.sql), and the limits the owner set (sql/limits.sql; null, or no row: the
    -- library's defaults). Never an outbox.* setting: with no library loaded, any role may SET
    -- one. Each table read costs about 1 µs.
    SELECT s.enabled, l.max_payload_bytes, l.deliver_at_horizon
      INTO log_mode, payload_limit, horizon
      FROM @extschema@.outbox_log_state AS s LEFT JOIN @extschema@.outbox_limits AS l ON true;

    -- One expression passes the common case: no deliver_at, and a payload within the limit.
    -- Anything else is checked one by one, with the library's errors.
    IF topic IS NULL OR payload IS NULL OR deliver_at IS NOT NULL
       OR pg_catalog.octet_length(topic) OPERATOR(pg_catalog.>) 255 OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.octet_length(payload::pg_catalog.text) OPERATOR(pg_catalog.>) coalesce(payload_limit, 1048576)
       OR pg_catalog.btrim(topic) OPERATOR(pg_catalog.=) '' THEN
        DECLARE
            size bigint := pg_catalog.octet_length(payload::pg_catalog.text);
            limit_bytes bigint := coalesce(payload_limit, 1048576);
        BEGIN
            IF topic IS NULL THEN
                RAISE EXCEPTION 'outbox_enqueue: topic must not be null' USING ERRCODE = 'null_value_not_allowed';
            ELSIF pg_catalog.btrim(topic) OPERATOR(pg_catalog.=) '' THEN
                RAISE EXCEPTION 'outbox_enqueue: topic must not be empty' USING ERRCODE = 'invalid_parameter_value';
            ELSIF pg_catalog.octet_length(topic) OPERATOR(pg_catalog.>) 255 THEN
                RAISE EXCEPTION 'outbox_enqueue: topic is % bytes, more than 255', pg_catalog.octet_length(topic)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF payload IS NULL THEN
                RAISE EXCEPTION 'outbox_enqueue: payload must not be null (use ''{}'' for an event without data)'
                    USING ERRCODE = 'null_value_not_allowed';
            END IF;
            IF size OPERATOR(pg_catalog.>) limit_bytes THEN
                RAISE EXCEPTION 'outbox_enqueue: payload is % bytes of JSON text, more than outbox.max_payload_bytes (% bytes)',
                    size, limit_bytes USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255 THEN
                RAISE EXCEPTION 'outbox_enqueue: key is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF deliver_at IS NOT NULL THEN
                horizon := coalesce(horizon, interval '90 days');
                IF NOT pg_catalog.isfinite(deliver_at) THEN
                    RAISE EXCEPTION 'outbox_enqueue: deliver_at must be a finite time (null: now)' USING ERRCODE = 'invalid_parameter_value';
                ELSIF deliver_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.+) horizon) THEN
                    RAISE EXCEPTION 'outbox_enqueue: deliver_at is more than outbox.deliver_at_horizon (% s) from now',
                        pg_catalog.date_part('epoch', horizon)::bigint USING ERRCODE = 'invalid_parameter_value';
                END IF;
            END IF;
        END;
    END IF;

    -- Log mode (sql/log.sql): the event alone, into the append-only log; the relay routes it
    -- when it reads it back from the slot. An event scheduled with deliver_at takes the table
    -- path, which keeps it until it is due. The INSERT reads the mode again in its own snapshot:
    -- back in table mode, the relay lets the slot go once no snapshot that still sees log mode
    -- is left, so a write into the log must never follow a look taken in another one.
    IF outbox_enqueue.deliver_at IS NULL AND log_mode THEN
        INSERT INTO @extschema@.outbox_log (id, topic, payload, key)
        SELECT pg_catalog.nextval('@extschema@.outbox_id_seq'), outbox_enqueue.topic, outbox_enqueue.payload, outbox_enqueue.key
          FROM @extschema@.outbox_log_state AS s
         WHERE s.enabled
        RETURNING id, CASE WHEN EXISTS (SELECT FROM @extschema@.outbox_relays AS r
                         WHERE r.listening AND r.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '5 minutes'))
            THEN pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 ELSE false END
        INTO new_event, relay_listens;
        IF FOUND THEN
            IF relay_listens THEN
                PERFORM pg_catalog.pg_notify('outbox_enqueued', '');
            END IF;
            RETURN new_event;
        END IF;
    END IF;

    -- The event, and in the same statement what decides the work that follows: a plan node
    -- that reads a tiny table costs less than a statement.
    INSERT INTO @extschema@.outbox (topic, payload, key)
    VALUES (outbox_enqueue.topic, outbox_enqueue.payload, outbox_enqueue.key)
    RETURNING id,
              CASE WHEN EXISTS (SELECT FROM @extschema@.outbox_relays AS r
                         WHERE r.listening AND r.seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '5 minutes'))
            THEN pg_catalog.pg_notification_queue_usage() OPERATOR(pg_catalog.<) 0.5 ELSE false END,
              EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.notify),
              pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed'
    INTO new_event, relay_listens, endpoint_notifies, one_snapshot;

    INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, available_at, key, waiting)
    SELECT new_event, e.name, greatest(outbox_enqueue.deliver_at, pg_catalog.now()),
           CASE WHEN e.ordered THEN outbox_enqueue.key END, e.ordered AND outbox_enqueue.key IS NOT NULL
      FROM @extschema@.outbox_endpoints AS e
     WHERE e.topics OPERATOR(pg_catalog.&&) (SELECT @extschema@.outbox_topic_patterns(outbox_enqueue.topic));
    GET DIAGNOSTICS deliveries = ROW_COUNT;

    IF deliveries OPERATOR(pg_catalog.=) 0 THEN
        INSERT INTO @extschema@.outbox_unrouted (event_id, created_at) VALUES (new_event, pg_catalog.now());
    ELSIF outbox_enqueue.key IS NOT NULL OR endpoint_notifies OR one_snapshot THEN
        -- The rest reads the deliveries just written, by the primary key.
        IF outbox_enqueue.key IS NOT NULL THEN
            INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
            SELECT d.endpoint, outbox_enqueue.key
              FROM @extschema@.outbox_deliveries AS d
             WHERE d.event_id OPERATOR(pg_catalog.=) new_event AND d.waiting;
        END IF;
        IF endpoint_notifies THEN
            PERFORM pg_catalog.pg_notify('outbox.' OPERATOR(pg_catalog.||) e.name, '')
               FROM @extschema@.outbox_deliveries AS d
               JOIN @extschema@.outbox_endpoints AS e ON e.name OPERATOR(pg_catalog.=) d.endpoint
              WHERE d.event_id OPERATOR(pg_catalog.=) new_event AND e.notify;
        END IF;
        -- A transaction reading from one snapshot routed by the endpoints as they were when
        -- it began: fail if they were dropped or changed since, as
        -- sql/hold_routed_endpoints.sql does.
        IF one_snapshot THEN
            PERFORM FROM @extschema@.outbox_endpoints AS e
              WHERE e.name OPERATOR(pg_catalog.=) ANY (ARRAY(
                        SELECT d.endpoint FROM @extschema@.outbox_deliveries AS d
                         WHERE d.event_id OPERATOR(pg_catalog.=) new_event))
                FOR KEY SHARE OF e;
        END IF;
    END IF;
    IF relay_listens THEN
        PERFORM pg_catalog.pg_notify('outbox_enqueued', '');
    END IF;
    RETURN new_event;
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

-- Loads the library's settings (sql/library_settings.sql): there is no library here, and the
-- limits are read from outbox_limits instead. Declared so that both installs have the same
-- functions; nothing here calls it.
CREATE OR REPLACE FUNCTION @extschema@.outbox_load_settings()
RETURNS void
LANGUAGE sql
STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT $$;

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, jsonb, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_load_settings() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_workers() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_worker_attempts() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueued() FROM PUBLIC;
