-- What an outbox in schema $1 is made of, one line per object, with the schema's name written
-- as @extschema@: its functions (signature, definition, whether PUBLIC may execute them), its
-- tables, sequences and views (columns, constraints, triggers, what PUBLIC is granted) and its
-- indexes. `outbox doctor` compares these lines with those of the version freshly installed;
-- grants to other roles are the database's own business and are left out. The functions
-- listed in $2 are described by signature only (the library's functions, which the two
-- installs write in different languages). With $3, only the extension's own objects count (its
-- schema may hold the database's other tables).
WITH schema AS (
    SELECT n.oid, n.nspname, pg_catalog.quote_ident(n.nspname) AS quoted
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) $1
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
       AND (NOT $3 OR EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                                 AND d.objid OPERATOR(pg_catalog.=) p.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'))
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
       AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,S,v,p}')
       AND c.relname OPERATOR(pg_catalog.<>) 'outbox_migrations'
       AND (NOT $3 OR EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                                 AND d.objid OPERATOR(pg_catalog.=) c.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'))
    UNION ALL
    SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
      FROM pg_catalog.pg_index AS i
      JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid, schema AS s
     WHERE c.relnamespace OPERATOR(pg_catalog.=) s.oid
       AND pg_catalog.pg_get_indexdef(i.indexrelid) NOT LIKE '%outbox_migrations%'
       AND (NOT $3 OR EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                               WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                                 AND d.objid OPERATOR(pg_catalog.=) i.indrelid AND d.deptype OPERATOR(pg_catalog.=) 'e'))
)
SELECT pg_catalog.replace(pg_catalog.replace(l.line, s.quoted || '.', '@extschema@.'), s.nspname || '.', '@extschema@.')
  FROM lines AS l, schema AS s
 ORDER BY 1
