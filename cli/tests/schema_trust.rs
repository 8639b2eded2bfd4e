//! Nothing of ours is adopted when someone else made it first: `outbox migrate` installs only
//! into a schema of the role it runs as that no other role can write, and `outbox doctor` names
//! every role but the outbox's owner that could change the outbox, and every object in its
//! schema that the outbox does not install (a look-alike `outbox_enqueue(varchar, jsonb)`
//! catches a call whose topic is bound as JDBC binds a string), on both installs. Real roles on a
//! real cluster: `squat` has CREATE on the database, as any role a managed server's users make
//! may have.

mod support;

use support::*;

/// A fresh database, and `squat`, a role with CREATE on it.
fn database_with_squatter(name: &str) -> postgres::Client {
    let mut db = fresh_database(name);
    db.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE squat LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT CREATE ON DATABASE {name} TO squat"
    ))
    .unwrap();
    db
}

/// `outbox migrate` as outbox_owner, which must refuse: what it said.
fn migrate_refused(database: &str) -> String {
    let output = outbox(&["migrate", "--database-url", &url("outbox_owner", database)]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "migrate refuses: {said}");
    assert!(said.contains("schema outbox is not, so nothing was installed"), "{said}");
    said
}

/// `outbox doctor` as `user`, which must find problems: what it said.
fn doctor_complains(user: &str, database: &str) -> String {
    let output = outbox(&["doctor", "--database-url", &url(user, database)]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(2), "doctor finds problems: {said}");
    said
}

/// How many outbox_migrations tables and outbox_… functions the database has, in any schema.
fn installed(db: &mut postgres::Client) -> (i64, i64) {
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM pg_class WHERE relname = 'outbox_migrations'),
                    (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE p.proname LIKE 'outbox\\_%' AND n.nspname <> 'pg_catalog')",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

const LOOK_ALIKE: &str = "CREATE FUNCTION outbox.outbox_enqueue(topic varchar, payload jsonb) RETURNS bigint
                          LANGUAGE sql AS 'SELECT 0::bigint'";

#[test]
fn migrate_refuses_a_schema_another_role_made_first_and_installs_nothing() {
    let mut db = database_with_squatter("outbox_t_squat_first");
    // The squatter makes the schema, lets every role create in it (so a migrate would succeed)
    // and plants what catches a call bound as JDBC binds a string.
    connect("squat", "outbox_t_squat_first")
        .batch_execute(&format!("CREATE SCHEMA outbox; GRANT USAGE, CREATE ON SCHEMA outbox TO PUBLIC; {LOOK_ALIKE}"))
        .unwrap();
    let said = migrate_refused("outbox_t_squat_first");
    for reason in [
        "schema outbox is owned by squat, not by outbox_owner, the role outbox migrate runs as: drop it, or have a superuser run ALTER SCHEMA outbox OWNER TO outbox_owner",
        "PUBLIC holds CREATE on SCHEMA outbox: REVOKE CREATE ON SCHEMA outbox FROM PUBLIC",
        "function outbox.outbox_enqueue(character varying,jsonb) is owned by squat, not by outbox_owner",
    ] {
        assert!(said.contains(reason), "migrate says why ({reason}):\n{said}");
    }
    assert_eq!(installed(&mut db), (0, 1), "nothing installed: no versions table anywhere, no function but the squatter's");
    let dry_run = outbox(&["migrate", "--dry-run", "--database-url", &url("outbox_owner", "outbox_t_squat_first")]);
    assert_eq!(dry_run.status.code(), Some(1), "a dry run refuses too: {}", text(&dry_run));
}

#[test]
fn migrate_refuses_a_schema_of_its_own_that_another_role_may_create_in() {
    let mut db = database_with_squatter("outbox_t_squat_grant");
    let mut owner = connect("outbox_owner", "outbox_t_squat_grant");
    owner.batch_execute("CREATE SCHEMA outbox; GRANT USAGE, CREATE ON SCHEMA outbox TO squat").unwrap();
    connect("squat", "outbox_t_squat_grant").batch_execute(LOOK_ALIKE).unwrap();
    let said = migrate_refused("outbox_t_squat_grant");
    assert!(said.contains("squat holds CREATE on SCHEMA outbox: REVOKE CREATE ON SCHEMA outbox FROM squat"), "{said}");
    assert!(!said.contains("is owned by squat, not by outbox_owner, the role"), "the schema is the owner's: {said}");

    // Revoked, the schema is still not the outbox's alone: the squatter's function is in it.
    owner.batch_execute("REVOKE CREATE ON SCHEMA outbox FROM squat").unwrap();
    let said = migrate_refused("outbox_t_squat_grant");
    assert!(said.contains("function outbox.outbox_enqueue(character varying,jsonb) is owned by squat, not by outbox_owner"), "{said}");
    assert!(!said.contains("holds CREATE"), "{said}");
    db.batch_execute("DROP FUNCTION outbox.outbox_enqueue(varchar, jsonb)").unwrap();

    owner.batch_execute("GRANT CREATE ON SCHEMA outbox TO PUBLIC").unwrap();
    let said = migrate_refused("outbox_t_squat_grant");
    assert!(said.contains("PUBLIC holds CREATE on SCHEMA outbox: REVOKE CREATE ON SCHEMA outbox FROM PUBLIC"), "{said}");
    assert_eq!(installed(&mut db), (0, 0), "nothing installed");

    // A member of the owning role is that role (it may SET ROLE to it): its CREATE is the
    // owner's, and an empty schema of the owner's own is installed into.
    owner.batch_execute("REVOKE CREATE ON SCHEMA outbox FROM PUBLIC; GRANT CREATE ON SCHEMA outbox TO outbox_relay").unwrap();
    migrate("outbox_t_squat_grant", &[]);
    assert!(outbox(&["doctor", "--database-url", &url("outbox_owner", "outbox_t_squat_grant")]).status.success());

    // A grant made after the install: doctor names it, and migrate refuses even with nothing to do.
    owner.batch_execute("GRANT CREATE ON SCHEMA outbox TO squat").unwrap();
    let said = doctor_complains("outbox_owner", "outbox_t_squat_grant");
    assert!(
        said.contains(
            "another role could change the outbox: squat holds CREATE on SCHEMA outbox: REVOKE CREATE ON SCHEMA outbox FROM squat"
        ),
        "{said}"
    );
    migrate_refused("outbox_t_squat_grant");
}

