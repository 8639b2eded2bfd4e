//! `outbox migrate`: installs the outbox as plain SQL into a schema, or upgrades it, with the
//! same steps `CREATE EXTENSION` and `ALTER EXTENSION … UPDATE` run (cli/src/script.rs).
//!
//! Versioned: `<schema>.outbox_migrations` holds each version applied. Each step is one
//! transaction that first takes an advisory lock and reads the version again, so two deploys
//! migrating at once apply each step once; a step that fails leaves nothing of itself.
//!
//! It installs only into a schema of the role it runs as, which no other role can write
//! (cli/src/writers.rs): checked before anything is done, and again in each step's transaction
//! once the schema exists, so a schema another role makes in between is not adopted.

use std::time::Instant;

use postgres::types::Type;
use postgres::Client;

use crate::connection::{connect, find_extension, quote_ident, VERSION};
use crate::options::DatabaseOptions;
use crate::output;
use crate::script::{self, RELEASED, UPDATES};
use crate::writers::{writers, Owner, Writer};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Connect(#[from] crate::connection::ConnectError),
    #[error("{0}")]
    Database(String),
    #[error(
        "this database has the outbox_ext extension (schema {schema}, version {version}): it is upgraded with ALTER EXTENSION outbox_ext UPDATE, not outbox migrate"
    )]
    HasExtension { schema: String, version: String },
    #[error("the outbox in schema {schema} is version {version}, newer than this binary ({VERSION}): nothing to do here")]
    Newer { schema: String, version: String },
    #[error("no way from version {from} to {to}: this binary knows the updates {known}")]
    NoPath { from: String, to: String, known: String },
    #[error("version {0} cannot be installed by this binary: it installs {VERSION} and the released {released}", released = RELEASED.map(|(v, _)| v).join(", "))]
    UnknownVersion(String),
    #[error(
        "outbox migrate installs only into a schema of the role it runs as that no other role can write; schema {schema} is not, so nothing was installed:{}",
        writers.iter().map(|w| format!("\n  - {w}")).collect::<String>()
    )]
    Writable { schema: String, writers: Vec<Writer> },
}

impl From<postgres::Error> for MigrateError {
    fn from(error: postgres::Error) -> MigrateError {
        MigrateError::Database(match error.as_db_error() {
            Some(db) => {
                let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
                if let Some(detail) = db.detail() {
                    text.push_str(&format!("\nDETAIL: {detail}"));
                }
                if let Some(hint) = db.hint() {
                    text.push_str(&format!("\nHINT: {hint}"));
                }
                text
            }
            None => error.to_string(),
        })
    }
}

/// One step: the version it starts from (`None`: a fresh install), the one it ends at, and
/// its SQL.
pub struct Step {
    pub from: Option<String>,
    pub to: String,
    pub sql: String,
}

/// Runs (or with `dry_run` prints) the steps that bring the outbox in the schema to `target`
/// (this binary's version by default).
pub fn run(options: &DatabaseOptions, target: Option<&str>, dry_run: bool) -> Result<(), MigrateError> {
    let mut client = connect(&options.database_url, "outbox migrate")?;
    if let Some((schema, version)) = find_extension(&mut client)? {
        return Err(MigrateError::HasExtension { schema, version });
    }
    let schema = quote_ident(&mut client, &options.schema)?;
    refuse_writers(&mut client, &schema, &options.schema)?;
    let target = target.unwrap_or(VERSION).to_string();
    let mut stepped = false;
    loop {
        let current = applied_version(&mut client, &schema)?;
        let Some(step) = next_step(current.as_deref(), &target, &schema)? else {
            match current {
                Some(version) if stepped => output::say(&format!("outbox migrate: the outbox in schema {schema} is at version {version}")),
                Some(version) => {
                    output::say(&format!("outbox migrate: the outbox in schema {schema} is at version {version}: nothing to do"))
                }
                None => output::say("outbox migrate: nothing to do"),
            }
            return Ok(());
        };
        if dry_run {
            let mut text = transaction_text(&step, &schema);
            // The steps after this one, as they would run.
            let mut current = step.to.clone();
            while let Some(step) = next_step(Some(&current), &target, &schema)? {
                text.push_str(&transaction_text(&step, &schema));
                current = step.to;
            }
            // A reader that stops early (| head) is no error.
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
            return Ok(());
        }
        let started = Instant::now();
        match &step.from {
            None => output::say(&format!("outbox migrate: installing version {} into schema {schema}", step.to)),
            Some(from) => output::say(&format!("outbox migrate: upgrading schema {schema} from {from} to {}", step.to)),
        }
        if apply(&mut client, &step, &schema, &options.schema)? {
            output::say(&format!("outbox migrate: version {} done in {:.1} s", step.to, started.elapsed().as_secs_f64()));
            stepped = true;
        }
    }
}

