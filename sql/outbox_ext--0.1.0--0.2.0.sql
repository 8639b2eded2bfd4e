-- outbox_ext 0.1.0 -> 0.2.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
--
-- This is the source of sql/outbox_ext--0.1.0--0.2.0.sql: scripts/cluster.sh replaces each
-- "--@include FILE" line by sql/FILE, the text a fresh install runs, so a fresh 0.2.0 and
-- 0.1.0 updated have the same objects (src/e2e/upgrade.rs compares them).
--
-- The statements written here name every function and operator by schema: this script runs
-- as a superuser, with the extension's schema on the search_path.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- pg_dump now keeps the id sequence's position, so a restore never hands out an id again.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');

-- Functions whose arguments or results change are replaced below; privileges granted on the
-- old ones go with them (CHANGELOG.md says which GRANTs to run).
DROP FUNCTION @extschema@.outbox_enqueue(pg_catalog.text, pg_catalog.jsonb);
DROP FUNCTION @extschema@.outbox_requeue(pg_catalog.int8);
DROP FUNCTION @extschema@.outbox_stats();

-- Endpoints and deliveries (0.2.0). A fresh install runs this file after sql/schema.sql; the
-- update from 0.1.0 includes it, so both end with the same objects.

-- Where events go: one row per endpoint, kept by outbox_endpoint_set() and friends
-- (sql/endpoints.sql). The relay workers keep the health columns.
CREATE TABLE @extschema@.outbox_endpoints (
    name            text        PRIMARY KEY,
    kind            text        NOT NULL DEFAULT 'webhook',
    url             text,
    topics          text[]      NOT NULL DEFAULT '{*}',
    headers         jsonb       NOT NULL DEFAULT '{}',
    timeout         interval,
    max_attempts    integer,
    max_in_flight   integer,
    ordered         boolean     NOT NULL DEFAULT false,
    notify          boolean     NOT NULL DEFAULT false,
    failing_since   timestamptz,
    last_success_at timestamptz,
    last_error      text,
    disabled_at     timestamptz,
    disabled_reason text,
    CONSTRAINT outbox_endpoints_kind CHECK (kind IN ('webhook', 'pull'))
);

COMMENT ON TABLE @extschema@.outbox_endpoints IS 'Receivers of events; change them with outbox_endpoint_set() and the other outbox_endpoint_* functions.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.kind IS 'webhook: the relay workers POST to url; pull: consumers claim over SQL.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.url IS 'For default, null means the setting outbox.webhook_url.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.topics IS 'Patterns: a topic (order.placed), a prefix up to a dot (order.*), or * for all.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.headers IS 'Static request headers, {"name": "value"}.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.timeout IS 'Whole-request timeout; null means outbox.http_timeout.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.max_attempts IS 'Attempts before a delivery is dead; null means outbox.max_attempts.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.max_in_flight IS 'Requests in flight per relay worker; null means outbox.concurrency.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.notify IS 'Pull endpoints: NOTIFY channel "outbox.<name>" when an enqueue that routed to it commits.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.failing_since IS 'First failed attempt since the last success; null while healthy.';
COMMENT ON COLUMN @extschema@.outbox_endpoints.disabled_at IS 'Set by outbox_endpoint_disable() or after outbox.endpoint_disable_after of failures; deliveries wait.';

-- Signing secrets, apart from every table a role may be granted: only the extension's owner
-- (and superusers) can read them. An endpoint has its current secret (expires_at null) and,
-- during a rotation's grace period, the previous one.
CREATE TABLE @extschema@.outbox_endpoint_secrets (
    endpoint   text        NOT NULL,
    generation integer     NOT NULL,
    secret     text        NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (endpoint, generation)
);

COMMENT ON TABLE @extschema@.outbox_endpoint_secrets IS 'Signing secrets of the endpoints; set with outbox_endpoint_rotate_secret(). Grant it to nobody.';

-- One row per (event, endpoint): the delivery state. available_at doubles as the lease a
-- claim takes.
CREATE TABLE @extschema@.outbox_deliveries (
    event_id     bigint      NOT NULL,
    endpoint     text        NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,
    fence        integer     NOT NULL DEFAULT 0,
    sent_at      timestamptz,
    dead_at      timestamptz,
    last_error   text,
    claimed_by   integer,
    key          text,
    waiting      boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (event_id, endpoint)
);

COMMENT ON TABLE @extschema@.outbox_deliveries IS 'One row per event and endpoint it was routed to: the delivery state.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.available_at IS 'Not claimable before this; a claim pushes it forward by outbox.lease.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.attempts IS 'Claims since the delivery was created, requeued or replayed: counted against max_attempts.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.fence IS 'The latest claim''s fencing token (the attempt outbox_claim returns): raised by every claim, never lowered, so no two claims of a delivery share one.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.sent_at IS 'Set only after the receiver answered 2xx, or a pull consumer acknowledged it.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.dead_at IS 'Set when attempts reached the cap; outbox_requeue() brings the delivery back.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.last_error IS 'What the last failed attempt saw: HTTP status, timeout or connection error; or that its lease ran out with no outcome.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.key IS 'On an ordered endpoint, the event''s key; null elsewhere.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.waiting IS 'Ordered endpoints: waits for the deliveries of its key before it (see outbox_keys); not claimable meanwhile.';
COMMENT ON COLUMN @extschema@.outbox_deliveries.claimed_by IS 'Process id of the relay worker or consumer session that claimed the delivery last (see pg_stat_activity); cleared when its failure is recorded.';

