-- Who, besides the outbox's owner, could change what the outbox in schema $1 does: one row per
-- way, with what to do about it. `outbox migrate` installs nothing while there is one (with $2:
-- the outbox's owner is the role it runs as, and the schema must be that role's); `outbox doctor`
-- lists them (without $2: the outbox's owner is the schema's, or with $3 the extension's, whose
-- schema may hold the database's other objects, so only the extension's own are looked at).
--
-- The ways: a schema owned by another role; CREATE on the schema held by a role other than its
-- owner (it can plant an outbox_enqueue(varchar, jsonb) that catches calls bound as JDBC binds a
-- string); an object in the schema owned by another role (its owner can replace it); TRIGGER on
-- a table held by another role (a trigger runs as whoever writes the row); INSERT, UPDATE,
-- DELETE, TRUNCATE or REFERENCES (a foreign key can hold back retention) on a table or some
-- of its columns (the outbox's state is only written
-- through its functions: a row of outbox_log_state or outbox_limits is what the relay trusts);
-- default privileges of the owner's that give another role anything on what the owner makes
-- in the schema (the next migrate's tables and functions would carry them; EXECUTE on
-- functions and USAGE on types for PUBLIC are PostgreSQL's defaults, which the scripts revoke
-- where it matters); and
-- membership in pg_write_all_data, which writes every table. Superusers can change anything
-- anyway, and a role's members are that role (they may SET ROLE to it): neither counts.
WITH schema AS (
    SELECT n.oid, n.nspname, n.nspowner, n.nspacl
      FROM pg_catalog.pg_namespace AS n
     WHERE n.nspname OPERATOR(pg_catalog.=) $1
),
extension AS (
    SELECT e.oid, e.extowner
      FROM pg_catalog.pg_extension AS e
     WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
),
me AS (
    SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER
),
owner AS (
    SELECT CASE WHEN $2 THEN (SELECT me.oid FROM me)
                WHEN $3 THEN (SELECT x.extowner FROM extension AS x)
                ELSE s.nspowner END AS oid
      FROM schema AS s
),
-- The schema's objects (each depends on it), and whether each is the extension's: one of its
-- members, or a partition of one (outbox_log_maintain makes the log's hourly partitions, which
-- are no members, and a row inserted into one is an event).
objects AS (
    SELECT d.classid, d.objid,
           EXISTS (SELECT FROM pg_catalog.pg_depend AS e, extension AS x
                    WHERE e.classid OPERATOR(pg_catalog.=) d.classid
                      AND e.objid OPERATOR(pg_catalog.=) ANY (ARRAY[d.objid] OPERATOR(pg_catalog.||)
                            ARRAY(SELECT i.inhparent FROM pg_catalog.pg_inherits AS i
                                   WHERE i.inhrelid OPERATOR(pg_catalog.=) d.objid
                                     AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass))
                      AND e.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                      AND e.refobjid OPERATOR(pg_catalog.=) x.oid AND e.deptype OPERATOR(pg_catalog.=) 'e') AS ours
      FROM pg_catalog.pg_depend AS d, schema AS s
     WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND d.refobjid OPERATOR(pg_catalog.=) s.oid AND d.deptype OPERATOR(pg_catalog.=) 'n'
),
-- The grants that let a role change what is there: CREATE on the schema; TRIGGER or a write on
-- a table, or a write on some of its columns.
grants AS (
    SELECT pg_catalog.format('SCHEMA %I', s.nspname) AS target, s.nspowner AS owner, a.grantee, a.privilege_type
      FROM schema AS s, pg_catalog.aclexplode(coalesce(s.nspacl, pg_catalog.acldefault('n', s.nspowner))) AS a
     WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
    UNION ALL
    SELECT pg_catalog.format('TABLE %I.%I', s.nspname, c.relname), c.relowner, a.grantee, a.privilege_type
      FROM objects AS o
      JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) o.objid, schema AS s, pg_catalog.aclexplode(c.relacl) AS a
     WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
       AND (o.ours OR NOT $3)
       AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{TRIGGER,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES}')
    UNION ALL
    SELECT pg_catalog.format('TABLE %I.%I', s.nspname, c.relname), c.relowner, a.grantee,
           pg_catalog.format('%s (%I)', a.privilege_type, t.attname)
      FROM objects AS o
      JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) o.objid
      JOIN pg_catalog.pg_attribute AS t ON t.attrelid OPERATOR(pg_catalog.=) c.oid, schema AS s, pg_catalog.aclexplode(t.attacl) AS a
     WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
       AND (o.ours OR NOT $3)
       AND a.privilege_type OPERATOR(pg_catalog.=) ANY ('{INSERT,UPDATE,REFERENCES}')
),
-- The owner's default privileges, in the schema or everywhere: what the next objects it makes
-- there are given at birth.
defaults AS (
    SELECT d.defaclnamespace, d.defaclobjtype, a.grantee, a.privilege_type,
           CASE d.defaclobjtype WHEN 'r' THEN 'TABLES' WHEN 'S' THEN 'SEQUENCES' WHEN 'f' THEN 'FUNCTIONS'
                                WHEN 'T' THEN 'TYPES' WHEN 'n' THEN 'SCHEMAS' END AS kind
      FROM pg_catalog.pg_default_acl AS d, owner AS w, schema AS s, pg_catalog.aclexplode(d.defaclacl) AS a
     WHERE d.defaclrole OPERATOR(pg_catalog.=) w.oid
       AND d.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0, s.oid])
       AND NOT (a.grantee OPERATOR(pg_catalog.=) 0
                AND ((d.defaclobjtype OPERATOR(pg_catalog.=) 'f' AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE')
                  OR (d.defaclobjtype OPERATOR(pg_catalog.=) 'T' AND a.privilege_type OPERATOR(pg_catalog.=) 'USAGE')))
),
ways AS (
    SELECT 1 AS rank,
           pg_catalog.format('schema %I is owned by %s, not by %I, the role outbox migrate runs as',
                             s.nspname, s.nspowner::pg_catalog.regrole, CURRENT_USER) AS problem,
           pg_catalog.format('drop it, or have a superuser run ALTER SCHEMA %I OWNER TO %I', s.nspname, CURRENT_USER) AS remedy
      FROM schema AS s, owner AS w
     WHERE s.nspowner OPERATOR(pg_catalog.<>) w.oid AND $2
    UNION ALL
    SELECT 2, pg_catalog.format('%s holds %s on %s', g.name, g.privilege_type, g.target),
           pg_catalog.format('REVOKE %s ON %s FROM %s', g.privilege_type, g.target, g.name)
      FROM (SELECT grants.*, CASE WHEN grants.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                  ELSE grants.grantee::pg_catalog.regrole::pg_catalog.text END AS name
              FROM grants) AS g
     WHERE g.grantee OPERATOR(pg_catalog.=) 0
        OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                        WHERE r.oid OPERATOR(pg_catalog.=) g.grantee
                          AND (r.rolsuper OR pg_catalog.pg_has_role(g.grantee, g.owner, 'MEMBER')))
    UNION ALL
    SELECT 2, pg_catalog.format('the default privileges of %s give %s %s on the %s it makes%s', w.oid::pg_catalog.regrole, f.name,
                                f.privilege_type, pg_catalog.lower(f.kind),
                                CASE WHEN f.defaclnamespace OPERATOR(pg_catalog.=) 0 THEN ''
                                     ELSE pg_catalog.format(' in schema %I', s.nspname) END),
           pg_catalog.format('ALTER DEFAULT PRIVILEGES FOR ROLE %s%s REVOKE %s ON %s FROM %s', w.oid::pg_catalog.regrole,
                             CASE WHEN f.defaclnamespace OPERATOR(pg_catalog.=) 0 THEN ''
                                  ELSE pg_catalog.format(' IN SCHEMA %I', s.nspname) END,
                             f.privilege_type, f.kind, f.name)
      FROM (SELECT defaults.*, CASE WHEN defaults.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                    ELSE defaults.grantee::pg_catalog.regrole::pg_catalog.text END AS name
              FROM defaults) AS f, owner AS w, schema AS s
     WHERE f.grantee OPERATOR(pg_catalog.=) 0
        OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                        WHERE r.oid OPERATOR(pg_catalog.=) f.grantee
                          AND (r.rolsuper OR pg_catalog.pg_has_role(f.grantee, w.oid, 'MEMBER')))
    UNION ALL
    -- Its direct members: a member of one of them is named through it.
    SELECT 2, pg_catalog.format('%I is a member of pg_write_all_data, which writes every table of schema %I', r.rolname, s.nspname),
           pg_catalog.format('REVOKE pg_write_all_data FROM %I, unless it is trusted as much as %s', r.rolname, w.oid::pg_catalog.regrole)
      FROM pg_catalog.pg_auth_members AS m
      JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) m.member, owner AS w, schema AS s
     WHERE m.roleid OPERATOR(pg_catalog.=) 'pg_write_all_data'::pg_catalog.regrole
       AND NOT r.rolsuper
       AND NOT pg_catalog.pg_has_role(r.oid, w.oid, 'MEMBER')
    UNION ALL
    -- Who owns what: pg_shdepend records every owner but the bootstrap superuser.
    SELECT 3, pg_catalog.format('%s is owned by %s, not by %s', pg_catalog.pg_describe_object(o.classid, o.objid, 0),
                                d.refobjid::pg_catalog.regrole, w.oid::pg_catalog.regrole),
           pg_catalog.format('drop it, or, if it is the outbox''s, give it back to %s', w.oid::pg_catalog.regrole)
      FROM objects AS o
      JOIN pg_catalog.pg_shdepend AS d
        ON d.classid OPERATOR(pg_catalog.=) o.classid AND d.objid OPERATOR(pg_catalog.=) o.objid
       AND d.deptype OPERATOR(pg_catalog.=) 'o'
       AND d.dbid OPERATOR(pg_catalog.=) (SELECT b.oid FROM pg_catalog.pg_database AS b
                                           WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()),
           owner AS w
     WHERE (o.ours OR NOT $3)
       AND d.refobjid OPERATOR(pg_catalog.<>) w.oid
       AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) d.refobjid)
)
SELECT w.problem, w.remedy
  FROM ways AS w
 ORDER BY w.rank, w.problem
