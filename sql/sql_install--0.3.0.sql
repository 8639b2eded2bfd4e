-- outbox_ext schema. Objects live in the extension's schema (CREATE EXTENSION ... SCHEMA x).

-- The relay sends payloads as UTF-8 JSON and reads every text it sends as UTF-8: in a database
-- of another encoding it would stop at the first event with a non-ASCII character.
DO $$
BEGIN
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'outbox_ext needs a database whose encoding is UTF8; this one is %', pg_catalog.getdatabaseencoding()
              USING ERRCODE = 'feature_not_supported',
                    HINT = 'Install it in a database created with ENCODING ''UTF8''.';
    END IF;
END
$$;


-- One row per event, written once by outbox_enqueue(). Where it goes and how far it got is in
-- outbox_deliveries (sql/deliveries.sql).
CREATE TABLE outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic      text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    key        text
);


COMMENT ON TABLE outbox IS 'Events enqueued by outbox_enqueue(); their delivery state is in outbox_deliveries.';

COMMENT ON COLUMN outbox.key IS 'Ordering key (e.g. the aggregate id); null means unordered.';


-- Events searched by time (the console's window on created_at): a BRIN index, a few pages for
-- millions of events, which costs an enqueue next to nothing since events arrive in time order.
CREATE INDEX outbox_created_at ON outbox USING brin (created_at);


-- Consumer-side deduplication: a consumer records each event id it applied.
CREATE TABLE processed_events (
    consumer     text        NOT NULL DEFAULT 'default',
    event_id     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);


COMMENT ON TABLE processed_events IS 'Event ids consumers have applied; see outbox_mark_processed().';


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


-- The history of failed attempts, for an operator asking why a delivery is dead or late: one
-- row per failed attempt (a relay's request that got no 2xx, or a consumer's nack), the last
-- ten claims of each delivery, gone with the delivery. A successful attempt writes nothing here.
CREATE TABLE @extschema@.outbox_attempts (
    event_id    bigint      NOT NULL,
    endpoint    text        NOT NULL,
    attempt     integer     NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT now(),
    status      integer,
    duration_ms double precision,
    error       text        NOT NULL,
    response    text,
    PRIMARY KEY (event_id, endpoint, attempt),
    FOREIGN KEY (event_id, endpoint) REFERENCES @extschema@.outbox_deliveries (event_id, endpoint) ON DELETE CASCADE
);


COMMENT ON TABLE @extschema@.outbox_attempts IS 'Failed attempts of each delivery (its last ten claims): when, the HTTP status, how long, the error and the start of the response.';

COMMENT ON COLUMN @extschema@.outbox_attempts.attempt IS 'The claim''s fencing token (outbox_deliveries.fence).';

COMMENT ON COLUMN @extschema@.outbox_attempts.status IS 'The receiver''s HTTP status; null when there was no answer (timeout, connection error) or for a nack.';

COMMENT ON COLUMN @extschema@.outbox_attempts.response IS 'The first kilobyte of the receiver''s answer, as text.';


-- The overview counts failures per minute over the last hour.
CREATE INDEX outbox_attempts_failed_at ON @extschema@.outbox_attempts (failed_at);


-- How many claims of a delivery the history keeps.
CREATE OR REPLACE FUNCTION @extschema@.outbox_attempts_kept() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 10';

REVOKE ALL ON FUNCTION @extschema@.outbox_attempts_kept() FROM PUBLIC;


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


-- Moved on by every change to an endpoint or its secrets, in the change's own transaction
-- (outbox_endpoints_changed): a worker reads the endpoints again before its next claim when
-- this differs from what it read them at. A row, not a sequence: a sequence moves before the
-- change commits, so a worker could read the new number with the old endpoints, and then
-- sign with a secret already rotated away. One row at most; none (after a restore, which
-- leaves it out) reads as 0.
CREATE TABLE @extschema@.outbox_endpoints_version (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    version bigint  NOT NULL
);


COMMENT ON TABLE @extschema@.outbox_endpoints_version IS 'Moved on by every change to an endpoint, as it commits: the relay reads the endpoints again when it differs.';


-- Managing endpoints. Like the rest of the API, each function runs as the extension's owner
-- with search_path pinned to pg_catalog (see sql/api.sql), and raises SQLSTATE 22023
-- (invalid_parameter_value) for bad input, naming what is wrong but never repeating a URL or
-- a secret, which may carry credentials.

-- At most this many endpoints, and this many static headers each: every enqueue matches its
-- topic against every endpoint, and every request carries the headers.
CREATE OR REPLACE FUNCTION @extschema@.outbox_max_endpoints() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 1000';

CREATE OR REPLACE FUNCTION @extschema@.outbox_max_headers() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 32';


-- Tells the workers the endpoints changed: they read them again before their next claim. Run
-- in the change's transaction, whose commit makes it visible with the change.
CREATE OR REPLACE FUNCTION @extschema@.outbox_endpoints_changed()
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO @extschema@.outbox_endpoints_version AS v (one, version) VALUES (true, 1)
    ON CONFLICT (one) DO UPDATE SET version = v.version + 1
$$;


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
    PERFORM @extschema@.outbox_endpoints_changed();
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

REVOKE ALL ON FUNCTION @extschema@.outbox_endpoints_changed() FROM PUBLIC;

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


-- The limits the outbox's functions enforce on callers (outbox.max_payload_bytes,
-- outbox.deliver_at_horizon, outbox.max_attempts), read from where no caller can change them.
-- The extension's library defines them as settings only a superuser sets (src/settings.rs).
-- Without the library, as on the SQL install, an outbox.* name is a placeholder any role may
-- SET in its session, so the SQL install reads its limits from this table instead, which only
-- its owner writes (outbox_limit_set). No row, or a null, is the library's default.
CREATE TABLE @extschema@.outbox_limits (
    one                boolean  PRIMARY KEY DEFAULT true CHECK (one),
    max_payload_bytes  integer  CHECK (max_payload_bytes > 0),
    deliver_at_horizon interval CHECK (deliver_at_horizon BETWEEN interval '1 second' AND interval '2147483647 seconds'),
    max_attempts       integer  CHECK (max_attempts BETWEEN 1 AND 1000)
);


COMMENT ON TABLE @extschema@.outbox_limits IS 'The SQL install''s limits, set by its owner with outbox_limit_set(); null is the default. Where the extension is installed, its settings are the limits and this table is not read.';


-- Whether this is the extension's install, whose library's settings are the limits.
CREATE OR REPLACE FUNCTION @extschema@.outbox_installed_as_extension()
RETURNS boolean
LANGUAGE sql
STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT FROM pg_extension AS x WHERE x.extname = 'outbox_ext') $$;


-- The attempts a delivery gets when its endpoint sets none: outbox_claim and outbox_nack
-- (sql/pull.sql) and the relay's read of the endpoints (sql/load_endpoints.sql) cap by it.
-- On the extension's install the library is loaded first (sql/library_settings.sql): without
-- shared_preload_libraries, the setting may still be a placeholder the caller SET.
CREATE OR REPLACE FUNCTION @extschema@.outbox_max_attempts()
RETURNS integer
LANGUAGE plpgsql
STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF @extschema@.outbox_installed_as_extension() THEN
        PERFORM @extschema@.outbox_load_settings();
        RETURN coalesce(nullif(current_setting('outbox.max_attempts', true), '')::integer, 10);
    END IF;
    RETURN coalesce((SELECT l.max_attempts FROM @extschema@.outbox_limits AS l), 10);