-- The queue: only deliveries still to make, per endpoint in claim order. Its size tracks the
-- backlog, not the history, and every claim is served by it. Deliveries waiting for their
-- key's turn are not in it, so however many wait, a claim never reads them.
CREATE INDEX outbox_deliveries_pending ON @extschema@.outbox_deliveries (endpoint, available_at, event_id)
    WHERE sent_at IS NULL AND dead_at IS NULL AND NOT waiting;
-- Ordered endpoints: the next delivery of a key is the first here.
CREATE INDEX outbox_deliveries_waiting ON @extschema@.outbox_deliveries (endpoint, key, event_id)
    WHERE waiting;
-- Retention walks sent and dead deliveries oldest first; stats count dead ones without
-- reading history.
CREATE INDEX outbox_deliveries_sent ON @extschema@.outbox_deliveries (sent_at)
    WHERE sent_at IS NOT NULL;
CREATE INDEX outbox_deliveries_dead ON @extschema@.outbox_deliveries (dead_at)
    WHERE dead_at IS NOT NULL;

-- Events that no endpoint was subscribed to when they were enqueued (or whose endpoints were
-- dropped): kept for outbox_replay() and counted by outbox_stats(), until retention.
CREATE TABLE @extschema@.outbox_unrouted (
    event_id   bigint      PRIMARY KEY,
    created_at timestamptz NOT NULL
);

COMMENT ON TABLE @extschema@.outbox_unrouted IS 'Retained events with no delivery.';
COMMENT ON COLUMN @extschema@.outbox_unrouted.created_at IS 'The event''s created_at: retention walks this index.';

CREATE INDEX outbox_unrouted_created_at ON @extschema@.outbox_unrouted (created_at);

-- Ordered endpoints (sql/ordering.sql): one row per key that has a delivery in the queue,
-- naming the one delivery of the key that may be claimed (its head); the others wait. A head
-- stays the head while it is retried and once it is dead, which blocks the key until
-- outbox_requeue() or outbox_skip(). head is null for a moment after the head was sent and no
-- next delivery was visible: outbox_sequence() then looks again.
CREATE TABLE @extschema@.outbox_keys (
    endpoint text   NOT NULL,
    key      text   NOT NULL,
    head     bigint,
    PRIMARY KEY (endpoint, key)
);

COMMENT ON TABLE @extschema@.outbox_keys IS 'Ordered endpoints: the delivery of each key that may be claimed now.';

CREATE INDEX outbox_keys_unassigned ON @extschema@.outbox_keys (endpoint) WHERE head IS NULL;

-- One row per ordered endpoint: its sequencer (outbox_sequence) runs while holding the row's
-- lock, so one runs at a time per endpoint. Only the extension's owner can lock it: no role can
-- hold sequencing up, as it could with an advisory lock.
CREATE TABLE @extschema@.outbox_key_sequencers (
    endpoint text PRIMARY KEY
);

COMMENT ON TABLE @extschema@.outbox_key_sequencers IS 'Ordered endpoints: the row outbox_sequence() locks.';

-- Keys of ordered endpoints that got a waiting delivery (written by outbox_enqueue, requeue
-- and replay in their caller's transaction); outbox_sequence() reads and deletes them once they
-- are committed. A key the sequencer has not seen yet may have no row in outbox_keys.
CREATE TABLE @extschema@.outbox_key_arrivals (
    endpoint text NOT NULL,
    key      text NOT NULL
);

COMMENT ON TABLE @extschema@.outbox_key_arrivals IS 'Keys of ordered endpoints with new waiting deliveries, for outbox_sequence().';

CREATE INDEX outbox_key_arrivals_endpoint ON @extschema@.outbox_key_arrivals (endpoint);

-- Acknowledged deliveries, counted as they are recorded: outbox_stats() reads the sum instead
-- of the history. Each session adds to its own shard, so writers rarely wait for each other.
CREATE TABLE @extschema@.outbox_delivery_counts (
    endpoint text    NOT NULL,
    shard    integer NOT NULL,
    sent     bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, shard)
);

COMMENT ON TABLE @extschema@.outbox_delivery_counts IS 'Deliveries acknowledged since the extension was created, per endpoint.';

-- Pull endpoints: the roles that may consume each (outbox_endpoint_grant), by name: a dump
-- restored into another cluster finds them by name, and a role dropped without a revoke grants
-- nothing (until a role of that name is created again: revoke before dropping a role).
CREATE TABLE @extschema@.outbox_endpoint_consumers (
    endpoint text NOT NULL,
    role     name NOT NULL,
    PRIMARY KEY (endpoint, role)
);

