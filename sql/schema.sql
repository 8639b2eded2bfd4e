-- outbox_ext schema. Objects live in the extension's schema (CREATE EXTENSION ... SCHEMA x).

-- One row per event. A row is pending until a receiver acknowledged it (sent_at) or it ran out
-- of attempts (dead_at); available_at doubles as the lease a claim takes.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,
    sent_at      timestamptz,
    dead_at      timestamptz,
    last_error   text,
    claimed_by   integer
);

COMMENT ON TABLE outbox IS 'Events enqueued by outbox_enqueue() and delivered by the outbox_ext relay workers.';
COMMENT ON COLUMN outbox.available_at IS 'Not claimable before this; a claim pushes it forward by outbox.lease.';
COMMENT ON COLUMN outbox.attempts IS 'Number of claims so far.';
COMMENT ON COLUMN outbox.sent_at IS 'Set only after the receiver answered 2xx.';
COMMENT ON COLUMN outbox.dead_at IS 'Set when attempts reached outbox.max_attempts; outbox_requeue() brings the row back.';
COMMENT ON COLUMN outbox.last_error IS 'What the last failed attempt saw: HTTP status, timeout or connection error.';
COMMENT ON COLUMN outbox.claimed_by IS 'Process id of the relay worker that claimed the row last (see pg_stat_activity).';

-- The queue: only rows still to deliver, in claim order. Its size tracks the backlog, not the
-- history, and every claim is served by it.
CREATE INDEX outbox_pending ON outbox (available_at, id)
    WHERE sent_at IS NULL AND dead_at IS NULL;

-- Consumer-side deduplication: a consumer records each event id it applied.
CREATE TABLE processed_events (
    consumer     text        NOT NULL DEFAULT 'default',
    event_id     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

COMMENT ON TABLE processed_events IS 'Event ids consumers have applied; see outbox_mark_processed().';

-- pg_dump keeps the rows of both tables, not only their definitions, and the position of the
-- id sequence: a restored outbox goes on above every id it ever gave out, so no consumer that
-- recorded an id in processed_events mistakes a new event for one it applied.
SELECT pg_catalog.pg_extension_config_dump('outbox', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('processed_events', '');
