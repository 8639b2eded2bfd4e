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

-- pg_dump keeps the rows of both tables, not only their definitions, and the position of the
-- id sequence: a restored outbox goes on above every id it ever gave out, so no consumer that
-- recorded an id in processed_events mistakes a new event for one it applied.
SELECT pg_catalog.pg_extension_config_dump('outbox', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('processed_events', '');
