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
