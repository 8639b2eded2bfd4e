-- Pull endpoints: consumers in any language take their deliveries over SQL, with the lease,
-- attempts, backoff and dead state the relay workers use for webhooks. A consumer claims,
-- handles, then acknowledges (ack) or reports a failure (nack); a long job extends its lease.
--
-- Fencing: a claim returns each delivery's attempt number (its fence column), and ack, nack and
-- extend name it. Only the current claim may change a delivery: once a lease ran out and
-- another consumer claimed the delivery again, the first one's calls return false and change
-- nothing. The number never repeats for a delivery: outbox_requeue and outbox_replay give it
-- a fresh budget of attempts (the attempts column) but leave the fence to rise on.
--
-- Isolation: a pull endpoint is consumed only by the roles an operator granted it
-- (outbox_endpoint_grant) and by superusers; anyone else's claim, ack, nack or extend raises
-- SQLSTATE 42501 before it reads or changes anything.
--
-- Like the rest of the API, each function runs as the extension's owner with search_path
-- pinned to pg_catalog (see sql/api.sql); bad arguments raise SQLSTATE 22023.

-- Claims up to max_events due deliveries of a pull endpoint for lease (from now, whatever the
-- transaction's age), oldest first, in one statement: call it in autocommit. On an ordered
-- endpoint only the head of each key is due (sql/ordering.sql). Rows other
-- claimers hold are skipped, not waited for; a disabled endpoint gives nothing. A delivery
-- whose last allowed attempt ran out of lease with no ack or nack (its consumer died or
-- stalled on it every time) is made dead instead of being claimed again forever.
CREATE OR REPLACE FUNCTION @extschema@.outbox_claim(endpoint text, max_events integer DEFAULT 10, lease interval DEFAULT '30 seconds')
RETURNS TABLE (event_id bigint, topic text, payload jsonb, key text, attempt integer, created_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    target @extschema@.outbox_endpoints;
    cap integer;
    claim record;
    dead integer := 0;
BEGIN
    PERFORM @extschema@.outbox_check_consumer(outbox_claim.endpoint, 'outbox_claim');
    target := @extschema@.outbox_pull_endpoint(outbox_claim.endpoint, 'outbox_claim');
    cap := coalesce(target.max_attempts, @extschema@.outbox_max_attempts());
    IF max_events IS NULL OR max_events NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'outbox_claim: max_events must be between 1 and 1000'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.outbox_check_lease(lease, 'outbox_claim');
    IF target.disabled_at IS NOT NULL THEN
        RETURN;
    END IF;
    IF target.ordered THEN
        PERFORM @extschema@.outbox_sequence(outbox_claim.endpoint);
    END IF;
    -- The relay's claim (sql/claim.sql), with no bytes budget. It makes dead what used all
    -- its attempts (one that was nacked and waits keeps its error: the cap was lowered since).
    FOR claim IN
        SELECT c.*
          FROM @extschema@.outbox_claim_due('pull', ARRAY[outbox_claim.endpoint], ARRAY[max_events::bigint],
                                            ARRAY[extract(epoch FROM lease)::float8 * 1000], ARRAY[cap], NULL,
                                            pg_backend_pid()) AS c
         ORDER BY c.event_id
    LOOP
        IF claim.fence IS NULL THEN
            dead := dead + 1;
        ELSE
            event_id := claim.event_id;
            topic := claim.topic;
            payload := claim.payload;
            key := claim.key;
            attempt := claim.fence;
            created_at := claim.created_at;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF dead > 0 THEN
        RAISE WARNING 'outbox_ext: % deliveries of endpoint % are dead: they had used all % attempts',
              dead, outbox_claim.endpoint, cap;
    END IF;
END
$$;

-- The work of outbox_ack_batch and outbox_ack (caller: which of them, for its errors): marks
-- claimed deliveries sent, each named by its event id and the attempt its claim returned
-- (event_ids and attempts pairwise).
-- Returns the ids whose attempt is the current claim, or already sent the delivery (a
-- repeated ack is answered as the first was); the others were claimed again, nacked,
-- requeued or dropped since, and nothing of them changes.
--
-- Consumers call it for every job, so its statements are planned once per session, as the
-- relay workers plan theirs (src/worker/queue.rs): a plan for the ids of each call cost more
-- than the rest of an ack. Every statement finds its rows through an index, whatever the
-- number of ids; with table scans ruled out, no plan made while the tables were nearly
-- empty (after CREATE EXTENSION or a TRUNCATE) reads them whole once they have grown, and
-- with JIT off, no plan is compiled for the cost that ruling them out adds.
CREATE OR REPLACE FUNCTION @extschema@.outbox_ack_claims(endpoint text, event_ids bigint[], attempts integer[], caller text)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    acked bigint;
    ordered_ids bigint[];
    ordered_keys text[];
BEGIN
    PERFORM @extschema@.outbox_check_consumer(outbox_ack_claims.endpoint, caller);
    IF event_ids IS NULL OR attempts IS NULL OR cardinality(event_ids) <> cardinality(attempts) THEN
        RAISE EXCEPTION '%: event_ids and attempts must be arrays of the same length', caller
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH sent AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET sent_at = now(), claimed_by = NULL, waiting = false
          FROM unnest(outbox_ack_claims.event_ids, outbox_ack_claims.attempts) AS a (event_id, attempt)
         WHERE d.endpoint = outbox_ack_claims.endpoint
           AND d.event_id = ANY (outbox_ack_claims.event_ids)
           AND d.event_id = a.event_id
           AND d.fence = a.attempt
           AND d.claimed_by IS NOT NULL
           AND d.sent_at IS NULL
           AND d.dead_at IS NULL
           AND EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = d.endpoint AND e.kind = 'pull')
        RETURNING d.event_id, d.key
    )
    SELECT count(*), array_agg(sent.event_id) FILTER (WHERE sent.key IS NOT NULL), array_agg(sent.key) FILTER (WHERE sent.key IS NOT NULL)
      INTO acked, ordered_ids, ordered_keys
      FROM sent;
    IF acked > 0 THEN
        PERFORM @extschema@.outbox_note_acked(outbox_ack_claims.endpoint, acked);
    END IF;
    IF ordered_ids IS NOT NULL THEN
        PERFORM @extschema@.outbox_release_keys(outbox_ack_claims.endpoint, ordered_ids, ordered_keys);
    END IF;
    IF acked > 0 AND acked = cardinality(outbox_ack_claims.event_ids) THEN
        RETURN QUERY SELECT unnest(outbox_ack_claims.event_ids);
        RETURN;
    END IF;
    PERFORM @extschema@.outbox_pull_endpoint(outbox_ack_claims.endpoint, caller);
    -- OFFSET 0 keeps the test of sent_at out of the scan: it would let the planner read the
    -- partial index of every sent delivery instead of looking the ids up.
    RETURN QUERY
    SELECT DISTINCT named.event_id
      FROM (SELECT d.event_id, d.sent_at
              FROM unnest(outbox_ack_claims.event_ids, outbox_ack_claims.attempts) AS a (event_id, attempt)
              JOIN @extschema@.outbox_deliveries AS d
                ON d.endpoint = outbox_ack_claims.endpoint AND d.event_id = a.event_id AND d.fence = a.attempt
             WHERE d.event_id = ANY (outbox_ack_claims.event_ids)
            OFFSET 0) AS named
     WHERE named.sent_at IS NOT NULL;
