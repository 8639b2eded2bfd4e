-- Written in Rust (src/settings.rs): calling it loads the extension's library into the session
-- if nothing had yet, and does nothing else. The library defines the outbox.* settings, with
-- who may set each. Loaded through shared_preload_libraries, every session has them; without
-- it (no relay workers, `outbox relay` serving the extension instead), a session that called
-- none of the library's functions has only placeholders of those names, which any role may
-- SET. Once loaded, the library's settings replace them and drop a value that a role without
-- the privilege had SET (with a warning). The SQL functions that read a setting of the
-- extension's call it first (outbox_max_attempts, outbox_relay_server_settings).
CREATE OR REPLACE FUNCTION @extschema@.outbox_load_settings()
RETURNS void
LANGUAGE c
STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_load_settings_wrapper';

REVOKE ALL ON FUNCTION @extschema@.outbox_load_settings() FROM PUBLIC;
