-- outbox_ext 0.1.0 -> 0.2.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
-- A fresh 0.2.0 install (sql/schema.sql, sql/api.sql) and 0.1.0 updated by this script have
-- the same objects: src/e2e/upgrade.rs compares them.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- pg_dump now keeps the id sequence's position, so a restore never hands out an id again.
SELECT pg_catalog.pg_extension_config_dump('outbox_id_seq', '');

-- Every function runs as the extension's owner with search_path pinned to pg_catalog, and
-- PUBLIC may execute none of them: roles get EXECUTE on what they need (README, "Security").
ALTER FUNCTION outbox_enqueue(text, jsonb) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox_mark_processed(bigint, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox_requeue(bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION outbox_stats() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION outbox_enqueue(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_mark_processed(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_requeue(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_workers() FROM PUBLIC;

-- Under 0.1.0 a role enqueued with INSERT on outbox plus PUBLIC's EXECUTE. Each such role keeps
-- enqueueing, now through EXECUTE alone. Its table privileges are no longer needed and let it
-- forge rows: CHANGELOG.md says to revoke them.
DO $$
DECLARE
    role_name text;
BEGIN
    FOR role_name IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END
          FROM pg_catalog.pg_class AS c
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = a.grantee
         WHERE c.oid = '@extschema@.outbox'::pg_catalog.regclass
           AND a.privilege_type = 'INSERT'
           AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION @extschema@.outbox_enqueue(text, jsonb) TO %s', role_name);
    END LOOP;
END
$$;
