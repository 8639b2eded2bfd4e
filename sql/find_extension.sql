-- Where outbox_ext is installed and the version of its schema; no row while it is not
-- installed (yet).
SELECT n.nspname::text, e.extversion
  FROM pg_catalog.pg_extension AS e
  JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'outbox_ext'
