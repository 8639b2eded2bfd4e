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
