-- outbox_ext 0.1.0 -> 0.2.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
-- A fresh 0.2.0 install (sql/schema.sql, sql/api.sql) and 0.1.0 updated by this script have
-- the same objects: src/e2e/upgrade.rs compares them.
--
-- Only statements without operators or function calls that a search_path could redirect:
-- this script runs as a superuser, with the extension's schema on the path.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- pg_dump now keeps the id sequence's position, so a restore never hands out an id again.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');

-- Every function runs as the extension's owner (the SQL ones with search_path pinned to
-- pg_catalog; outbox_enqueue qualifies every name itself), and PUBLIC may execute none of them: roles get EXECUTE on what they need (README, "Security";
-- CHANGELOG.md says which GRANTs keep 0.1.0's producers working).
ALTER FUNCTION @extschema@.outbox_enqueue(pg_catalog.text, pg_catalog.jsonb) SECURITY DEFINER;
ALTER FUNCTION @extschema@.outbox_mark_processed(pg_catalog.int8, pg_catalog.text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.outbox_requeue(pg_catalog.int8) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION @extschema@.outbox_stats() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION @extschema@.outbox_enqueue(pg_catalog.text, pg_catalog.jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_mark_processed(pg_catalog.int8, pg_catalog.text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_requeue(pg_catalog.int8) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.outbox_workers() FROM PUBLIC;
