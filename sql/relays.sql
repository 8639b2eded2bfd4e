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