END
$$;

-- Marks claimed deliveries sent (outbox_ack_claims above): a consumer that handled a batch
-- acks it in one call, and gets back the ids it acked.
CREATE OR REPLACE FUNCTION @extschema@.outbox_ack_batch(endpoint text, event_ids bigint[], attempts integer[])
RETURNS SETOF bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM @extschema@.outbox_ack_claims($1, $2, $3, 'outbox_ack_batch')
$$;

-- The same for one delivery: true if its attempt is the current claim (or sent the delivery).
-- PL/pgSQL, not SQL, so that its one statement is planned once per session.
CREATE OR REPLACE FUNCTION @extschema@.outbox_ack(endpoint text, event_id bigint, attempt integer)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM @extschema@.outbox_ack_claims(outbox_ack.endpoint, ARRAY[outbox_ack.event_id], ARRAY[outbox_ack.attempt], 'outbox_ack'));
END
$$;

-- Acknowledged deliveries of an endpoint, counted for outbox_stats().sent in this session's
-- shard, and the endpoint's success noted at most once a second, skipping its row if someone
-- else is changing it right now. Called by outbox_ack_claims and by the relay workers
-- (sql/mark_sent.sql), under a pinned search_path and the owner's rights.
CREATE OR REPLACE FUNCTION @extschema@.outbox_note_acked(endpoint text, acked bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO @extschema@.outbox_delivery_counts AS n (endpoint, shard, sent)
    VALUES (outbox_note_acked.endpoint, pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.%) 16, acked)
    ON CONFLICT ON CONSTRAINT outbox_delivery_counts_pkey DO UPDATE SET sent = n.sent OPERATOR(pg_catalog.+) excluded.sent;
    UPDATE @extschema@.outbox_endpoints AS e
       SET last_success_at = pg_catalog.now(), failing_since = NULL
     WHERE e.name IN (SELECT h.name
                        FROM @extschema@.outbox_endpoints AS h
                       WHERE h.name OPERATOR(pg_catalog.=) outbox_note_acked.endpoint
                         AND (h.failing_since IS NOT NULL
                              OR h.last_success_at IS NULL
                              OR h.last_success_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '1 second'))
                         FOR NO KEY UPDATE SKIP LOCKED);