END
$$;


-- Sets one limit of the SQL install, in the settings' units: max_payload_bytes as a size
-- ('2MB', '512kB', bytes), deliver_at_horizon as a time ('30d', '12h', seconds), max_attempts
-- as a number. Null goes back to the default. It applies to calls that start after the
-- change commits; the relay reads max_attempts again at its next poll. Where the extension is
-- installed, the limits are its settings, set in the server's configuration.
CREATE OR REPLACE FUNCTION @extschema@.outbox_limit_set(name text, value text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bytes bigint;
    horizon interval;
    attempts integer;
BEGIN
    IF @extschema@.outbox_installed_as_extension() THEN
        RAISE EXCEPTION 'outbox_limit_set: the extension is installed here, and its limits are the server''s settings'
              USING ERRCODE = 'object_not_in_prerequisite_state',
                    HINT = 'Set outbox.max_payload_bytes, outbox.deliver_at_horizon or outbox.max_attempts in the server''s configuration (ALTER SYSTEM SET, then SELECT pg_reload_conf()).';
    END IF;
    CASE name
    WHEN 'max_payload_bytes' THEN
        bytes := pg_size_bytes(value);
        IF bytes NOT BETWEEN 1 AND 2147483647 THEN
            RAISE EXCEPTION 'outbox_limit_set: max_payload_bytes must be between 1 byte and 2147483647 bytes, not %', value
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO @extschema@.outbox_limits AS l (max_payload_bytes) VALUES (bytes)
        ON CONFLICT (one) DO UPDATE SET max_payload_bytes = excluded.max_payload_bytes;
    WHEN 'deliver_at_horizon' THEN
        -- A bare number is seconds, as the setting takes it.
        horizon := CASE WHEN value ~ '^\s*[0-9]+\s*$' THEN value::bigint * interval '1 second' ELSE value::interval END;
        IF horizon NOT BETWEEN interval '1 second' AND interval '2147483647 seconds' THEN
            RAISE EXCEPTION 'outbox_limit_set: deliver_at_horizon must be between 1 second and 2147483647 seconds, not %', value
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO @extschema@.outbox_limits AS l (deliver_at_horizon) VALUES (horizon)
        ON CONFLICT (one) DO UPDATE SET deliver_at_horizon = excluded.deliver_at_horizon;
    WHEN 'max_attempts' THEN
        attempts := value::integer;
        IF attempts NOT BETWEEN 1 AND 1000 THEN
            RAISE EXCEPTION 'outbox_limit_set: max_attempts must be between 1 and 1000, not %', value
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO @extschema@.outbox_limits AS l (max_attempts) VALUES (attempts)
        ON CONFLICT (one) DO UPDATE SET max_attempts = excluded.max_attempts;
    ELSE
        RAISE EXCEPTION 'outbox_limit_set: no limit is named %', coalesce(quote_literal(name), 'null')
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'The limits are max_payload_bytes, deliver_at_horizon and max_attempts.';
    END CASE;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_installed_as_extension() FROM PUBLIC;

REVOKE ALL ON FUNCTION @extschema@.outbox_max_attempts() FROM PUBLIC;

REVOKE ALL ON FUNCTION @extschema@.outbox_limit_set(text, text) FROM PUBLIC;


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


-- The `outbox relay` processes serving this outbox (the workers inside the server are in shared
-- memory: outbox_workers()). Each relay adds its row when it starts, refreshes seen_at every
-- few seconds and removes its row when it stops; a relay that was killed leaves a row that stops
-- being refreshed. The id is what the relay's claims record in claimed_by: negative, so it never
-- reads as a server process id.
--
-- listening: the relay is waiting for commits, and wants a NOTIFY on outbox_enqueued from each
-- (sql/sql_install.sql). A relay with a backlog turns it off, so that a busy outbox's enqueues
-- skip the notification, which makes commits that send one take turns.
CREATE TABLE @extschema@.outbox_relays (
    id         integer     PRIMARY KEY GENERATED ALWAYS AS IDENTITY (MINVALUE -2147483647 MAXVALUE -1 START WITH -1 INCREMENT BY -1),
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    listening  boolean     NOT NULL DEFAULT false
);


COMMENT ON TABLE @extschema@.outbox_relays IS 'The outbox relay processes serving this outbox: each adds its row at start, refreshes seen_at while it runs, removes it when it stops.';


-- The relays seen in the last minute: what the monitoring counts (with outbox_workers()) to
-- alert when nothing delivers.
CREATE OR REPLACE FUNCTION @extschema@.outbox_relay_processes()
RETURNS TABLE (
    id integer,
    host text,
    pid integer,
    version text,
    started_at timestamptz,
    seen_at timestamptz)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.id, r.host, r.pid, r.version, r.started_at, r.seen_at
      FROM @extschema@.outbox_relays AS r
     WHERE r.seen_at > now() - interval '1 minute'
     ORDER BY r.id DESC
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_relay_processes() FROM PUBLIC;


-- What the server tells an `outbox relay` serving the extension's install, as it tells the
-- relay workers: whether outbox.relay lets a relay serve this database, read as a session
-- beginning now would read it (ALTER DATABASE … SET and ALTER ROLE … SET hold for the sessions
-- that begin after them, and the relay's is older); outbox.allowed_destinations; and
-- outbox.webhook_url, the URL of the endpoint default while its own is null. Only superusers
-- may read the last two. The library is loaded first, where the extension is installed but not
-- preloaded (sql/library_settings.sql). No row where no library defines them: the SQL
-- install's relay obeys its own flags alone.
CREATE OR REPLACE FUNCTION @extschema@.outbox_relay_server_settings()
RETURNS TABLE (serves boolean, allowed_destinations text, webhook_url text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    relay pg_settings;
    stored text;
BEGIN
    IF @extschema@.outbox_installed_as_extension() THEN
        PERFORM @extschema@.outbox_load_settings();
    END IF;
    SELECT * INTO relay FROM pg_settings AS s WHERE s.name = 'outbox.relay' AND s.vartype = 'bool';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- As a new session applies them: the role's setting in this database, the role's, the
    -- database's; else the server's configuration.
    SELECT substr(c.setting, length('outbox.relay=') + 1) INTO stored
      FROM pg_db_role_setting AS s
     CROSS JOIN LATERAL unnest(s.setconfig) AS c (setting)
     WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()))
       AND s.setrole IN (0, (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = session_user))
       AND (s.setdatabase <> 0 OR s.setrole <> 0)
       AND c.setting LIKE 'outbox.relay=%'
     ORDER BY s.setrole <> 0 DESC, s.setdatabase <> 0 DESC
     LIMIT 1;
    IF stored IS NULL AND relay.source IN ('database', 'user', 'database user') THEN
        -- This session's value came from such a setting, since removed.
        stored := coalesce((SELECT f.setting FROM pg_file_settings AS f
                             WHERE f.name = 'outbox.relay' AND f.applied ORDER BY f.seqno DESC LIMIT 1), relay.boot_val);
    END IF;
    RETURN QUERY SELECT coalesce(stored, relay.setting)::boolean, current_setting('outbox.allowed_destinations'),
                        current_setting('outbox.webhook_url');
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_relay_server_settings() FROM PUBLIC;


-- Dead deliveries found, requeued and skipped by a filter, as an operator paged at night needs
-- them (docs/runbook.md): which endpoint, which topic (exact, or a pattern as endpoints
-- subscribe with: 'order.*', '*'), which error (a part of last_error, in any case) and when
-- they died (dead_at in [since, until)). A null filters nothing.
--
-- On an ordered endpoint a dead delivery blocks its key while it is the key's head
-- (outbox_keys). One that is not the head any more was skipped (outbox_skip): the key went on
-- without it, so a bulk requeue leaves it dead rather than send it after the events that
-- followed it (outbox_requeue brings one back on purpose).

-- The dead deliveries a filter matches: the one place the three functions below read it from.
-- It checks the filter, so a typing mistake is an error, not a silent match of nothing.
CREATE OR REPLACE FUNCTION @extschema@.outbox_dead_matching(
    endpoint text, topic text, error text, since timestamptz, until timestamptz)
RETURNS SETOF @extschema@.outbox_deliveries
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $2 IS NOT NULL AND $2 !~ '^(\*|[^.*]+(\.[^.*]+)*(\.\*)?)$' THEN
        RAISE EXCEPTION 'outbox: % is not a topic pattern', quote_literal($2)
              USING ERRCODE = 'invalid_parameter_value',
                    HINT = 'Write a topic (order.placed), a prefix (order.*) or *.';
    END IF;
    IF $1 IS NOT NULL AND NOT EXISTS (SELECT FROM @extschema@.outbox_endpoints AS e WHERE e.name = $1) THEN
        RAISE EXCEPTION 'outbox: endpoint % does not exist', quote_literal($1)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $4 >= $5 THEN
        RAISE EXCEPTION 'outbox: since (%) must be before until (%)', $4, $5
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT d.*
          FROM @extschema@.outbox_deliveries AS d
          JOIN @extschema@.outbox AS o ON o.id = d.event_id
         WHERE d.dead_at IS NOT NULL
           AND ($1 IS NULL OR d.endpoint = $1)
           AND ($2 IS NULL OR $2 = ANY (@extschema@.outbox_topic_patterns(o.topic)))
           AND ($3 IS NULL OR strpos(lower(d.last_error), lower($3)) > 0)
           AND ($4 IS NULL OR d.dead_at >= $4)
           AND ($5 IS NULL OR d.dead_at < $5);
END
$$;


-- The dead deliveries a filter matches, the most recently dead first, at most max_rows: what
-- failed, and what the receiver last answered (from outbox_attempts).
CREATE TYPE @extschema@.outbox_dead_delivery AS (
    endpoint text,
    event_id bigint,
    topic text,
    key text,
    attempts integer,
    dead_at timestamptz,
    last_error text,
    last_status integer,
    last_response text,
    skipped boolean
);


CREATE OR REPLACE FUNCTION @extschema@.outbox_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    max_rows integer DEFAULT 100)
RETURNS SETOF @extschema@.outbox_dead_delivery
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'outbox_dead: max_rows must be 1 or more, not %', coalesce(max_rows::text, 'null')
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT d.endpoint, d.event_id, o.topic, o.key, d.attempts, d.dead_at, d.last_error, a.status, a.response,
               d.key IS NOT NULL AND k.head IS NULL
          -- The newest max_rows first, then their events and answers: not one lookup per match.
          FROM (SELECT * FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                 ORDER BY m.dead_at DESC, m.event_id DESC
                 LIMIT max_rows) AS d
          JOIN @extschema@.outbox AS o ON o.id = d.event_id
          LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = d.endpoint AND k.key = d.key AND k.head = d.event_id
          LEFT JOIN LATERAL (SELECT f.status, f.response
                               FROM @extschema@.outbox_attempts AS f
                              WHERE f.event_id = d.event_id AND f.endpoint = d.endpoint
                              ORDER BY f.failed_at DESC
                              LIMIT 1) AS a ON true
         ORDER BY d.dead_at DESC, d.event_id DESC;