#[test]
fn doctor_names_a_look_alike_of_outbox_enqueue_and_any_other_object_on_the_sql_install() {
    // A look-alike the owner made, and one a role made while it had CREATE.
    database_with_squatter("outbox_t_look_alike");
    migrate("outbox_t_look_alike", &[]);
    let mut owner = connect("outbox_owner", "outbox_t_look_alike");
    owner
        .batch_execute(&format!(
            "{LOOK_ALIKE};
             CREATE FUNCTION outbox.outbox_peek(a integer, b integer) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             CREATE OPERATOR outbox.=== (LEFTARG = integer, RIGHTARG = integer, FUNCTION = outbox.outbox_peek);
             CREATE TYPE outbox.outbox_state AS ENUM ('a');
             GRANT USAGE, CREATE ON SCHEMA outbox TO squat"
        ))
        .unwrap();
    connect("squat", "outbox_t_look_alike")
        .batch_execute("CREATE FUNCTION outbox.outbox_enqueue(topic text, payload json) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'")
        .unwrap();
    owner.batch_execute("REVOKE CREATE ON SCHEMA outbox FROM squat").unwrap();
    let said = doctor_complains("outbox_owner", "outbox_t_look_alike");
    for drift in [
        "not part of the outbox: function outbox_enqueue(topic character varying, payload jsonb) returns bigint",
        "not part of the outbox: function outbox_enqueue(topic text, payload json) returns bigint",
        "not part of the outbox: object operator @extschema@.===(integer,integer)",
        "not part of the outbox: object type @extschema@.outbox_state",
        "another role could change the outbox: function outbox.outbox_enqueue(text,json) is owned by squat, not by outbox_owner",
    ] {
        assert!(said.contains(drift), "doctor names it ({drift}):\n{said}");
    }
    assert!(!said.contains("holds CREATE"), "{said}");
}

#[test]
fn doctor_names_a_look_alike_of_outbox_enqueue_on_the_extension_and_the_grant_that_let_it_in() {
    // The extension, in public: a look-alike of a role that may create there, which doctor
    // names with its grant; the database's own tables there are none of the outbox's business.
    let mut db = database_with_squatter("outbox_t_look_alike_ext");
    db.batch_execute("CREATE EXTENSION outbox_ext; CREATE TABLE public.orders (id bigint); GRANT CREATE ON SCHEMA public TO squat")
        .unwrap();
    connect("squat", "outbox_t_look_alike_ext").batch_execute(&LOOK_ALIKE.replace("outbox.", "public.")).unwrap();
    let said = doctor_complains("postgres", "outbox_t_look_alike_ext");
    for drift in [
        "not part of the outbox: function outbox_enqueue(topic character varying, payload jsonb) returns bigint",
        "another role could change the outbox: squat holds CREATE on SCHEMA public: REVOKE CREATE ON SCHEMA public FROM squat",
    ] {
        assert!(said.contains(drift), "doctor names it ({drift}):\n{said}");
    }
    assert!(!said.contains("orders"), "the database's own table is not the outbox's business: {said}");
}

#[test]
fn doctor_names_an_object_of_the_sql_install_given_to_another_role_and_a_trigger_grant() {
    let mut db = fresh_database("outbox_t_owners");
    migrate("outbox_t_owners", &[]);
    db.batch_execute(
        "ALTER FUNCTION outbox.outbox_requeue(bigint, text) OWNER TO app;
         ALTER TABLE outbox.outbox_endpoints OWNER TO app;
         GRANT TRIGGER ON outbox.outbox TO app",
    )
    .unwrap();
    let said = doctor_complains("outbox_owner", "outbox_t_owners");
    for drift in [
        "another role could change the outbox: function outbox.outbox_requeue(bigint,text) is owned by app, not by outbox_owner",
        "another role could change the outbox: table outbox.outbox_endpoints is owned by app, not by outbox_owner",
        "another role could change the outbox: app holds TRIGGER on TABLE outbox.outbox: REVOKE TRIGGER ON TABLE outbox.outbox FROM app",
    ] {
        assert!(said.contains(drift), "doctor names it ({drift}):\n{said}");
    }
}