END
$$;

-- Records a failed attempt of the current claim: the delivery is due again after retry_in,
-- or after the relay's backoff when null (exponential in the attempts, with jitter, at most an
-- hour, as core/src/delivery/backoff.rs computes it), or dead once attempts reached the endpoint's
-- cap (true either way). False, changing nothing, when the attempt is not the current claim.
CREATE OR REPLACE FUNCTION @extschema@.outbox_nack(endpoint text, event_id bigint, attempt integer, error text, retry_in interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    went_dead boolean;
    used integer;
    reason text := left(regexp_replace(coalesce(error, 'nacked without an error'), '[[:cntrl:]]+', ' ', 'g'), 1024);
BEGIN
    PERFORM @extschema@.outbox_check_consumer(outbox_nack.endpoint, 'outbox_nack');
    IF retry_in < interval '0' OR retry_in > interval '1 day' THEN
        RAISE EXCEPTION 'outbox_nack: retry_in must be between 0 and 1 day (null: the backoff)'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE @extschema@.outbox_deliveries AS d
       SET last_error   = reason,
           available_at = clock_timestamp() + coalesce(retry_in,
                              least(interval '1 second' * 2 ^ least(greatest(d.attempts - 1, 0), 12), interval '1 hour')
                              * (0.5 + 0.5 * random())),
           claimed_by   = NULL,
           dead_at      = CASE WHEN d.attempts >= coalesce(e.max_attempts, @extschema@.outbox_max_attempts())
                               THEN now() END
      FROM @extschema@.outbox_endpoints AS e
     WHERE e.name = d.endpoint
       AND e.kind = 'pull'
       AND d.endpoint = outbox_nack.endpoint
       AND d.event_id = outbox_nack.event_id
       AND d.fence = outbox_nack.attempt
       AND d.claimed_by IS NOT NULL
       AND d.sent_at IS NULL
       AND d.dead_at IS NULL
    RETURNING d.dead_at IS NOT NULL, d.attempts INTO went_dead, used;
    IF NOT FOUND THEN
        PERFORM @extschema@.outbox_pull_endpoint(outbox_nack.endpoint, 'outbox_nack');
        RETURN false;
    END IF;
    INSERT INTO @extschema@.outbox_attempts AS a (event_id, endpoint, attempt, error)
    VALUES (outbox_nack.event_id, outbox_nack.endpoint, outbox_nack.attempt, reason)
    ON CONFLICT DO NOTHING;
    DELETE FROM @extschema@.outbox_attempts AS a
     WHERE a.event_id = outbox_nack.event_id AND a.endpoint = outbox_nack.endpoint
       AND a.attempt <= outbox_nack.attempt - @extschema@.outbox_attempts_kept();
    UPDATE @extschema@.outbox_endpoints AS e
       SET failing_since = coalesce(e.failing_since, now()), last_error = reason
     WHERE e.name IN (SELECT h.name
                        FROM @extschema@.outbox_endpoints AS h
                       WHERE h.name = outbox_nack.endpoint
                         FOR NO KEY UPDATE SKIP LOCKED);
    IF went_dead THEN
        RAISE WARNING 'outbox_ext: the delivery of event % to endpoint % is dead after % attempts; last error: %',
              outbox_nack.event_id, outbox_nack.endpoint, used, reason;
    END IF;
    RETURN true;
END
$$;

-- Pushes the lease of the current claim to lease from now (the clock, not the transaction's
-- start), for a job that runs long. Called in the job's transaction, it takes effect when that
-- commits; from another session, at once. False, changing nothing, when the attempt is not
-- the current claim.
CREATE OR REPLACE FUNCTION @extschema@.outbox_extend(endpoint text, event_id bigint, attempt integer, lease interval)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_check_consumer(outbox_extend.endpoint, 'outbox_extend');
    PERFORM @extschema@.outbox_check_lease(lease, 'outbox_extend');
    UPDATE @extschema@.outbox_deliveries AS d
       SET available_at = clock_timestamp() + outbox_extend.lease
     WHERE d.endpoint = outbox_extend.endpoint
       AND d.event_id = outbox_extend.event_id
       AND d.fence = outbox_extend.attempt
       AND d.claimed_by IS NOT NULL
       AND d.sent_at IS NULL
       AND d.dead_at IS NULL
       AND EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = d.endpoint AND e.kind = 'pull');
    IF NOT FOUND THEN
        PERFORM @extschema@.outbox_pull_endpoint(outbox_extend.endpoint, 'outbox_extend');
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- Raises 42501 unless the session's role may consume the pull endpoint: a superuser, or a
-- member of a role granted it. Inside the SECURITY DEFINER functions above current_user is
-- the extension's owner, so the role is the one the session acts as: set by SET ROLE, else
-- the one it logged in as. For the functions above only, like outbox_note_acked.
CREATE OR REPLACE FUNCTION @extschema@.outbox_check_consumer(endpoint text, caller text)
RETURNS void
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    consumer name := coalesce(nullif(pg_catalog.current_setting('role'), 'none'), session_user);
BEGIN
    IF NOT @extschema@.outbox_may_consume(outbox_check_consumer.endpoint) THEN
        RAISE EXCEPTION '%: role % may not consume endpoint %', caller, pg_catalog.quote_ident(consumer), pg_catalog.quote_nullable(endpoint)
              USING ERRCODE = 'insufficient_privilege',
                    HINT = 'An operator grants it with outbox_endpoint_grant(endpoint, role).';
    END IF;
