-- The functions the extension's library provides, written in Rust (src/api.rs). The SQL install,
-- which has no library, declares PL/pgSQL and SQL forms of them instead (sql/sql_install.sql).
-- See sql/api.sql for the privileges every function runs with.

-- One outbox per database: CREATE EXTENSION refuses a database where `outbox migrate` installed
-- the outbox as plain SQL (its versions table marks it), as `outbox migrate` refuses one with
-- the extension. Two would each have their own events, endpoints and relays.
DO $$
DECLARE
    installed_in text;
BEGIN
    SELECT n.nspname INTO installed_in
      FROM pg_catalog.pg_class AS c
      JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
     WHERE c.relname OPERATOR(pg_catalog.=) 'outbox_migrations'
       AND c.relkind OPERATOR(pg_catalog.=) 'r'
     LIMIT 1;
    IF installed_in IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_ext: this database already has the outbox, installed as plain SQL in schema % by outbox migrate', installed_in
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Keep one outbox per database: upgrade that one with outbox migrate and deliver with outbox relay.';
    END IF;
END
$$;

-- Written in Rust (src/api.rs): it checks a setting and wakes the workers at commit. Its
-- statements (sql/enqueue.sql, sql/route.sql and those they name) name every object by schema
-- instead of pinning search_path, which would cost each call a settings save and restore.
CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueue(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE c
VOLATILE PARALLEL UNSAFE
SECURITY DEFINER
AS 'MODULE_PATHNAME', 'enqueue_wrapper';

-- Written in Rust: reads the workers' shared memory.
CREATE OR REPLACE FUNCTION @extschema@.outbox_workers()
RETURNS TABLE (
    worker integer,
    pid integer,
    settings_loaded_at timestamptz,
    in_flight bigint,
    delivered bigint,
    failed bigint)
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_workers_wrapper';

-- Written in Rust: monitoring counters in shared memory, since the server started. Attempts
-- per relay worker and outcome class (2xx, 4xx, 5xx, other_status, timeout, unreachable);
-- events enqueued by committed transactions. See monitoring/ and docs/monitoring.md.
CREATE OR REPLACE FUNCTION @extschema@.outbox_worker_attempts()
RETURNS TABLE (
    worker integer,
    outcome text,
    attempts bigint)
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_worker_attempts_wrapper';

CREATE OR REPLACE FUNCTION @extschema@.outbox_enqueued()
RETURNS bigint
LANGUAGE c
VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_enqueued_wrapper';

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(text, jsonb, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_workers() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_worker_attempts() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_enqueued() FROM PUBLIC;