#[test]
fn doctor_names_an_object_of_the_extension_given_to_another_role() {
    let mut db = fresh_database("outbox_t_owners_ext");
    db.batch_execute("CREATE EXTENSION outbox_ext; ALTER FUNCTION public.outbox_requeue(bigint, text) OWNER TO app").unwrap();
    let said = doctor_complains("postgres", "outbox_t_owners_ext");
    assert!(
        said.contains("another role could change the outbox: function public.outbox_requeue(bigint,text) is owned by app, not by postgres"),
        "{said}"
    );
}

/// Takes `role` out of pg_write_all_data again, whatever the test did: membership is the
/// cluster's, and the other tests' outboxes would count it.
struct WritesAllData(&'static str);

impl Drop for WritesAllData {
    fn drop(&mut self) {
        connect("postgres", "postgres").batch_execute(&format!("REVOKE pg_write_all_data FROM {}", self.0)).unwrap();
    }
}

#[test]
fn doctor_names_writes_on_the_sql_installs_tables_and_migrate_refuses_default_privileges_that_would_give_them() {
    let mut db = fresh_database("outbox_t_writes");
    migrate("outbox_t_writes", &[]);
    db.batch_execute(
        "GRANT UPDATE ON outbox.outbox_log_state TO app;
         GRANT UPDATE (max_attempts) ON outbox.outbox_limits TO app;
         DO $$ BEGIN CREATE ROLE writes_all; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT pg_write_all_data TO writes_all",
    )
    .unwrap();
    let member = WritesAllData("writes_all");
    let said = doctor_complains("outbox_owner", "outbox_t_writes");
    for drift in [
        "app holds UPDATE on TABLE outbox.outbox_log_state: REVOKE UPDATE ON TABLE outbox.outbox_log_state FROM app",
        "app holds UPDATE (max_attempts) on TABLE outbox.outbox_limits: REVOKE UPDATE (max_attempts) ON TABLE outbox.outbox_limits FROM app",
        "writes_all is a member of pg_write_all_data, which writes every table of schema outbox",
    ] {
        assert!(said.contains(drift), "doctor names it ({drift}):\n{said}");
    }
    // Each remedy, run as written, clears its complaint.
    db.batch_execute(
        "REVOKE UPDATE ON TABLE outbox.outbox_log_state FROM app;
         REVOKE UPDATE (max_attempts) ON TABLE outbox.outbox_limits FROM app",
    )
    .unwrap();
    drop(member);
    let output = outbox(&["doctor", "--database-url", &url("outbox_owner", "outbox_t_writes")]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    // Default privileges the owner was given would put grants on the tables migrate makes.
    let mut db = fresh_database("outbox_t_default_acl");
    db.batch_execute("ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner GRANT INSERT ON TABLES TO app").unwrap();
    let said = migrate_refused("outbox_t_default_acl");
    assert!(
        said.contains("the default privileges of outbox_owner give app INSERT on the tables it makes: ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner REVOKE INSERT ON TABLES FROM app"),
        "{said}"
    );
    assert_eq!(installed(&mut db), (0, 0), "nothing installed");
    db.batch_execute("ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner REVOKE INSERT ON TABLES FROM app").unwrap();
    migrate("outbox_t_default_acl", &[]);
}

#[test]
fn doctor_names_writes_on_the_extensions_tables_and_its_logs_partitions() {
    // The log's hourly partitions are no members of the extension, and a row inserted into one
    // is an event; a foreign key onto the outbox holds back its retention.
    let mut db = fresh_database("outbox_t_writes_ext");
    db.batch_execute(
        "CREATE EXTENSION outbox_ext; SELECT outbox_log_maintain();
         GRANT INSERT ON ALL TABLES IN SCHEMA public TO app;
         GRANT REFERENCES (id) ON public.outbox TO app",
    )
    .unwrap();
    let partition: String =
        db.query_one("SELECT c.relname::text FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid LIMIT 1", &[]).unwrap().get(0);
    let said = doctor_complains("postgres", "outbox_t_writes_ext");
    for drift in [
        format!("app holds INSERT on TABLE public.{partition}: REVOKE INSERT ON TABLE public.{partition} FROM app"),
        "app holds INSERT on TABLE public.outbox_log_state".to_string(),
        "app holds REFERENCES (id) on TABLE public.outbox: REVOKE REFERENCES (id) ON TABLE public.outbox FROM app".to_string(),
    ] {
        assert!(said.contains(&drift), "doctor names it ({drift}):\n{said}");
    }
}
