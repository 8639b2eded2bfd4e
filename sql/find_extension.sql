-- Where outbox_ext is installed, the version of its schema, its OID (which changes when it is
-- dropped and created again) and its schema's OID; no row while it is not installed (yet).
-- Names and operators are qualified: outbox_enqueue runs this under its caller's search_path.
SELECT n.nspname::pg_catalog.text, e.extversion, e.oid, n.oid
  FROM pg_catalog.pg_extension AS e
  JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
 WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'::pg_catalog.name