COMMENT ON TABLE @extschema@.outbox_endpoint_consumers IS 'Roles that may claim, ack, nack and extend the deliveries of a pull endpoint; see outbox_endpoint_grant().';

-- Moved on by every change to an endpoint or its secrets: a worker reads the endpoints again
-- before its next claim when this differs from what it read them at.
CREATE SEQUENCE @extschema@.outbox_endpoints_version;

-- Setting only outbox.webhook_url delivers every event, as 0.1.0 did.
INSERT INTO @extschema@.outbox_endpoints (name) VALUES ('default');

-- pg_dump keeps the rows. CREATE EXTENSION makes the endpoint default again on restore, so
-- its row is left out of the dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_endpoints', 'WHERE name OPERATOR(pg_catalog.<>) ''default''');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_endpoint_secrets', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_endpoint_consumers', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_unrouted', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_delivery_counts', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_keys', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_key_arrivals', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_key_sequencers', '');

-- 0.1.0 delivered every event to one URL: its delivery state becomes the default endpoint's.
INSERT INTO @extschema@.outbox_deliveries
       (event_id, endpoint, available_at, attempts, fence, sent_at, dead_at, last_error, claimed_by)
SELECT o.id, 'default', o.available_at, o.attempts, o.attempts, o.sent_at, o.dead_at, o.last_error, o.claimed_by
  FROM @extschema@.outbox AS o;
INSERT INTO @extschema@.outbox_delivery_counts (endpoint, shard, sent)
SELECT 'default', 0, pg_catalog.count(o.sent_at)
  FROM @extschema@.outbox AS o;
-- 0.1.0 let producers INSERT into outbox; such a row would now be an event with no delivery,
-- never sent. Take those privileges back, so that a producer not yet moved to outbox_enqueue
-- fails loudly instead (CHANGELOG.md gives the GRANT that replaces them).
DO $$
DECLARE
    grantee pg_catalog.text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                             ELSE pg_catalog.quote_ident(r.rolname) END
          FROM pg_catalog.pg_class AS c
         CROSS JOIN pg_catalog.aclexplode(c.relacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.outbox'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'])
    LOOP
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON @extschema@.outbox FROM %s', grantee);
    END LOOP;
END
$$;

-- A signing secret set for 0.1.0 goes on signing the default endpoint's deliveries; the
-- setting is no longer read.
INSERT INTO @extschema@.outbox_endpoint_secrets (endpoint, generation, secret)
SELECT 'default', 1, s.secret
  FROM (SELECT pg_catalog.btrim(pg_catalog.current_setting('outbox.signing_secret', true)) AS secret) AS s
 WHERE s.secret OPERATOR(pg_catalog.<>) '';

ALTER TABLE @extschema@.outbox
    DROP COLUMN available_at,
    DROP COLUMN attempts,
    DROP COLUMN sent_at,
    DROP COLUMN dead_at,
    DROP COLUMN last_error,
    DROP COLUMN claimed_by,
    ADD COLUMN key pg_catalog.text;
COMMENT ON TABLE @extschema@.outbox IS 'Events enqueued by outbox_enqueue(); their delivery state is in outbox_deliveries.';
COMMENT ON COLUMN @extschema@.outbox.key IS 'Ordering key (e.g. the aggregate id); null means unordered.';

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
-- The user-facing functions. A fresh install runs this file last; the update from 0.1.0
-- includes it, so CREATE OR REPLACE throughout.
--
-- Privileges: every function below runs as the extension's owner (SECURITY DEFINER) with
-- search_path pinned to pg_catalog, so a role needs nothing but EXECUTE on a function to use
-- it, can do nothing through it but what it says, and nothing that role (or anyone) created
-- can run inside it. EXECUTE is granted to nobody by default: see the README's GRANT recipes.

-- Written in Rust (src/api.rs): it checks a setting and wakes the workers at commit. Its
-- statements (sql/enqueue.sql, sql/route.sql and those they name) name every object by schema
-- instead of pinning search_path, which would cost each call a settings save and restore.
CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueue(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE c
VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'enqueue_wrapper';

-- Written in Rust: reads the workers' shared memory.
CREATE OR REPLACE FUNCTION @extschema@.outbox_workers()
RETURNS TABLE (
    worker integer,
    pid integer,
    settings_loaded_at timestamptz,
    in_flight bigint,
    delivered bigint,
    failed bigint)
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_workers_wrapper';

-- Written in Rust: monitoring counters in shared memory, since the server started. Attempts
-- per relay worker and outcome class (2xx, 4xx, 5xx, other_status, timeout, unreachable);
-- events enqueued by committed transactions. See monitoring/ and the README's "Monitoring".
CREATE OR REPLACE FUNCTION @extschema@.outbox_worker_attempts()
RETURNS TABLE (
    worker integer,
    outcome text,
    attempts bigint)
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_worker_attempts_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueued()
RETURNS bigint
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_enqueued_wrapper';

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
-- health. Read from the pending, waiting and dead indexes, never the sent history.
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
    )
    SELECT e.name,
           CASE WHEN e.disabled_at IS NULL THEN coalesce(q.due, 0) ELSE 0 END,
           coalesce(b.behind, 0)
             + CASE WHEN e.disabled_at IS NULL THEN coalesce(q.later, 0) ELSE coalesce(q.due, 0) + coalesce(q.later, 0) END,
           coalesce(x.dead, 0),
           CASE WHEN e.disabled_at IS NULL THEN now() - q.oldest_due END,
           e.failing_since,
           e.disabled_at,
           coalesce(x.blocked_keys, 0) + coalesce(q.far_heads, 0)
      FROM @extschema@.outbox_endpoints AS e
      LEFT JOIN queued AS q ON q.endpoint = e.name
      LEFT JOIN behind AS b ON b.endpoint = e.name
      LEFT JOIN dead AS x ON x.endpoint = e.name
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
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, jsonb, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_workers() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_worker_attempts() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueued() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_topic_patterns(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_mark_processed(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_requeue(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_replay(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_stats() FROM PUBLIC;
-- Managing endpoints. Like the rest of the API, each function runs as the extension's owner
-- with search_path pinned to pg_catalog (see sql/api.sql), and raises SQLSTATE 22023
-- (invalid_parameter_value) for bad input, naming what is wrong but never repeating a URL or
-- a secret, which may carry credentials.

-- At most this many endpoints, and this many static headers each: every enqueue matches its
-- topic against every endpoint, and every request carries the headers.
CREATE OR REPLACE FUNCTION @extschema@.outbox_max_endpoints() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 1000';
CREATE OR REPLACE FUNCTION @extschema@.outbox_max_headers() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 32';

-- The origin of an http(s) URL, as browsers compare them: scheme, host and port (the scheme's
-- default when none is given), lowercased; null for null. For outbox_endpoint_set only.
CREATE OR REPLACE FUNCTION @extschema@.outbox_url_origin(url text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT lower(m[1]) || '://' || lower(m[2]) || ':'
           || coalesce(nullif(m[3], '')::integer, CASE lower(m[1]) WHEN 'https' THEN 443 ELSE 80 END)
      FROM regexp_match(url, '^([A-Za-z]+)://(?:[^/?#]*@)?(\[[^]]*\]|[^/?#:@]+)(?::([0-9]*))?') AS m
$$;

-- Creates or replaces an endpoint; its deliveries and health stay, and so do its secrets unless
-- its URL moves to another origin (scheme, host or port): whoever may change the URL must not
-- receive requests signed for the old receiver, which could be replayed to it. New topics
-- apply to events enqueued afterwards (outbox_replay sends older ones); so does ordered = true.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_set(
    name text,
    url text,
    topics text[] DEFAULT '{*}',
    kind text DEFAULT 'webhook',
    headers jsonb DEFAULT '{}',
    timeout interval DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    max_in_flight integer DEFAULT NULL,
    ordered boolean DEFAULT false,
    notify boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
DECLARE
    pattern text;
    header record;
    previous @extschema@.outbox_endpoints;
    was_ordered boolean;
    held boolean := false;
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'outbox_endpoint_set: an endpoint name is 1 to 63 letters, digits, "_", "." or "-", starting with a letter or digit'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind IS NULL OR kind NOT IN ('webhook', 'pull') THEN
        RAISE EXCEPTION 'outbox_endpoint_set: kind must be ''webhook'' or ''pull'', not %', quote_nullable(kind)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind = 'pull' AND url IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_endpoint_set: a pull endpoint has no url (its consumers claim with outbox_claim)'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind = 'webhook' AND url IS NULL AND name <> 'default' THEN
        RAISE EXCEPTION 'outbox_endpoint_set: a webhook endpoint needs a url'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- scheme, [userinfo@] (up to the last @), host name or [IPv6 address], [:port], [path, query,
    -- fragment]; an empty port is the scheme's.
    -- No backslash: URL parsers read it as a slash in http(s) URLs (so the host would end
    -- before it), and outbox_url_origin would not.
    IF url IS NOT NULL AND (octet_length(url) > 2048 OR strpos(url, E'\\') > 0
        OR url !~ '^https?://([^/?#[:space:][:cntrl:]]*@)?(\[[0-9A-Fa-f:.]+\]|[^][/?#:@[:space:][:cntrl:]]+)(:[0-9]{0,5})?([/?#][^[:space:][:cntrl:]]*)?$'
        OR substring(url FROM '^https?://(?:[^/?#]*@)?(?:\[[^]]*\]|[^/?#:@]+):([0-9]{1,5})(?:[/?#]|$)')::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION 'outbox_endpoint_set: url must be an http:// or https:// URL of at most 2048 bytes, with a host, a port (if any) from 1 to 65535, and without spaces or backslashes'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF topics IS NULL OR cardinality(topics) = 0 THEN
        RAISE EXCEPTION 'outbox_endpoint_set: topics must list at least one pattern (''*'' for every event)'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH pattern IN ARRAY topics LOOP
        IF pattern IS NULL OR octet_length(pattern) > 255 OR pattern !~ '^(\*|[^.*]+(\.[^.*]+)*(\.\*)?)$' THEN
            RAISE EXCEPTION 'outbox_endpoint_set: % is not a topic pattern', quote_nullable(pattern)
                  USING ERRCODE = 'invalid_parameter_value',
                        HINT = 'Use a topic (order.placed), a prefix up to a dot (order.*), or * for every topic.';
        END IF;
    END LOOP;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_endpoint_set: headers must be a JSON object of strings, like {"authorization": "Bearer ..."}'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(*) > @extschema@.outbox_max_headers() FROM jsonb_object_keys(headers)) THEN
        RAISE EXCEPTION 'outbox_endpoint_set: at most % headers', @extschema@.outbox_max_headers()
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT lower(h.key)) <> count(*) FROM jsonb_object_keys(headers) AS h (key)) THEN
        RAISE EXCEPTION 'outbox_endpoint_set: a header is named twice (header names are compared without case)'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR header IN SELECT h.key, h.value FROM jsonb_each(headers) AS h LOOP
        IF header.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]{1,64}$' THEN
            RAISE EXCEPTION 'outbox_endpoint_set: % is not an HTTP header name', quote_literal(left(header.key, 64))
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF lower(header.key) LIKE 'webhook-%'
           OR lower(header.key) IN ('content-type', 'content-length', 'transfer-encoding', 'host', 'connection', 'user-agent') THEN
            RAISE EXCEPTION 'outbox_endpoint_set: header % is set by the relay and cannot be overridden', quote_literal(header.key)
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(header.value) <> 'string' OR octet_length(header.value #>> '{}') > 4096
           OR (header.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
            RAISE EXCEPTION 'outbox_endpoint_set: the value of header % must be a string of at most 4096 bytes, without line breaks or control characters', quote_literal(header.key)
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    -- The bounds of outbox.http_timeout.
    IF timeout < interval '10 milliseconds' OR timeout > interval '1 hour' THEN
        RAISE EXCEPTION 'outbox_endpoint_set: timeout must be from 10 milliseconds to 1 hour'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'outbox_endpoint_set: max_attempts must be between 1 and 1000'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_in_flight NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'outbox_endpoint_set: max_in_flight must be between 1 and 1000'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- default is re-created as a webhook by a restore (it is left out of dumps).
    IF kind = 'pull' AND name = 'default' THEN
        RAISE EXCEPTION 'outbox_endpoint_set: default is the webhook endpoint of outbox.webhook_url; give a pull endpoint a name of its own'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF kind = 'pull' AND (headers <> '{}' OR timeout IS NOT NULL OR max_in_flight IS NOT NULL) THEN
        RAISE EXCEPTION 'outbox_endpoint_set: headers, timeout and max_in_flight are for webhook requests; a pull endpoint''s consumers choose their lease and batch in outbox_claim'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notify IS NULL OR (notify AND kind <> 'pull') THEN
        RAISE EXCEPTION 'outbox_endpoint_set: notify is true or false, and only a pull endpoint notifies (the relay workers are woken anyway)'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Its channel, "outbox.<name>", must fit in a NOTIFY channel name (63 bytes).
    IF notify AND octet_length(name) > 56 THEN
        RAISE EXCEPTION 'outbox_endpoint_set: the name of an endpoint that notifies is at most 56 bytes (its channel is "outbox.<name>")'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ordered IS NULL THEN
        RAISE EXCEPTION 'outbox_endpoint_set: ordered is true or false'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Turning ordered off, as outbox_endpoint_drop does: wait for the enqueues in progress
    -- (they may be writing deliveries that wait for their key) and hold new ones until this
    -- commits. The table before the endpoint's row, as every writer of both takes them: an
    -- enqueue in a REPEATABLE READ transaction locks the rows of the endpoints it routed to.
    SELECT e.ordered INTO was_ordered FROM @extschema@.outbox_endpoints AS e WHERE e.name = outbox_endpoint_set.name;
    IF was_ordered AND NOT ordered THEN
        PERFORM @extschema@.outbox_hold_deliveries('outbox_endpoint_set');
        held := true;
    END IF;
    -- The row of an endpoint that exists, locked for the change (within the lock_timeout).
    previous := @extschema@.outbox_endpoint_lock(name, 'outbox_endpoint_set', must_exist => false);
    was_ordered := previous.ordered;
    IF previous.name IS NULL AND (SELECT count(*) >= @extschema@.outbox_max_endpoints() FROM @extschema@.outbox_endpoints) THEN
        RAISE EXCEPTION 'outbox_endpoint_set: there are already % endpoints, the most there may be', @extschema@.outbox_max_endpoints()
              USING ERRCODE = 'program_limit_exceeded',
                    HINT = 'Drop endpoints no longer used, or route several topics to one endpoint.';
    END IF;
    IF was_ordered AND NOT ordered AND NOT held THEN
        -- Made ordered by someone else meanwhile: taking the table now would reverse the order
        -- above (and could deadlock with outbox_replay, which takes them in that order).
        RAISE EXCEPTION 'outbox_endpoint_set: endpoint % was made ordered while this ran; try again', quote_literal(name)
              USING ERRCODE = 'serialization_failure';
    END IF;
    INSERT INTO @extschema@.outbox_endpoints AS e
           (name, kind, url, topics, headers, timeout, max_attempts, max_in_flight, ordered, notify)
    VALUES (name, kind, url, topics, headers, timeout, max_attempts, max_in_flight, ordered, notify)
    ON CONFLICT ON CONSTRAINT outbox_endpoints_pkey DO UPDATE
       SET kind = excluded.kind, url = excluded.url, topics = excluded.topics,
           headers = excluded.headers, timeout = excluded.timeout,
           max_attempts = excluded.max_attempts, max_in_flight = excluded.max_in_flight,
           ordered = excluded.ordered, notify = excluded.notify;
    IF ordered THEN
        INSERT INTO @extschema@.outbox_key_sequencers (endpoint) VALUES (outbox_endpoint_set.name)
        ON CONFLICT DO NOTHING;
    ELSIF was_ordered THEN
        -- No longer ordered: whatever waited for its key is due now.
        PERFORM @extschema@.outbox_unorder(outbox_endpoint_set.name);
    END IF;
    IF previous.name IS NOT NULL
       AND @extschema@.outbox_url_origin(previous.url) IS DISTINCT FROM @extschema@.outbox_url_origin(url) THEN
        DELETE FROM @extschema@.outbox_endpoint_secrets AS s WHERE s.endpoint = outbox_endpoint_set.name;
        IF FOUND THEN
            RAISE NOTICE 'outbox_endpoint_set: endpoint % moved to another origin, so its signing secrets were discarded', quote_literal(name)
                  USING HINT = 'Sign again with outbox_endpoint_rotate_secret(name), and give the new receiver the secret it returns.';
        END IF;
    END IF;
    IF kind <> 'pull' THEN
        DELETE FROM @extschema@.outbox_endpoint_consumers AS c WHERE c.endpoint = outbox_endpoint_set.name;
    END IF;
    PERFORM nextval('@extschema@.outbox_endpoints_version');
END
$$;

-- Waits for the transactions writing deliveries (enqueues, claims, acks) to end and holds new
-- ones until the caller commits. Its callers (outbox_endpoint_drop and _set) wait 2 s at most
-- for any lock (lock_timeout): while this waits, and while they wait holding it, every new
-- writer queues behind them, so a producer's transaction left open must not stall the whole
-- outbox. Nothing is changed then, and the caller is told to try again.
CREATE OR REPLACE FUNCTION @extschema@.outbox_hold_deliveries(caller text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE @extschema@.outbox_deliveries IN SHARE ROW EXCLUSIVE MODE;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION '%: waited 2 s for the transactions writing deliveries to end; nothing was changed', caller
          USING ERRCODE = 'lock_not_available',
                HINT = 'Try again. A transaction that enqueued and was left open holds it up: see pg_stat_activity (state ''idle in transaction'').';
END
$$;

-- The endpoint's row, locked for a change, and the workers told to read the endpoints again
-- before their next claim; a class-22 error when there is none (a row of nulls if must_exist
-- is false). FOR UPDATE: an enqueue whose REPEATABLE READ snapshot predates the change then
-- fails (sql/hold_routed_endpoints.sql).
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_lock(name text, caller text, must_exist boolean DEFAULT true)
RETURNS @extschema@.outbox_endpoints
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    endpoint @extschema@.outbox_endpoints;
BEGIN
    BEGIN
        SELECT * INTO endpoint FROM @extschema@.outbox_endpoints AS e WHERE e.name = outbox_endpoint_lock.name FOR UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        -- Under the lock_timeout of outbox_endpoint_drop or _set (or the caller's own).
        RAISE EXCEPTION '%: waited % for a transaction changing endpoint % to end; nothing was changed',
                        caller, current_setting('lock_timeout'), quote_literal(name)
              USING ERRCODE = 'lock_not_available',
                    HINT = 'Try again. See pg_stat_activity for a transaction left open (state ''idle in transaction'').';
    END;
    IF NOT FOUND AND must_exist THEN
        RAISE EXCEPTION '%: endpoint % does not exist', caller, quote_nullable(name)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM nextval('@extschema@.outbox_endpoints_version');
    RETURN endpoint;
END
$$;

-- Sets a new signing secret (generated when null) and returns it. The previous secret keeps
-- signing too, as a second v1 signature, until grace has passed; any older one is deleted.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_rotate_secret(name text, secret text DEFAULT NULL, grace interval DEFAULT '24 hours')
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    endpoint @extschema@.outbox_endpoints := @extschema@.outbox_endpoint_lock(name, 'outbox_endpoint_rotate_secret');
    key bytea;
BEGIN
    IF endpoint.kind <> 'webhook' THEN
        RAISE EXCEPTION 'outbox_endpoint_rotate_secret: endpoint % is a % endpoint; only webhooks are signed', quote_literal(name), endpoint.kind
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF grace IS NULL OR grace < interval '0' THEN
        RAISE EXCEPTION 'outbox_endpoint_rotate_secret: grace must be zero or positive, not %', quote_nullable(grace)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF secret IS NULL THEN
        -- 32 bytes from PostgreSQL's strong random source (gen_random_uuid), through SHA-256.
        secret := 'whsec_' || encode(sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())), 'base64');
    END IF;
    IF secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$' THEN
        key := decode(substr(secret, 7), 'base64');
    END IF;
    -- Canonical base64 only (it encodes back to the same text), as the workers decode it.
    IF key IS NULL OR replace(encode(key, 'base64'), E'\n', '') <> substr(secret, 7)
       OR octet_length(key) NOT BETWEEN 24 AND 64 THEN
        RAISE EXCEPTION 'outbox_endpoint_rotate_secret: a secret is "whsec_" followed by the base64 of 24 to 64 bytes'
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Pass null to have one generated.';
    END IF;

    DELETE FROM @extschema@.outbox_endpoint_secrets AS s
     WHERE s.endpoint = endpoint.name AND s.expires_at IS NOT NULL;
    UPDATE @extschema@.outbox_endpoint_secrets AS s
       SET expires_at = now() + grace
     WHERE s.endpoint = endpoint.name;
    INSERT INTO @extschema@.outbox_endpoint_secrets (endpoint, generation, secret)
    SELECT endpoint.name, coalesce(max(s.generation), 0) + 1, secret
      FROM @extschema@.outbox_endpoint_secrets AS s
     WHERE s.endpoint = endpoint.name;
    RETURN secret;
END
$$;

-- Stops deliveries to an endpoint: they wait, neither attempted nor dead.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_disable(name text, reason text DEFAULT 'disabled by an operator')
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_endpoint_lock(name, 'outbox_endpoint_disable');
    UPDATE @extschema@.outbox_endpoints AS e
       SET disabled_at = coalesce(e.disabled_at, now()), disabled_reason = coalesce(reason, 'disabled by an operator')
     WHERE e.name = outbox_endpoint_disable.name;
END
$$;

-- Resumes an endpoint: its health starts afresh and the deliveries that were backing off are
-- due at once. Scheduled ones (deliver_at, never attempted) keep their time, and one a worker
-- holds (claimed_by set until a failure is recorded) keeps its lease: it may be in flight.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_enable(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_endpoint_lock(name, 'outbox_endpoint_enable');
    UPDATE @extschema@.outbox_endpoints AS e
       SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL
     WHERE e.name = outbox_endpoint_enable.name;
    UPDATE @extschema@.outbox_deliveries AS d
       SET available_at = now()
     WHERE d.endpoint = outbox_endpoint_enable.name
       AND d.sent_at IS NULL AND d.dead_at IS NULL AND NOT d.waiting
       AND d.attempts > 0 AND d.claimed_by IS NULL AND d.available_at > now();
END
$$;

-- Removes an endpoint with its secrets and deliveries. Events left with no delivery are kept
-- as unrouted until retention.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_drop(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
BEGIN
    -- Waits for the enqueues in progress (which may be routing to this endpoint) and holds
    -- new ones until this commits: no delivery is left behind for an endpoint that is gone.
    -- Before the endpoint's row, as outbox_endpoint_set takes them.
    PERFORM @extschema@.outbox_hold_deliveries('outbox_endpoint_drop');
    PERFORM @extschema@.outbox_endpoint_lock(name, 'outbox_endpoint_drop');
    WITH dropped AS (
        DELETE FROM @extschema@.outbox_deliveries AS d
         WHERE d.endpoint = outbox_endpoint_drop.name
        RETURNING d.event_id
    )
    INSERT INTO @extschema@.outbox_unrouted (event_id, created_at)
    SELECT dropped.event_id, o.created_at
      FROM dropped
      JOIN @extschema@.outbox AS o ON o.id = dropped.event_id
     WHERE NOT EXISTS (SELECT FROM @extschema@.outbox_deliveries AS other
                        WHERE other.event_id = dropped.event_id
                          AND other.endpoint <> outbox_endpoint_drop.name)
    ON CONFLICT DO NOTHING;
    PERFORM @extschema@.outbox_unorder(outbox_endpoint_drop.name);
    DELETE FROM @extschema@.outbox_endpoint_secrets AS s WHERE s.endpoint = outbox_endpoint_drop.name;
    DELETE FROM @extschema@.outbox_endpoint_consumers AS c WHERE c.endpoint = outbox_endpoint_drop.name;
    DELETE FROM @extschema@.outbox_endpoints AS e WHERE e.name = outbox_endpoint_drop.name;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_set(text, text, text[], text, jsonb, interval, integer, integer, boolean, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_lock(text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_hold_deliveries(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_rotate_secret(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_disable(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_enable(text) FROM PUBLIC;
-- Lets a role, and every member of it, consume a pull endpoint: claim, ack, nack and extend
-- its deliveries (sql/pull.sql). No role may until one is granted it, superusers aside.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_grant(endpoint text, role regrole)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (@extschema@.outbox_endpoint_lock(endpoint, 'outbox_endpoint_grant')).kind <> 'pull' THEN
        RAISE EXCEPTION 'outbox_endpoint_grant: endpoint % is a webhook endpoint; only pull endpoints are consumed by roles', quote_literal(endpoint)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF role IS NULL THEN
        RAISE EXCEPTION 'outbox_endpoint_grant: role must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO @extschema@.outbox_endpoint_consumers (endpoint, role)
    SELECT outbox_endpoint_grant.endpoint, r.rolname FROM pg_roles AS r WHERE r.oid = outbox_endpoint_grant.role
    ON CONFLICT DO NOTHING;
END
$$;

-- Takes a pull endpoint back from a role: its members' next claim, ack, nack or extend is
-- refused (42501), unless another role they belong to was granted it. Claims it holds keep
-- their leases and come back to the queue when those run out.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoint_revoke(endpoint text, role regrole)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_endpoint_lock(endpoint, 'outbox_endpoint_revoke');
    DELETE FROM @extschema@.outbox_endpoint_consumers AS c
     WHERE c.endpoint = outbox_endpoint_revoke.endpoint
       AND c.role = (SELECT r.rolname FROM pg_roles AS r WHERE r.oid = outbox_endpoint_revoke.role);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_drop(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_grant(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_endpoint_revoke(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_url_origin(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_max_endpoints() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_max_headers() FROM PUBLIC;
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
    due tid[];
    at_cap integer;
BEGIN
    PERFORM @extschema@.outbox_check_consumer(outbox_claim.endpoint, 'outbox_claim');
    target := @extschema@.outbox_pull_endpoint(outbox_claim.endpoint, 'outbox_claim');
    cap := coalesce(target.max_attempts, nullif(current_setting('outbox.max_attempts', true), '')::integer, 10);
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
    -- The due deliveries, locked for this transaction, by their addresses (a TID scan below:
    -- the planner cannot know how few they are), as sql/claim_batch.sql does.
    SELECT array_agg(c.ctid), count(*) FILTER (WHERE c.attempts >= cap)
      INTO due, at_cap
      FROM (SELECT d.ctid, d.attempts
              FROM @extschema@.outbox_deliveries AS d
             WHERE d.endpoint = outbox_claim.endpoint
               AND d.sent_at IS NULL
               AND d.dead_at IS NULL
               AND NOT d.waiting
               AND d.available_at <= now()
             ORDER BY d.available_at, d.event_id
             LIMIT max_events
               FOR UPDATE SKIP LOCKED) AS c;
    IF at_cap > 0 THEN
        -- (One that was nacked and waits keeps its error: the endpoint's cap was lowered since.)
        UPDATE @extschema@.outbox_deliveries AS d
           SET dead_at = now(), claimed_by = NULL,
               last_error = CASE WHEN d.claimed_by IS NULL THEN d.last_error
                                 ELSE 'the lease of attempt ' || d.attempts || ' ran out with no ack or nack' END
         WHERE d.ctid = ANY (due)
           AND d.attempts >= cap;
        RAISE WARNING 'outbox_ext: % deliveries of endpoint % are dead: they had used all % attempts',
              at_cap, outbox_claim.endpoint, cap;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE @extschema@.outbox_deliveries AS d
           SET attempts     = d.attempts + 1,
               fence        = d.fence + 1,
               available_at = clock_timestamp() + outbox_claim.lease,
               claimed_by   = pg_backend_pid()
         WHERE d.ctid = ANY (due)
           AND d.attempts < cap
        RETURNING d.event_id, d.fence
    )
    SELECT c.event_id, o.topic, o.payload, o.key, c.fence, o.created_at
      FROM claimed AS c
      JOIN @extschema@.outbox AS o ON o.id = c.event_id
     ORDER BY c.event_id;
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
-- hour, as src/delivery/backoff.rs computes it), or dead once attempts reached the endpoint's
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
           dead_at      = CASE WHEN d.attempts >= coalesce(e.max_attempts,
                                                           nullif(current_setting('outbox.max_attempts', true), '')::integer,
                                                           10)
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
    IF NOT EXISTS (SELECT FROM @extschema@.outbox_endpoint_consumers AS c
                     JOIN pg_catalog.pg_roles AS r ON r.rolname OPERATOR(pg_catalog.=) c.role
                    WHERE c.endpoint OPERATOR(pg_catalog.=) outbox_check_consumer.endpoint
                      AND pg_catalog.pg_has_role(consumer, r.oid, 'MEMBER'))
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) consumer AND r.rolsuper) THEN
        RAISE EXCEPTION '%: role % may not consume endpoint %', caller, pg_catalog.quote_ident(consumer), pg_catalog.quote_nullable(endpoint)
              USING ERRCODE = 'insufficient_privilege',
                    HINT = 'An operator grants it with outbox_endpoint_grant(endpoint, role).';
    END IF;
END
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
REVOKE ALL ON FUNCTION @extschema@.outbox_note_acked(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_check_lease(interval, text) FROM PUBLIC;