/// The step from `current` towards `target`, or `None` when there is nothing to do.
fn next_step(current: Option<&str>, target: &str, schema: &str) -> Result<Option<Step>, MigrateError> {
    let Some(current) = current else {
        let sql = if target == VERSION {
            script::install(schema)
        } else {
            let (_, released) =
                RELEASED.iter().find(|(version, _)| *version == target).ok_or_else(|| MigrateError::UnknownVersion(target.into()))?;
            script::released(released, schema)
        };
        return Ok(Some(Step { from: None, to: target.to_string(), sql }));
    };
    if current == target {
        return Ok(None);
    }
    if let Some((_, to, sql)) = UPDATES.iter().find(|(from, _, _)| *from == current) {
        return Ok(Some(Step {
            from: Some(current.to_string()),
            to: to.to_string(),
            sql: script::for_sql_install(sql, schema, *to == VERSION),
        }));
    }
    if crate::connection::newer_than_binary(current) {
        return Err(MigrateError::Newer { schema: schema.to_string(), version: current.to_string() });
    }
    Err(MigrateError::NoPath {
        from: current.to_string(),
        to: target.to_string(),
        known: UPDATES.map(|(from, to, _)| format!("{from} → {to}")).join(", "),
    })
}

/// Fails, naming each, if a role other than the one connected could change what is in the
/// schema (`name`, unquoted; `schema`, quoted, for the message).
fn refuse_writers(client: &mut impl postgres::GenericClient, schema: &str, name: &str) -> Result<(), MigrateError> {
    let writers = writers(client, name, Owner::Migrating)?;
    if writers.is_empty() {
        return Ok(());
    }
    Err(MigrateError::Writable { schema: schema.to_string(), writers })
}

/// The transaction a step runs, as `--dry-run` prints it.
fn transaction_text(step: &Step, schema: &str) -> String {
    let from = step.from.as_deref().map_or("NULL".to_string(), |v| format!("'{v}'"));
    format!(
        "-- outbox migrate: {} {}\nBEGIN;\nSELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('outbox migrate'));\n\
         -- (the version is read again here; the step is skipped if it is no longer {from})\n{}\
         -- (the schema is checked here: nothing is installed unless it is this role's and no other role can write it)\n{}\n{}\n{}\nCOMMIT;\n",
        step.from.as_deref().map_or("install".to_string(), |v| format!("upgrade from {v}")),
        step.to,
        create_schema(step, schema),
        prologue(step, schema),
        step.sql,
        record(step, schema)
    )
}

/// A fresh install's schema, unless it exists (then it is checked, not adopted blindly).
fn create_schema(step: &Step, schema: &str) -> String {
    match step.from {
        Some(_) => String::new(),
        None => format!("CREATE SCHEMA IF NOT EXISTS {schema};\n"),
    }
}

/// Before a fresh install: the versions table. Which version is installed is no secret
/// (pg_extension shows the extension's to every role): every role the schema lets in may read
/// it, so a console or relay of any role finds the outbox.
fn prologue(step: &Step, schema: &str) -> String {
    // As CREATE EXTENSION and ALTER EXTENSION … UPDATE run their scripts: names not qualified
    // resolve to the outbox's schema (and pg_catalog, always searched first).
    let search_path = format!("SET LOCAL search_path = {schema};\n");
    if step.from.is_some() {
        return search_path;
    }
    format!(
        "{search_path}\
         CREATE TABLE {schema}.outbox_migrations (\n    version    text PRIMARY KEY,\n    \
         applied_at timestamptz NOT NULL DEFAULT pg_catalog.now(),\n    applied_by name NOT NULL DEFAULT CURRENT_USER);\n\
         COMMENT ON TABLE {schema}.outbox_migrations IS 'The versions of the outbox that outbox migrate applied here, one row each.';\n\
         GRANT SELECT ON {schema}.outbox_migrations TO PUBLIC;\n"
    )
}

