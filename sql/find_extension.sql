-- Where outbox_ext is installed, the version of its schema, and its OID (which changes when
-- it is dropped and created again); no row while it is not installed (yet).
SELECT n.nspname::text, e.extversion, e.oid
  FROM pg_catalog.pg_extension AS e
  JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'outbox_ext'
