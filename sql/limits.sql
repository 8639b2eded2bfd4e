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