END
$$;


-- Puts every dead delivery a filter matches back in the queue, oldest event first, each as
-- outbox_requeue does it, but for skipped ones. With dry_run (the default) it changes nothing
-- and returns how many it would requeue: count first, then run again with dry_run => false.
CREATE OR REPLACE FUNCTION @extschema@.outbox_requeue_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    dry_run boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    how_many bigint;
BEGIN
    IF dry_run IS NOT false THEN
        SELECT count(*) INTO how_many
          FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
          LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
         WHERE m.key IS NULL OR k.head IS NOT NULL;
    ELSE
        SELECT coalesce(sum(@extschema@.outbox_requeue(m.event_id, m.endpoint)), 0) INTO how_many
          FROM (SELECT m.event_id, m.endpoint
                  FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                  LEFT JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
                 WHERE m.key IS NULL OR k.head IS NOT NULL
                 ORDER BY m.event_id) AS m;
    END IF;
    RETURN how_many;
END
$$;


-- Skips, as outbox_skip does, every dead delivery a filter matches that blocks its key (the
-- head of its key on an ordered endpoint), oldest event first. With dry_run (the default) it
-- changes nothing and returns how many it would skip. The next delivery of a key is never dead,
-- so a run skips what its dry run counted, unless deliveries die, are requeued or expire between
-- the two (pass the dry run's until to keep new deaths out).
CREATE OR REPLACE FUNCTION @extschema@.outbox_skip_dead(
    endpoint text DEFAULT NULL,
    topic text DEFAULT NULL,
    error text DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    until timestamptz DEFAULT NULL,
    dry_run boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    how_many bigint;
BEGIN
    IF dry_run IS NOT false THEN
        SELECT count(*) INTO how_many
          FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
          JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id;
    ELSE
        SELECT count(*) FILTER (WHERE @extschema@.outbox_skip(m.endpoint, m.event_id)) INTO how_many
          FROM (SELECT m.event_id, m.endpoint
                  FROM @extschema@.outbox_dead_matching($1, $2, $3, $4, $5) AS m
                  JOIN @extschema@.outbox_keys AS k ON k.endpoint = m.endpoint AND k.key = m.key AND k.head = m.event_id
                 ORDER BY m.event_id) AS m;
    END IF;
    RETURN how_many;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_dead_matching(text, text, text, timestamptz, timestamptz) FROM PUBLIC;

REVOKE ALL ON FUNCTION @extschema@.outbox_dead(text, text, text, timestamptz, timestamptz, integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION @extschema@.outbox_requeue_dead(text, text, text, timestamptz, timestamptz, boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION @extschema@.outbox_skip_dead(text, text, text, timestamptz, timestamptz, boolean) FROM PUBLIC;


-- Log mode (docs/log-mode.md): an enqueue writes one row into outbox_log, an append-only table
-- whose rows are never updated and whose hourly partitions are dropped whole, and the relay
-- reads the events back from a logical replication slot in commit order. A delivery the
-- receiver acknowledges writes nothing more; one that fails, or that only the table path can
-- make (a pull endpoint, an ordered key, a disabled endpoint), is copied into outbox and
-- outbox_deliveries and goes on from there as in table mode.

-- One row: whether this database is in log mode, the slot the relay reads, and how far the
-- relay has confirmed it. recover_from is the oldest transaction that may have committed after
-- the confirmed position (the xmin of a snapshot taken before it was read): were the slot lost,
-- the events of every transaction from it on are delivered again from outbox_log.
-- reader_fence and reader_until are the lease of the one relay that reads the slot.
-- recovering: the slot was made again, and what it did not hold is not yet recovered.
-- slot_made: a snapshot taken just after the slot was made. What it sees as committed is not in
-- the slot and is recovered; what it does not see is in the slot, and only there.
-- slot_ours: the slot of that name is the one outbox_log_make_slot made. Slot names are the
-- cluster's and slots have no owner: one of that name that it did not make is refused.
-- slot_wanted_from: the WAL position when the lease last found no slot. A slot made from there
-- on, and not in use, is taken for one outbox_log_make_slot made in a transaction that then
-- did not commit (the slot outlives it); that is how the first slot is made too.
-- confirmed_at: when the relay last confirmed, which it does after each read (an empty one
-- too, so that the slot keeps no WAL of other tables' writes), or when log mode was switched
-- on with nothing in the log: the slot's lag in time, which grows while no relay reads it.
-- table_since: the transaction that put the database back in table mode. A statement whose
-- snapshot is older still sees log mode and may write into the log; once no such snapshot is
-- left, logged_below is a transaction id above every one that wrote into the log. Once the
-- relay has confirmed every transaction below it (recover_from reaches it), the log is
-- delivered: the slot is dropped and the relay stops reading (outbox_log_confirm), and
-- logged_below stays as what outbox_log_maintain may drop below.
CREATE TABLE @extschema@.outbox_log_state (
    one           boolean     PRIMARY KEY DEFAULT true CHECK (one),
    enabled       boolean     NOT NULL DEFAULT false,
    slot          name        NOT NULL,
    publication   name        NOT NULL DEFAULT 'outbox_log',
    confirmed_lsn pg_lsn,
    recover_from  xid8,
    reader_fence  bigint      NOT NULL DEFAULT 0,
    reader_until  timestamptz,
    recovering    boolean     NOT NULL DEFAULT false,
    slot_made     pg_snapshot,
    slot_ours     boolean     NOT NULL DEFAULT false,
    slot_wanted_from pg_lsn,
    confirmed_at  timestamptz,
    table_since   xid8,
    logged_below  xid8
);


COMMENT ON TABLE @extschema@.outbox_log_state IS 'Log mode: whether it is on (outbox_set_mode()), the slot the relay reads, its confirmed position and the reader''s lease.';


-- A slot's name is unique in the cluster: one per database.
INSERT INTO @extschema@.outbox_log_state (slot)
SELECT 'outbox_log_' OPERATOR(pg_catalog.||) d.oid FROM pg_catalog.pg_database AS d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database();


-- The events of log mode. Column names and meanings as outbox's, so that Debezium's outbox
-- event router reads them (docs/log-mode.md#debezium): id, topic (its aggregate type and
-- type), key (its aggregate id), payload. xact is the inserting transaction, by which events
-- are found again when the slot is lost. No index: nothing reads a row by its key.
CREATE TABLE @extschema@.outbox_log (
    id         bigint      NOT NULL,
    topic      text        NOT NULL,
    payload    jsonb       NOT NULL,
    key        text,
    created_at timestamptz NOT NULL DEFAULT now(),
    xact       xid8        NOT NULL DEFAULT pg_current_xact_id()
) PARTITION BY RANGE (created_at);


COMMENT ON TABLE @extschema@.outbox_log IS 'Events enqueued in log mode, append-only, in hourly partitions the relay drops once it has read them.';


-- Rows of an hour no partition was made for yet (the relay makes them ahead): never lost.
CREATE TABLE @extschema@.outbox_log_default PARTITION OF @extschema@.outbox_log DEFAULT;


-- Makes the partitions of the next hours and drops those of hours past whose every event the
-- relay has confirmed (no row of a transaction from recover_from on, or, once the log is
-- delivered and its slot dropped, from logged_below on); empties the default partition the
-- same way. Run by the relay with its retention and by outbox_set_mode. Returns
-- how many partitions it made or dropped. A partition another session holds is left for the
-- next run (lock_timeout), so that an enqueue never waits behind this for long. One session
-- maintains at a time, and another returns at once: two making the same partition, the later
-- would find that it exists only once the first committed, and fail. Hours are UTC's, whatever
-- the caller's TimeZone: a relay or an outbox_set_mode elsewhere names and bounds them alike.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_maintain()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET TimeZone = 'UTC'
AS $$
DECLARE
    log regclass := '@extschema@.outbox_log'::regclass;
    schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_class AS c WHERE c.oid = log);
    hour timestamptz := date_trunc('hour', now());
    recover xid8 := (SELECT coalesce(s.recover_from, s.logged_below) FROM @extschema@.outbox_log_state AS s);
    part record;
    changed integer := 0;
    name text;
BEGIN
    -- A lock only the owner can take (any role could hold an advisory lock, and stop this).
    BEGIN
        LOCK TABLE @extschema@.outbox_log_state IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
    FOR ahead IN 0..5 LOOP
        name := 'outbox_log_' || to_char(hour + ahead * interval '1 hour', 'YYYYMMDD"h"HH24');
        CONTINUE WHEN to_regclass(format('%s.%I', schema, name)) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE %s.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           schema, name, log, hour + ahead * interval '1 hour', hour + (ahead + 1) * interval '1 hour');
            changed := changed + 1;
        EXCEPTION WHEN lock_not_available OR check_violation OR invalid_object_definition THEN
            -- Locked now, rows of that hour already went to the default partition, or a
            -- partition of another name holds part of that hour.
            NULL;
        END;
    END LOOP;
    IF recover IS NULL THEN
        RETURN changed;
    END IF;
    FOR part IN
        SELECT c.oid::regclass AS partition, pg_get_expr(c.relpartbound, c.oid) AS bound
          FROM pg_inherits AS i
          JOIN pg_class AS c ON c.oid = i.inhrelid
         WHERE i.inhparent = log
    LOOP
        IF part.bound = 'DEFAULT' THEN
            DELETE FROM @extschema@.outbox_log_default AS l WHERE l.xact < recover;
        ELSIF substring(part.bound FROM 'TO \(''([^'']*)''\)')::timestamptz <= hour THEN
            CONTINUE WHEN EXISTS (SELECT FROM @extschema@.outbox_log AS l
                                   WHERE l.tableoid = part.partition AND l.xact >= recover);
            BEGIN
                -- Looked at again once locked: a row committed since would go with it.
                EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part.partition);
                IF NOT EXISTS (SELECT FROM @extschema@.outbox_log AS l
                                WHERE l.tableoid = part.partition AND l.xact >= recover) THEN
                    EXECUTE format('DROP TABLE %s', part.partition);
                    changed := changed + 1;
                END IF;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
    END LOOP;
    RETURN changed;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_maintain() FROM PUBLIC;


-- The state of the log's slot: ready; missing (dropped, or a standby promoted); lost
-- (invalidated by max_slot_wal_keep_size); or foreign: a slot of that name that
-- outbox_log_make_slot did not make (a role with REPLICATION can make one first), or not one
-- of this database's that pgoutput decodes. A foreign slot is never read, made again or
-- dropped: outbox_set_mode and outbox_log_make_slot refuse it.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_slot_state()
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN r.slot_name IS NULL THEN 'missing'
                WHEN NOT s.slot_ours OR r.slot_type <> 'logical' OR r.plugin IS DISTINCT FROM 'pgoutput'
                     OR r.database IS DISTINCT FROM current_database() THEN 'foreign'
                WHEN r.wal_status = 'lost' THEN 'lost'
                ELSE 'ready' END
      FROM @extschema@.outbox_log_state AS s
      LEFT JOIN pg_replication_slots AS r ON r.slot_name = s.slot
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_slot_state() FROM PUBLIC;


-- Why the publication named publication is not the one the log is read through, or null when
-- it is: owned by the owner of outbox_log, publishing the inserts into outbox_log alone, whole,
-- as rows of outbox_log itself (not of its partitions). Anyone with CREATE on the database can
-- make a publication of that name first, for a table of theirs: read through it, the rows they
-- write would be sent as events, signed with the endpoints' secrets, and the real ones never.
-- Null also when no such publication exists (outbox_set_mode makes it).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_publication_problem(publication name)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
             WHEN p.pubowner <> log.relowner
               THEN format('it is owned by %s, not by %s, the owner of %s', p.pubowner::regrole, log.relowner::regrole, log.oid::regclass)
             WHEN p.puballtables OR EXISTS (SELECT FROM pg_publication_namespace AS n WHERE n.pnpubid = p.oid)
               THEN 'it publishes tables other than ' || log.oid::regclass::text
             WHEN NOT EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND r.prrelid = log.oid)
               THEN 'it does not publish ' || log.oid::regclass::text
             WHEN EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND r.prrelid <> log.oid)
               THEN 'it publishes tables other than ' || log.oid::regclass::text
             WHEN EXISTS (SELECT FROM pg_publication_rel AS r WHERE r.prpubid = p.oid AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL))
               THEN 'it publishes only some rows or columns of ' || log.oid::regclass::text
             WHEN NOT p.pubinsert OR NOT p.pubviaroot
               THEN 'it does not publish the inserts into ' || log.oid::regclass::text || ' as rows of that table'
           END
      FROM pg_publication AS p,
           (SELECT c.oid, c.relowner FROM pg_class AS c WHERE c.oid = '@extschema@.outbox_log'::regclass) AS log
     WHERE p.pubname = publication
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_publication_problem(name) FROM PUBLIC;