END
$$;

-- Whether the session's role may consume the pull endpoint: a superuser, or a member of a role
-- granted it. Inside SECURITY DEFINER functions current_user is the extension's owner, so the
-- role is the one the session acts as: set by SET ROLE, else the one it logged in as.
CREATE OR REPLACE FUNCTION @extschema@.outbox_may_consume(endpoint text)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                    WHERE r.rolname OPERATOR(pg_catalog.=) me.name AND r.rolsuper)
        OR EXISTS (SELECT FROM @extschema@.outbox_endpoint_consumers AS c
                     JOIN pg_catalog.pg_roles AS r ON r.rolname OPERATOR(pg_catalog.=) c.role
                    WHERE c.endpoint OPERATOR(pg_catalog.=) outbox_may_consume.endpoint
                      AND pg_catalog.pg_has_role(me.name, r.oid, 'MEMBER'))
      FROM (SELECT coalesce(nullif(pg_catalog.current_setting('role'), 'none'), session_user)::name AS name) AS me
$$;

-- The claims held now on the pull endpoints the session's role may consume: what a console
-- shows a consumer, with the attempt that outbox_extend and outbox_nack take. At most 1,000,
-- those whose lease ends first.
CREATE OR REPLACE FUNCTION @extschema@.outbox_leases()
RETURNS TABLE (
    endpoint text,
    event_id bigint,
    attempt integer,
    topic text,
    attempts integer,
    leased_until timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT d.endpoint, d.event_id, d.fence, o.topic, d.attempts, d.available_at
      FROM @extschema@.outbox_endpoints AS e
      JOIN @extschema@.outbox_deliveries AS d ON d.endpoint = e.name
      JOIN @extschema@.outbox AS o ON o.id = d.event_id
     WHERE e.kind = 'pull'
       AND @extschema@.outbox_may_consume(e.name)
       AND d.sent_at IS NULL AND d.dead_at IS NULL AND NOT d.waiting
       AND d.claimed_by IS NOT NULL
       AND d.available_at > now()
     ORDER BY d.available_at, d.endpoint, d.event_id
     LIMIT 1000
$$;

-- The pull endpoint's row; a class-22 error naming the caller when there is no such pull
-- endpoint. For the functions above only, like outbox_note_acked.
CREATE OR REPLACE FUNCTION @extschema@.outbox_pull_endpoint(endpoint text, caller text)
RETURNS @extschema@.outbox_endpoints
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    target @extschema@.outbox_endpoints;
BEGIN
    SELECT * INTO target FROM @extschema@.outbox_endpoints AS e WHERE e.name OPERATOR(pg_catalog.=) outbox_pull_endpoint.endpoint;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%: endpoint % does not exist', caller, pg_catalog.quote_nullable(endpoint)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF target.kind OPERATOR(pg_catalog.<>) 'pull' THEN
        RAISE EXCEPTION '%: endpoint % is a % endpoint; the relay workers deliver its events', caller, pg_catalog.quote_literal(endpoint), target.kind
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Create a pull endpoint with outbox_endpoint_set(name, NULL, topics, kind => ''pull'').';
    END IF;
    RETURN target;
END
$$;

-- A lease is positive and at most a day: a consumer that needs longer extends it. For the
-- functions above only, like outbox_note_acked.
CREATE OR REPLACE FUNCTION @extschema@.outbox_check_lease(lease interval, caller text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF lease IS NULL OR lease OPERATOR(pg_catalog.<=) interval '0' OR lease OPERATOR(pg_catalog.>) interval '1 day' THEN
        RAISE EXCEPTION '%: lease must be positive and at most 1 day', caller
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_claim(text, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_ack_claims(text, bigint[], integer[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_ack_batch(text, bigint[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_ack(text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_nack(text, bigint, integer, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_extend(text, bigint, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_pull_endpoint(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_check_consumer(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_may_consume(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_leases() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_note_acked(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_check_lease(interval, text) FROM PUBLIC;
