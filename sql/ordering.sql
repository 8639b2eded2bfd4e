-- Ordered endpoints: per-key FIFO. On an endpoint with ordered = true, outbox_enqueue writes
-- each delivery of an event with a key as waiting (outside the pending index, so no claim
-- reads it) and notes its key in outbox_key_arrivals. outbox_keys names, per key, the one
-- delivery that may be claimed: its head. The head moves on when it is sent (or skipped), to
-- the key's first waiting delivery by event id; until then the others wait, however often the
-- head is retried, and a dead head keeps its key blocked.
--
-- Two places move heads, and neither ever waits for the other:
-- * outbox_release_keys, in the transaction that records a head as sent (a relay worker's
--   acknowledgement or a consumer's ack), which holds the key's row until it commits;
-- * outbox_sequence, run before each claim of an ordered endpoint, for keys that have no head
--   yet: new keys, and keys whose head was sent before the next delivery was committed.

-- Gives every key of the endpoint that needs one a head: first the keys that got waiting
-- deliveries since the last pass, then every key without a head (its first waiting delivery
-- becomes the head; a key with none left loses its row), at most 10,000 of each per call. One
-- sequencer per endpoint runs at a time (it locks the endpoint's row of outbox_key_sequencers);
-- a caller that finds another at work returns at once (0). So does one that would wait for a
-- row lock (a delivery someone holds in an open transaction): the next call tries again, and
-- the caller's claim goes on meanwhile. Returns the deliveries it made claimable. Called by the
-- relay workers and outbox_claim.
CREATE OR REPLACE FUNCTION @extschema@.outbox_sequence(endpoint text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms'
AS $$
DECLARE
    promoted integer;
BEGIN
    PERFORM FROM @extschema@.outbox_key_sequencers AS s
      WHERE s.endpoint = outbox_sequence.endpoint
        FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH arrived AS (
        DELETE FROM @extschema@.outbox_key_arrivals AS a
         WHERE a.ctid = ANY (ARRAY(SELECT x.ctid
                                     FROM @extschema@.outbox_key_arrivals AS x
                                    WHERE x.endpoint = outbox_sequence.endpoint
                                    LIMIT 10000))
        RETURNING a.key
    )
    INSERT INTO @extschema@.outbox_keys (endpoint, key)
    SELECT DISTINCT outbox_sequence.endpoint, arrived.key
      FROM arrived
     WHERE NOT EXISTS (SELECT FROM @extschema@.outbox_keys AS k
                        WHERE k.endpoint = outbox_sequence.endpoint AND k.key = arrived.key);
    -- Rows a transaction is releasing right now are skipped: it gives them their next head.
    WITH unassigned AS (
        SELECT k.key,
               (SELECT min(d.event_id)
                  FROM @extschema@.outbox_deliveries AS d
                 WHERE d.endpoint = outbox_sequence.endpoint AND d.key = k.key AND d.waiting
                   AND d.sent_at IS NULL AND d.dead_at IS NULL) AS head
          FROM @extschema@.outbox_keys AS k
         WHERE k.endpoint = outbox_sequence.endpoint AND k.head IS NULL
         LIMIT 10000
           FOR UPDATE SKIP LOCKED
    ), assigned AS (
        UPDATE @extschema@.outbox_keys AS k
           SET head = u.head
          FROM unassigned AS u
         WHERE k.endpoint = outbox_sequence.endpoint AND k.key = u.key AND u.head IS NOT NULL
    ), emptied AS (
        DELETE FROM @extschema@.outbox_keys AS k
         USING unassigned AS u
         WHERE k.endpoint = outbox_sequence.endpoint AND k.key = u.key AND u.head IS NULL
    ), claimable AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET waiting = false
          FROM unassigned AS u
         WHERE d.endpoint = outbox_sequence.endpoint AND d.event_id = u.head AND d.waiting
        RETURNING 1
    )
    SELECT count(*) INTO promoted FROM claimable;
    RETURN promoted;
EXCEPTION WHEN lock_not_available THEN
    RETURN 0;
END
$$;

-- Moves on the keys whose heads were just sent or skipped (event_ids and keys pairwise): the
-- next waiting delivery of each becomes claimable when this transaction commits. One not
-- committed yet is found by outbox_sequence later (head is left null for it). Deliveries that
-- are not their key's head change nothing. Returns how many deliveries it made claimable.
-- Called in the acknowledging transaction (by sql/mark_sent.sql, outbox_ack_claims and
-- outbox_skip).
CREATE OR REPLACE FUNCTION @extschema@.outbox_release_keys(endpoint text, event_ids bigint[], keys text[])
RETURNS integer
LANGUAGE sql
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    WITH released AS (
        SELECT k.key,
               k.head,
               (SELECT min(d.event_id)
                  FROM @extschema@.outbox_deliveries AS d
                 WHERE d.endpoint = $1 AND d.key = k.key AND d.waiting
                   AND d.sent_at IS NULL AND d.dead_at IS NULL) AS next
          FROM unnest($2, $3) AS r (event_id, key)
          JOIN @extschema@.outbox_keys AS k
            ON k.endpoint = $1 AND k.key = r.key AND k.head = r.event_id
    ), moved AS (
        UPDATE @extschema@.outbox_keys AS k
           SET head = released.next
          FROM released
         WHERE k.endpoint = $1 AND k.key = released.key AND k.head = released.head
    ), claimable AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET waiting = false
          FROM released
         WHERE d.endpoint = $1 AND d.event_id = released.next AND d.waiting
        RETURNING 1
    )
    SELECT count(*)::integer FROM claimable
$$;

-- Unblocks a key whose head is dead: the delivery stays dead (outbox_requeue can still bring
-- it back; its last_error says it was skipped) and the key's next delivery goes. True when the
-- delivery was its key's head; false when it blocked nothing (not ordered, or skipped before).
CREATE OR REPLACE FUNCTION @extschema@.outbox_skip(endpoint text, event_id bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    skipped @extschema@.outbox_deliveries;
BEGIN
    IF event_id IS NULL OR endpoint IS NULL THEN
        RAISE EXCEPTION 'outbox_skip: event_id and endpoint must not be null'
              USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO skipped
      FROM @extschema@.outbox_deliveries AS d
     WHERE d.endpoint = outbox_skip.endpoint AND d.event_id = outbox_skip.event_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_skip: event % has no delivery to endpoint %', event_id, quote_nullable(endpoint)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF skipped.dead_at IS NULL THEN
        RAISE EXCEPTION 'outbox_skip: the delivery of event % to endpoint % is not dead', event_id, quote_literal(endpoint)
              USING ERRCODE = 'object_not_in_prerequisite_state',
                    HINT = 'Only a dead delivery is skipped; one still pending goes on being retried.';
    END IF;
    IF skipped.key IS NULL OR NOT EXISTS (SELECT FROM @extschema@.outbox_keys AS k
                                           WHERE k.endpoint = skipped.endpoint AND k.key = skipped.key
                                             AND k.head = skipped.event_id) THEN
        RETURN false;
    END IF;
    UPDATE @extschema@.outbox_deliveries AS d
       SET last_error = left('skipped by outbox_skip; ' || coalesce(d.last_error, ''), 1024)
     WHERE d.endpoint = skipped.endpoint AND d.event_id = skipped.event_id;
    PERFORM @extschema@.outbox_release_keys(skipped.endpoint, ARRAY[skipped.event_id], ARRAY[skipped.key]);
    RETURN true;
END
$$;

-- Whether a delivery put back in the queue (by outbox_requeue or outbox_replay) waits for its
-- key's turn: it has a key, its endpoint is ordered, and it is not its key's head (a dead head
-- requeued is retried at once, still ahead of the rest of its key).
-- VOLATILE: called for a row the caller's UPDATE may have waited to lock, it must read
-- outbox_keys as committed now, not as the statement began (a head may have moved meanwhile).
CREATE OR REPLACE FUNCTION @extschema@.outbox_waits_for_key(endpoint text, key text, event_id bigint)
RETURNS boolean
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT $2 IS NOT NULL
       AND EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = $1 AND e.ordered)
       AND NOT EXISTS (SELECT FROM @extschema@.outbox_keys AS k WHERE k.endpoint = $1 AND k.key = $2 AND k.head = $3)
$$;

-- Forgets an endpoint's keys: its waiting deliveries become claimable. For
-- outbox_endpoint_set (ordered turned off) and outbox_endpoint_drop, which first lock
-- outbox_deliveries against enqueues, so that none still in progress leaves a delivery waiting.
CREATE OR REPLACE FUNCTION @extschema@.outbox_unorder(endpoint text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM @extschema@.outbox_key_sequencers AS s WHERE s.endpoint = $1;
    DELETE FROM @extschema@.outbox_keys AS k WHERE k.endpoint = $1;
    DELETE FROM @extschema@.outbox_key_arrivals AS a WHERE a.endpoint = $1;
    UPDATE @extschema@.outbox_deliveries AS d SET waiting = false WHERE d.endpoint = $1 AND d.waiting;
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_sequence(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_unorder(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_waits_for_key(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_release_keys(text, bigint[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_skip(text, bigint) FROM PUBLIC;
