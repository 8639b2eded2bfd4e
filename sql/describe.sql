-- What an outbox in schema $1 is made of, one line per object, with the schema's name written
-- as @extschema@: its functions (signature, definition, whether PUBLIC may execute them), its
-- tables, sequences, views and composite types (columns, constraints, triggers, what PUBLIC is
-- granted), its indexes, and any other object in the schema (an operator, a type, a collation,
-- …) by name. `outbox doctor` compares these lines with those of the version freshly installed,
-- so whatever is in the schema that the version does not install is named, an overload such as
-- outbox_enqueue(varchar, jsonb) too; grants to other roles are the database's own business and
-- are left out (sql/schema_writers.sql looks at who could change the objects). The functions
-- listed in $2 are described by signature only (the library's functions, which the two
-- installs write in different languages). With $3, the outbox is the extension, whose schema
-- may hold the database's other objects: the extension's own count, and of the others the
-- functions and relations that could be taken for its own (named as one of its own or
-- outbox_…).
WITH schema AS (
    SELECT n.oid, n.nspname, pg_catalog.quote_ident(n.nspname) AS quoted
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) $1
),
-- The extension's objects (none on the SQL install).
ours AS (
    SELECT d.classid, d.objid
      FROM pg_catalog.pg_depend AS d, pg_catalog.pg_extension AS e
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) e.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
       AND e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
),
-- Names a function or relation of another could take to be taken for one of the extension's.
our_names AS (
    SELECT p.proname AS name
      FROM pg_catalog.pg_proc AS p, ours AS o
     WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass AND o.objid OPERATOR(pg_catalog.=) p.oid
    UNION
    SELECT c.relname
      FROM pg_catalog.pg_class AS c, ours AS o
     WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass AND o.objid OPERATOR(pg_catalog.=) c.oid
),
lines AS (
    SELECT 'function ' || p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ') returns '
           || pg_catalog.pg_get_function_result(p.oid)
           || CASE WHEN p.proname OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[]) THEN ''
                   ELSE E'\n' || pg_catalog.pg_get_functiondef(p.oid) END
           || E'\nPUBLIC may execute: '
           || EXISTS (SELECT FROM pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) AS a
                       WHERE a.grantee OPERATOR(pg_catalog.=) 0) AS line
      FROM pg_catalog.pg_proc AS p, schema AS s
     WHERE p.pronamespace OPERATOR(pg_catalog.=) s.oid
       AND (NOT $3 OR p.proname LIKE 'outbox\_%' OR p.proname OPERATOR(pg_catalog.=) ANY (SELECT n.name FROM our_names AS n)
            OR EXISTS (SELECT FROM ours AS o
                        WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                          AND o.objid OPERATOR(pg_catalog.=) p.oid))
    UNION ALL
    SELECT 'relation ' || c.relname || ' kind ' || c.relkind::pg_catalog.text
           || ' PUBLIC is granted: '
           || coalesce((SELECT pg_catalog.string_agg(a.privilege_type, ',' ORDER BY a.privilege_type)
                          FROM pg_catalog.aclexplode(c.relacl) AS a
                         WHERE a.grantee OPERATOR(pg_catalog.=) 0), 'nothing')
           || coalesce((SELECT pg_catalog.string_agg(pg_catalog.format(E'\n  column %s %s%s%s%s', a.attname,
                                                               pg_catalog.format_type(a.atttypid, a.atttypmod),
                                                               CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                                                               coalesce(' default ' || pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), ''),
                                                               CASE WHEN a.attidentity OPERATOR(pg_catalog.<>) '' THEN ' identity ' || a.attidentity::pg_catalog.text ELSE '' END),
                                               '' ORDER BY a.attnum)
                          FROM pg_catalog.pg_attribute AS a
                          LEFT JOIN pg_catalog.pg_attrdef AS ad
                            ON ad.adrelid OPERATOR(pg_catalog.=) a.attrelid AND ad.adnum OPERATOR(pg_catalog.=) a.attnum
                         WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped), '')
           || coalesce((SELECT pg_catalog.string_agg(E'\n  constraint ' || k.conname || ' ' || pg_catalog.pg_get_constraintdef(k.oid), ''
                                                     ORDER BY k.conname)
                          FROM pg_catalog.pg_constraint AS k
                         WHERE k.conrelid OPERATOR(pg_catalog.=) c.oid), '')
           || coalesce((SELECT pg_catalog.string_agg(E'\n  ' || pg_catalog.pg_get_triggerdef(t.oid), '' ORDER BY t.tgname)
                          FROM pg_catalog.pg_trigger AS t
                         WHERE t.tgrelid OPERATOR(pg_catalog.=) c.oid AND NOT t.tgisinternal), '')
      FROM pg_catalog.pg_class AS c, schema AS s
     WHERE c.relnamespace OPERATOR(pg_catalog.=) s.oid
       AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,S,v,p,m,f,c}')
       AND c.relname OPERATOR(pg_catalog.<>) 'outbox_migrations'
       -- The log's hourly partitions, which the outbox makes and drops as the log goes
       -- (sql/log.sql): every one but the default.
       AND NOT (c.relispartition AND c.relname OPERATOR(pg_catalog.<>) 'outbox_log_default'
                AND EXISTS (SELECT FROM pg_catalog.pg_inherits AS i
                              JOIN pg_catalog.pg_class AS p ON p.oid OPERATOR(pg_catalog.=) i.inhparent
                             WHERE i.inhrelid OPERATOR(pg_catalog.=) c.oid AND p.relname OPERATOR(pg_catalog.=) 'outbox_log'
                               AND p.relnamespace OPERATOR(pg_catalog.=) s.oid))
       -- On the extension: its own (a composite type by its type), and the relations of others
       -- named like them, but for the log's partitions, which it makes as the log goes.
       AND (NOT $3
            OR ((c.relname LIKE 'outbox\_%' OR c.relname OPERATOR(pg_catalog.=) ANY (SELECT n.name FROM our_names AS n))
                AND NOT c.relispartition)
            OR EXISTS (SELECT FROM ours AS o
                        WHERE (o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                               AND o.objid OPERATOR(pg_catalog.=) c.oid)
                           OR (o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                               AND o.objid OPERATOR(pg_catalog.=) c.reltype)))
    UNION ALL
    SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
      FROM pg_catalog.pg_index AS i
      JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid, schema AS s
     WHERE c.relnamespace OPERATOR(pg_catalog.=) s.oid
       AND pg_catalog.pg_get_indexdef(i.indexrelid) NOT LIKE '%outbox_migrations%'
       AND (NOT $3 OR EXISTS (SELECT FROM ours AS o
                               WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                                 AND o.objid OPERATOR(pg_catalog.=) i.indrelid))
    UNION ALL
    -- Every other object in the schema (each depends on it): by what it is and its name.
    SELECT 'object ' || pg_catalog.pg_describe_object(d.classid, d.objid, 0)
      FROM pg_catalog.pg_depend AS d, schema AS s
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) s.oid AND d.deptype OPERATOR(pg_catalog.=) 'n'
       AND d.classid OPERATOR(pg_catalog.<>) ALL (ARRAY['pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_class'::pg_catalog.regclass])
       -- A composite type is described as a relation above.
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_type AS t
                        WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                          AND t.oid OPERATOR(pg_catalog.=) d.objid AND t.typrelid OPERATOR(pg_catalog.<>) 0)
       AND (NOT $3 OR EXISTS (SELECT FROM ours AS o
                               WHERE o.classid OPERATOR(pg_catalog.=) d.classid AND o.objid OPERATOR(pg_catalog.=) d.objid))
)
SELECT pg_catalog.replace(pg_catalog.replace(l.line, s.quoted || '.', '@extschema@.'), s.nspname || '.', '@extschema@.')
  FROM lines AS l, schema AS s
 ORDER BY 1