fn record(step: &Step, schema: &str) -> String {
    format!("INSERT INTO {schema}.outbox_migrations (version) VALUES ('{}');", step.to)
}

/// Applies `step` in one transaction, under the advisory lock; false if another migrate got
/// there first (the version is no longer the step's starting one).
fn apply(client: &mut Client, step: &Step, schema: &str, schema_name: &str) -> Result<bool, MigrateError> {
    let mut transaction = client.transaction()?;
    transaction.batch_execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('outbox migrate'))")?;
    // Read from pg_class with this statement's snapshot: the table may have been created by
    // the migrate this one waited for, which the name caches need not know yet.
    let exists: bool = transaction
        .query_typed_one(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                             WHERE c.relname OPERATOR(pg_catalog.=) 'outbox_migrations' AND n.nspname OPERATOR(pg_catalog.=) $1)",
            &[(&schema_name, Type::TEXT)],
        )?
        .get(0);
    let current = if exists { newest(&mut transaction, schema)? } else { None };
    if current != step.from {
        return Ok(false);
    }
    transaction.batch_execute(&create_schema(step, schema))?;
    refuse_writers(&mut transaction, schema, schema_name)?;
    transaction.batch_execute(&prologue(step, schema))?;
    transaction.batch_execute(&step.sql)?;
    transaction.batch_execute(&record(step, schema))?;
    transaction.commit()?;
    Ok(true)
}

/// The newest version applied in the schema, or `None` if it has no outbox.
pub fn applied_version(client: &mut Client, schema: &str) -> Result<Option<String>, postgres::Error> {
    let exists: bool = client
        .query_typed_one("SELECT pg_catalog.to_regclass($1) IS NOT NULL", &[(&format!("{schema}.outbox_migrations"), Type::TEXT)])?
        .get(0);
    if !exists {
        return Ok(None);
    }
    newest(client, schema)
}

fn newest(client: &mut impl postgres::GenericClient, schema: &str) -> Result<Option<String>, postgres::Error> {
    let sql = format!(
        "SELECT version FROM {schema}.outbox_migrations \
          ORDER BY pg_catalog.string_to_array(version, '.')::pg_catalog.int4[] DESC LIMIT 1"
    );
    Ok(client.query_typed_opt(&sql, &[])?.map(|row| row.get(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_install_is_one_step_and_an_upgrade_follows_the_update_scripts() {
        let install = next_step(None, VERSION, "app").unwrap().unwrap();
        assert_eq!((install.from, install.to.as_str()), (None, VERSION));
        assert!(install.sql.contains("CREATE TABLE app.outbox"));
        let older = next_step(None, "0.2.0", "app").unwrap().unwrap();
        assert!(older.sql.contains("CREATE TABLE app.outbox") && !older.sql.contains("app.outbox_enqueue"), "0.2.0 had no SQL enqueue");
        let update = next_step(Some("0.2.0"), VERSION, "app").unwrap().unwrap();
        assert_eq!((update.from.as_deref(), update.to.as_str()), (Some("0.2.0"), "0.3.0"), "one release at a time");
        assert!(next_step(Some(VERSION), VERSION, "app").unwrap().is_none());
        assert!(matches!(next_step(Some("9.0.0"), VERSION, "app"), Err(MigrateError::Newer { .. })));
        assert!(matches!(next_step(Some("0.1.5"), VERSION, "app"), Err(MigrateError::NoPath { .. })));
        assert!(matches!(next_step(None, "0.1.0", "app"), Err(MigrateError::UnknownVersion(_))));
    }

    #[test]
    fn a_dry_run_shows_the_lock_the_script_and_the_version_recorded() {
        let step = next_step(None, VERSION, "app").unwrap().unwrap();
        let text = transaction_text(&step, "app");
        assert!(text.starts_with(&format!("-- outbox migrate: install {VERSION}\nBEGIN;\nSELECT pg_catalog.pg_advisory_xact_lock")));
        assert!(text.contains("CREATE TABLE app.outbox_migrations"));
        assert!(text.ends_with(&format!("INSERT INTO app.outbox_migrations (version) VALUES ('{VERSION}');\nCOMMIT;\n")));
    }
}