-- Raises when the publication the log is read through is not the outbox's own (its owner
-- dropped it and someone made another): read through it, the log's rows would be skipped and
-- confirmed as read. True otherwise, for a reader's WHERE clause.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_check_publication(publication name)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text := @extschema@.outbox_log_publication_problem(publication);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'the publication % is not the outbox''s own: %; the log is not read through it', publication, problem
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Drop it (DROP PUBLICATION %I) and run outbox_set_mode(''log'') again, which makes the outbox''s own.', publication);
    END IF;
    RETURN true;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_check_publication(name) FROM PUBLIC;


-- Puts this database in log mode ('log') or back in table mode ('table'), for the enqueues that
-- begin after this commits; returns the mode. Log mode needs wal_level = logical, and an owner
-- that may make a replication slot; it makes the publication the slot is read through and the
-- first partitions, and marks where the relay starts: every event from here on, delivered
-- from the slot once the relay has made it, and from outbox_log before that. It refuses a
-- publication or slot of the outbox's names that the outbox did not make. Back in table mode,
-- the relay still delivers what the log holds, then drops the slot (table_since,
-- outbox_log_confirm).
CREATE OR REPLACE FUNCTION @extschema@.outbox_set_mode(mode text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    failure text;
    code text;
BEGIN
    IF mode IS NULL OR mode NOT IN ('table', 'log') THEN
        RAISE EXCEPTION 'outbox_set_mode: the mode is table or log, not %', coalesce(quote_literal(mode), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO state FROM @extschema@.outbox_log_state FOR UPDATE;
    IF mode = 'log' AND current_setting('wal_level') <> 'logical' THEN
        RAISE EXCEPTION 'outbox_set_mode: log mode needs wal_level = logical, and it is %', current_setting('wal_level')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Set wal_level = logical and restart the server (on Amazon RDS: rds.logical_replication = 1; on Cloud SQL: cloudsql.logical_decoding = on).';
    END IF;
    IF mode = 'log' THEN
        PERFORM @extschema@.outbox_log_check_publication(state.publication);
        CASE @extschema@.outbox_log_slot_state()
        WHEN 'foreign' THEN
            RAISE EXCEPTION 'outbox_set_mode: a replication slot named % exists that the outbox did not make', state.slot
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = format('Nothing was switched. Find out who made it and why; once it is dropped (SELECT pg_drop_replication_slot(%L)), the relay makes its own.', state.slot);
        WHEN 'missing' THEN
            -- The relay makes the slot as this function's owner (outbox_log_make_slot): find out
            -- now whether it can, with a slot of its own that is gone again at once, rather than
            -- switch to a log that nothing will read.
            BEGIN
                PERFORM pg_create_physical_replication_slot('outbox_trial_' || pg_backend_pid(), false, true);
                PERFORM pg_drop_replication_slot('outbox_trial_' || pg_backend_pid());
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT, code = RETURNED_SQLSTATE;
                RAISE EXCEPTION 'outbox_set_mode: log mode needs a replication slot, and the outbox''s owner % cannot make one: %', current_user, failure
                    USING ERRCODE = code,
                          HINT = format('Nothing was switched. Give the owner the REPLICATION attribute (ALTER ROLE %I REPLICATION; on Amazon RDS: GRANT rds_replication TO %I), or a free slot (max_replication_slots).', current_user, current_user);
            END;
        ELSE
            NULL;
        END CASE;
        IF NOT EXISTS (SELECT FROM pg_publication AS p WHERE p.pubname = state.publication) THEN
            EXECUTE format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish = ''insert'', publish_via_partition_root = true)',
                           state.publication, '@extschema@.outbox_log'::regclass);
        END IF;
        PERFORM @extschema@.outbox_log_maintain();
    END IF;
    -- recover_from is kept while the log still holds events to deliver (the slot may not even
    -- be made yet): only a log delivered, or never used, starts again from here, and counts
    -- its lag from here.
    UPDATE @extschema@.outbox_log_state AS s
       SET enabled = (mode = 'log'),
           recover_from = CASE WHEN mode = 'log' AND s.recover_from IS NULL
                               THEN pg_snapshot_xmin(pg_current_snapshot()) ELSE s.recover_from END,
           confirmed_at = CASE WHEN mode = 'log' AND s.recover_from IS NULL THEN clock_timestamp() ELSE s.confirmed_at END,
           table_since = CASE WHEN mode = 'table' AND s.enabled THEN pg_current_xact_id()
                              WHEN mode = 'table' THEN s.table_since END,
           logged_below = CASE WHEN mode = 'table' AND s.enabled THEN NULL ELSE s.logged_below END;
    RETURN mode;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_set_mode(text) FROM PUBLIC;


