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

SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_attempts', '');
