-- outbox_ext 0.1.0 -> 0.2.0. Run by ALTER EXTENSION outbox_ext UPDATE; every row stays.
--
-- This is the source of sql/outbox_ext--0.1.0--0.2.0.sql: scripts/cluster.sh replaces each
-- "--@include FILE" line by sql/FILE, the text a fresh install runs, so a fresh 0.2.0 and
-- 0.1.0 updated have the same objects (src/e2e/upgrade.rs compares them).
--
-- The statements written here name every function and operator by schema: this script runs
-- as a superuser, with the extension's schema on the search_path.

\echo Use "ALTER EXTENSION outbox_ext UPDATE" to load this file. \quit

-- pg_dump now keeps the id sequence's position, so a restore never hands out an id again.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');

-- Functions whose arguments or results change are replaced below; privileges granted on the
-- old ones go with them (CHANGELOG.md says which GRANTs to run).
DROP FUNCTION @extschema@.outbox_enqueue(pg_catalog.text, pg_catalog.jsonb);
DROP FUNCTION @extschema@.outbox_requeue(pg_catalog.int8);
DROP FUNCTION @extschema@.outbox_stats();

--@include deliveries.sql

-- 0.1.0 delivered every event to one URL: its delivery state becomes the default endpoint's.
INSERT INTO @extschema@.outbox_deliveries
       (event_id, endpoint, available_at, attempts, fence, sent_at, dead_at, last_error, claimed_by)
SELECT o.id, 'default', o.available_at, o.attempts, o.attempts, o.sent_at, o.dead_at, o.last_error, o.claimed_by
  FROM @extschema@.outbox AS o;
INSERT INTO @extschema@.outbox_delivery_counts (endpoint, shard, sent)
SELECT 'default', 0, pg_catalog.count(o.sent_at)
  FROM @extschema@.outbox AS o;
-- 0.1.0 let producers INSERT into outbox; such a row would now be an event with no delivery,
-- never sent. Take those privileges back, so that a producer not yet moved to outbox_enqueue
-- fails loudly instead (CHANGELOG.md gives the GRANT that replaces them).
DO $$
DECLARE
    grantee pg_catalog.text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                             ELSE pg_catalog.quote_ident(r.rolname) END
          FROM pg_catalog.pg_class AS c
         CROSS JOIN pg_catalog.aclexplode(c.relacl) AS a
          LEFT JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.outbox'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'])
    LOOP
        EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON @extschema@.outbox FROM %s', grantee);
    END LOOP;
END
$$;

-- A signing secret set for 0.1.0 goes on signing the default endpoint's deliveries; the
-- setting is no longer read.
INSERT INTO @extschema@.outbox_endpoint_secrets (endpoint, generation, secret)
SELECT 'default', 1, s.secret
  FROM (SELECT pg_catalog.btrim(pg_catalog.current_setting('outbox.signing_secret', true)) AS secret) AS s
 WHERE s.secret OPERATOR(pg_catalog.<>) '';

ALTER TABLE @extschema@.outbox
    DROP COLUMN available_at,
    DROP COLUMN attempts,
    DROP COLUMN sent_at,
    DROP COLUMN dead_at,
    DROP COLUMN last_error,
    DROP COLUMN claimed_by,
    ADD COLUMN key pg_catalog.text;
COMMENT ON TABLE @extschema@.outbox IS 'Events enqueued by outbox_enqueue(); their delivery state is in outbox_deliveries.';
COMMENT ON COLUMN @extschema@.outbox.key IS 'Ordering key (e.g. the aggregate id); null means unordered.';

--@include ordering.sql
--@include api.sql
--@include endpoints.sql
--@include pull.sql
