-- Where outbox_ext is installed, the version of its schema, its OID (which changes when it is
-- dropped and created again), its schema's OID and its outbox_deliveries table's OID (which the
-- relay's statements check); no row while it is not installed (yet).
-- Names and operators are qualified: outbox_enqueue runs this under its caller's search_path.
SELECT n.nspname::pg_catalog.text, e.extversion, e.oid, n.oid,
       (SELECT c.oid
          FROM pg_catalog.pg_class AS c
         WHERE c.relname OPERATOR(pg_catalog.=) 'outbox_deliveries'::pg_catalog.name
           AND c.relnamespace OPERATOR(pg_catalog.=) n.oid)
  FROM pg_catalog.pg_extension AS e
  JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
 WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'::pg_catalog.name
