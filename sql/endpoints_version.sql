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
