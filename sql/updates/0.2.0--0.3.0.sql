-- outbox_ext 0.2.0 -> 0.3.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
--
-- This is the source of sql/outbox_ext--0.2.0--0.3.0.sql, assembled as the 0.1.0 update is
-- (scripts/cluster.sh: each "--@include FILE" line becomes sql/FILE). Each change 0.3.0 makes
-- to the schema or a function comes here with it: the test
-- upgrade::updating_from_every_release_since_0_2_0_keeps_every_row_and_ends_as_a_fresh_install
-- fails while 0.2.0 updated differs from a fresh install.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- Failed attempts keep a history (status, duration, the start of the response) that the
-- console shows; record_failures.sql and outbox_nack write it.
--@include attempts.sql

-- Events searched by time (the console's window on created_at), as sql/schema.sql makes it.
CREATE INDEX outbox_created_at ON @extschema@.outbox USING brin (created_at);

-- The endpoints' version was a sequence, which moves before the change commits: a worker
-- could read the new number with the old endpoints and sign with a secret already rotated
-- away. It becomes a row, moved on in the change's transaction.
DROP SEQUENCE @extschema@.outbox_endpoints_version;
--@include endpoints_version.sql
--@include endpoints.sql

-- The limits, read where no session can change them: on the SQL install, outbox.* names are
-- placeholders any role may SET, and so they are on the extension's until its library loads.
--@include library_settings.sql
--@include limits.sql

-- The outbox relay processes (`outbox relay`) record themselves, for the monitoring and for
-- enqueues to know whether one waits for a notification.
--@include relays.sql

-- The claim is one function, sql/claim.sql, which the relay's statement and outbox_claim both
-- call: outbox_claim had a second copy of it.
--@include claim.sql
--@include pull.sql

-- Dead deliveries listed, requeued and skipped by a filter, with a dry-run count first.
--@include dead.sql

-- Log mode: the append-only log, its slot and the relay's functions on it.
--@include log.sql

-- The endpoints' stats count the events a stalled log holds unread as pending.
--@include api.sql