-- The relay's lease on reading the slot: one relay reads it at a time, so no two deliver the
-- same event. fence is the lease this relay holds (0: none); the lease is renewed when it
-- still holds it, taken (with a new fence) when the holder's ran out. Returns nothing while
-- another relay holds it or before log mode was ever on; else the fence and the slot's state
-- (outbox_log_slot_state), recovering while a slot made again is ready but its events are not
-- yet recovered.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_lease(fence bigint, lease_ms double precision)
RETURNS TABLE (reader_fence bigint, slot_state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Whether the caller holds the lease is read from the row the UPDATE locks (fences start
    -- at 1: 0 holds nothing). Read before it, two relays taking the lease at once could both
    -- get it: the one that waited for the other's UPDATE would renew the fence just taken.
    -- A slot found missing or lost is marked recovering here, before it is made again: made
    -- by a transaction that then does not commit, it stays, and must not pass for one whose
    -- events were recovered (with no slot_made, the recovery copies them all).
    RETURN QUERY
    WITH leased AS (
        UPDATE @extschema@.outbox_log_state AS s
           SET reader_fence = CASE WHEN s.reader_fence = fence AND fence <> 0 THEN s.reader_fence ELSE s.reader_fence + 1 END,
               reader_until = clock_timestamp() + lease_ms * interval '1 millisecond',
               recovering = s.recovering OR @extschema@.outbox_log_slot_state() <> 'ready',
               slot_made = CASE WHEN @extschema@.outbox_log_slot_state() <> 'ready' THEN NULL ELSE s.slot_made END,
               slot_wanted_from = CASE @extschema@.outbox_log_slot_state()
                                       WHEN 'missing' THEN coalesce(s.slot_wanted_from, pg_current_wal_insert_lsn())
                                       WHEN 'ready' THEN NULL
                                       ELSE s.slot_wanted_from END
         WHERE (s.enabled OR s.recover_from IS NOT NULL)
           AND ((s.reader_fence = fence AND fence <> 0) OR s.reader_until IS NULL OR s.reader_until < clock_timestamp())
        RETURNING s.reader_fence, s.slot, s.recovering)
    SELECT l.reader_fence, CASE WHEN t.state = 'ready' AND l.recovering THEN 'recovering' ELSE t.state END
      FROM leased AS l
     CROSS JOIN LATERAL (SELECT @extschema@.outbox_log_slot_state() AS state) AS t;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_lease(bigint, double precision) FROM PUBLIC;


-- Copies events read from the log into the table path: one delivery per (event, endpoint),
-- with its attempts so far, the error of the last, and when it is due. Each array has one
-- element per delivery; the event columns repeat for each of its endpoints. A copy already
-- made (the same event and endpoint) is left as it is, so a batch read twice copies once.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_defer(
    ids bigint[], topics text[], payloads text[], keys text[], created text[],
    endpoints text[], attempts integer[], errors text[], due_in_ms double precision[])
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    made bigint;
BEGIN
    INSERT INTO @extschema@.outbox AS o (id, topic, payload, key, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT DISTINCT ON (t.id) t.id, t.topic, t.payload::jsonb, t.key, t.created::timestamptz
      FROM unnest(ids, topics, payloads, keys, created) AS t (id, topic, payload, key, created)
    ON CONFLICT (id) DO NOTHING;
    WITH copied AS (
        INSERT INTO @extschema@.outbox_deliveries AS d (event_id, endpoint, available_at, attempts, fence, last_error, key, waiting)
        SELECT t.id, t.endpoint, now() + t.due_in_ms * interval '1 millisecond', t.attempts, t.attempts, t.error,
               CASE WHEN e.ordered THEN t.key END, e.ordered AND t.key IS NOT NULL
          FROM unnest(ids, keys, endpoints, attempts, errors, due_in_ms) AS t (id, key, endpoint, attempts, error, due_in_ms)
          JOIN @extschema@.outbox_endpoints AS e ON e.name = t.endpoint
        ON CONFLICT (event_id, endpoint) DO NOTHING
        RETURNING d.endpoint, d.key, d.waiting),
    -- The sequencer gives each ordered key its head, as after an enqueue (note_key_arrivals.sql).
    arrivals AS (
        INSERT INTO @extschema@.outbox_key_arrivals (endpoint, key)
        SELECT c.endpoint, c.key FROM copied AS c WHERE c.waiting)
    SELECT count(*) INTO made FROM copied AS c;
    RETURN made;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_defer(bigint[], text[], text[], text[], text[], text[], integer[], text[], double precision[]) FROM PUBLIC;


-- After the slot was lost (dropped, invalidated, or not on a promoted standby) and made again:
-- every event of a transaction from recover_from on that committed before the new slot was
-- made goes to the table path, due now, for each endpoint it is routed to. Some were delivered
-- already, and are delivered again (consumers deduplicate by id); none is missed. Those
-- committed later are the new slot's alone. Returns how many deliveries it made. Copied at
-- most 10,000 deliveries or 64 MB of payloads at a time (each counts as at least 6,711 bytes):
-- one array of every payload held since the slot was lost could pass the 1 GB a value may
-- take. created_at goes through text, in ISO style whatever the session's (another style may
-- write a zone's abbreviation, which reads back ambiguously).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_recover(fence bigint)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO'
AS $$
DECLARE
    recover xid8;
    made_at pg_snapshot;
    made bigint;
BEGIN
    SELECT s.recover_from, s.slot_made INTO recover, made_at
      FROM @extschema@.outbox_log_state AS s WHERE s.reader_fence = fence FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_log_recover: another relay reads the log now' USING ERRCODE = 'lock_not_available';
    END IF;
    SELECT sum(@extschema@.outbox_log_defer(c.ids, c.topics, c.payloads, c.keys, c.created, c.endpoints,
                                            c.attempts, c.errors, c.due_in_ms))
      INTO made
      FROM (SELECT array_agg(e.id) AS ids, array_agg(e.topic) AS topics, array_agg(e.payload) AS payloads,
                   array_agg(e.key) AS keys, array_agg(e.created) AS created, array_agg(e.endpoint) AS endpoints,
                   array_agg(0) AS attempts, array_agg(NULL::text) AS errors, array_agg(0::double precision) AS due_in_ms
              FROM (SELECT l.id, l.topic, l.payload::text AS payload, l.key, l.created_at::text AS created,
                           r.name AS endpoint,
                           sum(greatest(octet_length(l.payload::text), 6711)) OVER (ROWS UNBOUNDED PRECEDING) / 67108864 AS chunk
                      FROM @extschema@.outbox_log AS l
                      JOIN @extschema@.outbox_endpoints AS r ON r.topics OPERATOR(pg_catalog.&&) @extschema@.outbox_topic_patterns(l.topic)
                     WHERE l.xact >= coalesce(recover, '0'::xid8)
                       AND (made_at IS NULL OR pg_visible_in_snapshot(l.xact, made_at))) AS e
             GROUP BY e.chunk) AS c;
    -- From here on, the new slot holds whatever is not delivered: every transaction that
    -- committed after it was made is at least the oldest running then, and is recovered from
    -- there if this slot is lost too.
    UPDATE @extschema@.outbox_log_state
       SET confirmed_lsn = NULL, recover_from = coalesce(pg_snapshot_xmin(made_at), pg_snapshot_xmin(pg_current_snapshot())),
           recovering = false, slot_made = NULL;
    RETURN coalesce(made, 0);
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_recover(bigint) FROM PUBLIC;


-- The relay confirms that every delivery of the events up to reached (a WAL position as a
-- number) is acknowledged or copied into the table path: the slot may let go of them, and a
-- lost slot is recovered from the transactions from oldest on (the oldest running when a read
-- began whose position was at most reached). Only the relay that holds the lease (fence)
-- confirms, and not while a slot made again is not yet recovered; false otherwise.
-- Back in table mode, once the log is delivered (table_since, logged_below), the slot is
-- dropped instead of advanced and the lease let go: the relay stops reading, and the slot
-- keeps no WAL of the table path's writes. advance_slot is false for a relay that streams the
-- slot (outbox relay): it confirms the position on its replication connection, and the slot,
-- which its stream holds, can be neither advanced nor dropped here; it reads with
-- outbox_log_read once log mode is off, and its confirmation then drops the slot.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_confirm(fence bigint, reached bigint, oldest bigint, advance_slot boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    switched xid8;
    below xid8;
    position pg_lsn := '0/0'::pg_lsn + reached::numeric;
BEGIN
    SELECT s.table_since INTO switched FROM @extschema@.outbox_log_state AS s WHERE NOT s.enabled;
    -- No snapshot older than the switch is left in this database: no statement can write into
    -- the log any more, and each one that did took its transaction id before the one this
    -- transaction takes now (after the look, and its first: it has written nothing yet).
    IF switched IS NOT NULL AND pg_current_xact_id_if_assigned() IS NULL
       AND NOT EXISTS (SELECT FROM pg_stat_activity AS a
                        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                          AND age(a.backend_xmin) >= age(xid(switched))) THEN
        below := pg_current_xact_id();
    END IF;
    UPDATE @extschema@.outbox_log_state AS s
       SET confirmed_lsn = position, recover_from = greatest(s.recover_from, oldest::text::xid8), confirmed_at = clock_timestamp(),
           table_since = CASE WHEN s.table_since = switched AND below IS NOT NULL THEN NULL ELSE s.table_since END,
           logged_below = CASE WHEN s.table_since = switched AND below IS NOT NULL THEN below ELSE s.logged_below END
     WHERE s.reader_fence = outbox_log_confirm.fence AND NOT s.recovering
    RETURNING s.* INTO state;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT advance_slot THEN
        RETURN true;
    END IF;
    IF state.enabled OR state.logged_below IS NULL OR state.recover_from < state.logged_below THEN
        PERFORM pg_replication_slot_advance(state.slot, position);
        RETURN true;
    END IF;
    -- Every transaction that wrote into the log is confirmed.
    IF state.slot_ours AND EXISTS (SELECT FROM pg_replication_slots AS r WHERE r.slot_name = state.slot) THEN
        PERFORM pg_drop_replication_slot(state.slot);
    END IF;
    UPDATE @extschema@.outbox_log_state
       SET recover_from = NULL, confirmed_lsn = NULL, confirmed_at = NULL, reader_until = NULL, slot_ours = false;
    RETURN true;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_confirm(bigint, bigint, bigint, boolean) FROM PUBLIC;


-- Makes the slot again when it is missing, or lost (dropped first): run first in its
-- transaction, since a slot cannot be made in one that wrote, and at READ COMMITTED. Returns
-- whether it made one; the relay then runs outbox_log_recover (recovering says so until it
-- has).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_make_slot(fence bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    status text;
BEGIN
    -- At REPEATABLE READ the snapshot taken below would be the transaction's first, older
    -- than the slot: what committed in between would be neither in the slot nor recovered.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox_log_make_slot: run it at READ COMMITTED, not %', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s WHERE s.reader_fence = fence;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    status := @extschema@.outbox_log_slot_state();
    IF status = 'foreign' AND EXISTS (
        SELECT FROM pg_replication_slots AS r
         WHERE r.slot_name = state.slot AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'
           AND r.database = current_database() AND NOT r.temporary AND NOT r.two_phase AND r.active_pid IS NULL
           AND r.restart_lsn >= state.slot_wanted_from) THEN
        -- Made after the lease found none: by this function, in a transaction that did not
        -- commit. (A role with REPLICATION could have made it in that window, as it could drop
        -- and make any slot at any time: docs/security.md.)
        UPDATE @extschema@.outbox_log_state
           SET recovering = true, slot_made = pg_current_snapshot(), slot_ours = true, slot_wanted_from = NULL;
        RETURN true;
    ELSIF status = 'foreign' THEN
        RAISE EXCEPTION 'outbox_log_make_slot: a replication slot named % exists that the outbox did not make: the log is not read until it is dropped', state.slot
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Find out who made it and why; once it is dropped (SELECT pg_drop_replication_slot(%L)), the relay makes its own.', state.slot);
    ELSIF status = 'ready' THEN
        RETURN false;
    ELSIF status = 'lost' THEN
        PERFORM pg_drop_replication_slot(state.slot);
    END IF;
    PERFORM pg_create_logical_replication_slot(state.slot, 'pgoutput');
    -- Until outbox_log_recover has run, whatever stops the relay now. This statement's snapshot
    -- is taken after the slot was made, so every transaction it does not see commits after the
    -- slot's consistent point.
    UPDATE @extschema@.outbox_log_state
       SET recovering = true, slot_made = pg_current_snapshot(), slot_ours = true, slot_wanted_from = NULL;
    RETURN true;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_make_slot(bigint) FROM PUBLIC;


-- Up to about max_changes changes from the slot, from its confirmed position on, without
-- consuming them (outbox_log_confirm does, once they are delivered): pgoutput messages (begin,
-- relation, insert, commit) of whole transactions, each with its position. The last row has
-- no message: its xmin and began_at are the oldest transaction running when this read began
-- and the WAL position written then (as numbers), which outbox_log_confirm takes as oldest for
-- a position at or past it; flushed_at is the WAL position flushed then, which the read
-- decodes at least up to, and where a read that found nothing confirms (an asynchronous
-- commit written before began_at may not be flushed yet). endpoints_version is the endpoints'
-- version once the changes are read (an endpoint subscribed before an event read committed is
-- in it): the relay reads the endpoints again first if it differs, as before a claim. Timestamps come in ISO style, which the relay's bodies are built from
-- (core/src/log/routes.rs). Only the relay that holds the lease,
-- and has not let it run out, reads; any other gets no rows, and so does every relay while a
-- slot made again is not yet recovered (its first confirmation would move recover_from past
-- the events that only outbox_log_recover copies).
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_read(fence bigint, max_changes integer)
RETURNS TABLE (lsn bigint, data bytea, xmin bigint, began_at bigint, flushed_at bigint, endpoints_version bigint,
               log_relation bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO'
AS $$
DECLARE
    state @extschema@.outbox_log_state;
    oldest bigint := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
    position bigint := (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint;
    flushed bigint := (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint;
BEGIN
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s
     WHERE s.reader_fence = fence AND s.reader_until > clock_timestamp() AND NOT s.recovering;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM @extschema@.outbox_log_check_publication(state.publication);
    -- A stream that ended (outbox_log_read_start) may not have told the slot the position
    -- confirmed last: what was delivered up to it is not read again.
    IF state.confirmed_lsn > (SELECT r.confirmed_flush_lsn FROM pg_replication_slots AS r WHERE r.slot_name = state.slot) THEN
        PERFORM pg_replication_slot_advance(state.slot, state.confirmed_lsn);
    END IF;
    RETURN QUERY
    SELECT (c.lsn - '0/0'::pg_lsn)::bigint, c.data, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
      FROM pg_logical_slot_peek_binary_changes(state.slot, NULL, max_changes,
                                               'proto_version', '1', 'publication_names', state.publication) AS c;
    RETURN QUERY SELECT NULL::bigint, NULL::bytea, oldest, position, flushed,
                        coalesce((SELECT v.version FROM @extschema@.outbox_endpoints_version AS v), 0),
                        '@extschema@.outbox_log'::regclass::oid::bigint;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_read(bigint, integer) FROM PUBLIC;


-- For a relay that streams the slot instead of reading it here (outbox relay), at each read of
-- the stream: the oldest transaction running and the WAL position written, as
-- outbox_log_read's first row has them; the slot and publication to stream, from the position
-- confirmed last (as a number; the slot's own may lag, its stream having ended before it sent
-- it); and whether log mode is on (off, the relay reads with outbox_log_read, whose
-- confirmation can drop the slot); the endpoints' version, as outbox_log_read gives it (the
-- relay takes what its stream received before it asks); and the
-- session's time zone, in which the stream writes timestamps as a read here does. No rows for
-- a relay that does not hold the lease, or while a slot made again is not yet recovered.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_read_start(fence bigint)
RETURNS TABLE (enabled boolean, slot name, publication name, confirmed bigint, xmin bigint, began_at bigint,
               endpoints_version bigint, timezone text, log_relation bigint)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.enabled, s.slot, s.publication, (s.confirmed_lsn - '0/0'::pg_lsn)::bigint,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint, (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
           coalesce((SELECT v.version FROM @extschema@.outbox_endpoints_version AS v), 0), current_setting('TimeZone'),
           '@extschema@.outbox_log'::regclass::oid::bigint
      FROM @extschema@.outbox_log_state AS s
     WHERE s.reader_fence = fence AND s.reader_until > clock_timestamp() AND NOT s.recovering
       AND @extschema@.outbox_log_check_publication(s.publication)
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_read_start(bigint) FROM PUBLIC;


-- Where events of the topics just read go: one row per (topic, endpoint). sendable: the relay
-- may send to it now (an enabled webhook endpoint); ordered: it keeps each key's order. The
-- relay sends an event now to a sendable endpoint unless the event has a key and the endpoint
-- is ordered; it copies the rest into the table path, where pull consumers claim them, an
-- ordered key keeps its order and a disabled endpoint keeps them. It keeps these rows until
-- the endpoints change (core/src/log/routes.rs), and builds each body itself.
-- PL/pgSQL, so that it may name outbox_topic_patterns, which sql/api.sql makes later.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_route(topics text[])
RETURNS TABLE (topic text, endpoint text, sendable boolean, ordered boolean)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.topic, e.name, e.kind = 'webhook' AND e.disabled_at IS NULL, e.ordered
      FROM (SELECT DISTINCT u.topic FROM unnest(topics) AS u (topic)) AS t
      JOIN @extschema@.outbox_endpoints AS e ON e.topics && @extschema@.outbox_topic_patterns(t.topic);
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_route(text[]) FROM PUBLIC;


-- How far the relay is behind in log mode, for monitoring: the WAL the slot keeps past its
-- confirmed position (bytes) and how long ago the relay last confirmed (seconds); a relay
-- that keeps up confirms after every read. No row in table mode, before log mode was ever on.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_lag()
RETURNS TABLE (slot name, slot_state text, lag_bytes bigint, lag_seconds double precision)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.slot,
           @extschema@.outbox_log_slot_state(),
           coalesce((pg_current_wal_lsn() - r.confirmed_flush_lsn)::bigint, 0),
           coalesce(extract(epoch FROM now() - s.confirmed_at)::double precision, 0)
      FROM @extschema@.outbox_log_state AS s
      LEFT JOIN pg_replication_slots AS r ON r.slot_name = s.slot
     WHERE s.enabled OR s.recover_from IS NOT NULL
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_lag() FROM PUBLIC;


-- The events the log holds that no relay has read yet, per endpoint their topic is routed to,
-- and the oldest of them: what outbox_endpoint_stats counts as pending beside the table path's
-- deliveries, so that a log nobody reads shows. Counted only while the reading stalls (no
-- confirmation for 10 seconds, or no slot of the outbox's to read): a relay that keeps up
-- confirms after every read, at least at each poll, and a count would read every row of the
-- log from recover_from on. Events of transactions from recover_from on that were confirmed
-- before the stall are counted too: at most a read's worth. A stalled log grows, and a
-- monitor reads this every few seconds: at most 100,000 of its rows are read, so a count
-- that reaches it means at least that many.
CREATE OR REPLACE FUNCTION @extschema@.outbox_log_unread()
RETURNS TABLE (endpoint text, unread bigint, oldest timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state @extschema@.outbox_log_state;
BEGIN
    SELECT * INTO state FROM @extschema@.outbox_log_state AS s WHERE s.recover_from IS NOT NULL;
    IF NOT FOUND OR (state.confirmed_at > clock_timestamp() - interval '10 seconds'
                     AND @extschema@.outbox_log_slot_state() = 'ready') THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.name, count(*), min(l.created_at)
      FROM (SELECT u.topic, u.created_at FROM @extschema@.outbox_log AS u
             WHERE u.xact >= state.recover_from LIMIT 100000) AS l
      JOIN @extschema@.outbox_endpoints AS e ON e.topics && @extschema@.outbox_topic_patterns(l.topic)
     GROUP BY e.name;
END
$$;


REVOKE ALL ON FUNCTION @extschema@.outbox_log_unread() FROM PUBLIC;


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
