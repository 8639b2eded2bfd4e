//! `outbox doctor`: compares the outbox in a database with what its version should be — its
//! functions (definitions and whether PUBLIC may run them), tables, columns, constraints,
//! indexes, and whatever else is in its schema, look-alikes of its functions among them — and
//! lists every difference, and every role but its owner that could change it
//! (cli/src/writers.rs), for a deploy pipeline to stop on.
//!
//! What it should be is made, not stored: the version's SQL install is run into a scratch schema
//! in a transaction that is rolled back, and both are described by `sql/describe.sql`.

use std::collections::BTreeMap;

use postgres::types::Type;

use crate::connection::{connect, find_extension, find_outbox, VERSION};
use crate::migrate::MigrateError;
use crate::options::DatabaseOptions;
use crate::script::{self, RELEASED};
use crate::writers::{writers, Owner};

const DESCRIBE: &str = include_str!("../../sql/describe.sql");
/// The functions the extension's library provides, which the SQL install writes in SQL: for the
/// extension, compared by signature.
const LIBRARY_FUNCTIONS: [&str; 5] =
    ["outbox_enqueue", "outbox_load_settings", "outbox_workers", "outbox_worker_attempts", "outbox_enqueued"];

/// One difference between the database and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    Missing(String),
    Unexpected(String),
    Changed(String),
    /// A role other than the outbox's owner could change it: the way, and what to do.
    Writable(String),
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::Missing(what) => write!(f, "missing: {what}"),
            Drift::Unexpected(what) => write!(f, "not part of the outbox: {what}"),
            Drift::Changed(what) => write!(f, "differs from its version: {what}"),
            Drift::Writable(what) => write!(f, "another role could change the outbox: {what}"),
        }
    }
}

/// The outbox's schema and version, and every difference found.
pub fn run(options: &DatabaseOptions) -> Result<(String, String, Vec<Drift>), MigrateError> {
    let mut client = connect(&options.database_url, "outbox doctor")?;
    let extension = find_extension(&mut client)?.is_some();
    let Some(outbox) = find_outbox(&mut client, &options.schema)? else {
        return Err(MigrateError::Database(format!(
            "no outbox here: neither the extension nor a SQL install in schema {}",
            options.schema
        )));
    };
    let expected_script = |schema: &str| -> Result<String, MigrateError> {
        if outbox.version == VERSION {
            return Ok(script::install(schema));
        }
        let (_, released) = RELEASED
            .iter()
            .find(|(version, _)| *version == outbox.version)
            .ok_or_else(|| MigrateError::UnknownVersion(outbox.version.clone()))?;
        Ok(script::released(released, schema))
    };
    let scratch = format!("outbox_doctor_{}", std::process::id());
    let by_signature: Vec<String> = if extension { LIBRARY_FUNCTIONS.map(String::from).to_vec() } else { Vec::new() };
    let mut transaction = client.transaction()?;
    transaction.batch_execute(&format!("CREATE SCHEMA {scratch}; SET LOCAL search_path = {scratch}"))?;
    transaction.batch_execute(&expected_script(&scratch)?)?;
    // Both sides described with every name qualified.
    transaction.batch_execute("SET LOCAL search_path = pg_catalog")?;
    let mut describe = |schema: &str, members_only: bool| -> Result<Vec<String>, postgres::Error> {
        let rows =
            transaction.query_typed(DESCRIBE, &[(&schema, Type::TEXT), (&by_signature, Type::TEXT_ARRAY), (&members_only, Type::BOOL)])?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    };
    let actual_schema: String = unquote(&outbox.schema);
    // Each side names its own schema @extschema@; the expected side is also made to, wherever
    // the outbox's schema name happens to appear in its text ('outbox.max_attempts' in a
    // schema named outbox), as it does in the actual side.
    let expected: Vec<String> = describe(&scratch, false)?
        .into_iter()
        .map(|line| line.replace(&format!("{}.", outbox.schema), "@extschema@.").replace(&format!("{actual_schema}."), "@extschema@."))
        .collect();
    let actual = describe(&actual_schema, extension)?;
    let mut drift = compare(&expected, &actual);
    let owner = if extension { Owner::Extension } else { Owner::Schema };
    drift.extend(writers(&mut transaction, &actual_schema, owner)?.iter().map(|w| Drift::Writable(w.to_string())));
    drift.extend(log_objects(&mut transaction, &outbox.schema)?);
    transaction.rollback()?;
    Ok((outbox.schema, outbox.version, drift))
}

/// Log mode's publication and slot, where they exist, if they are not the outbox's own
/// (sql/log.sql): a role with CREATE on the database, or REPLICATION, can make one of the name
/// first, which log mode refuses to read.
fn log_objects(transaction: &mut postgres::Transaction<'_>, schema: &str) -> Result<Vec<Drift>, postgres::Error> {
    let statement = outbox_core::statements::qualify(
        "SELECT s.publication::text, @extschema@.outbox_log_publication_problem(s.publication), s.slot::text,
                @extschema@.outbox_log_slot_state() OPERATOR(pg_catalog.=) 'foreign'
           FROM @extschema@.outbox_log_state AS s",
        schema,
    );
    let mut drift = Vec::new();
    for row in transaction.query_typed(&statement, &[])? {
        if let Some(problem) = row.get::<_, Option<String>>(1) {
            drift.push(Drift::Changed(format!("publication {}: not the outbox's own: {problem}", row.get::<_, String>(0))));
        }
        if row.get::<_, bool>(3) {
            drift.push(Drift::Changed(format!("replication slot {}: not one the outbox made", row.get::<_, String>(2))));
        }
    }
    Ok(drift)
}

/// A quoted identifier as the catalog spells it.
fn unquote(quoted: &str) -> String {
    quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')).map_or(quoted.to_string(), |q| q.replace("\"\"", "\""))
}

/// The differences between two descriptions, each object named by its first line.
fn compare(expected: &[String], actual: &[String]) -> Vec<Drift> {
    let by_name = |lines: &[String]| -> BTreeMap<String, String> {
        lines.iter().map(|line| (line.lines().next().unwrap_or_default().to_string(), line.clone())).collect()
    };
    let (expected, actual) = (by_name(expected), by_name(actual));
    let mut drift = Vec::new();
    for (name, text) in &expected {
        match actual.get(name) {
            None => drift.push(Drift::Missing(name.clone())),
            Some(found) if found != text => drift.push(Drift::Changed(first_difference(name, text, found))),
            Some(_) => {}
        }
    }
    drift.extend(actual.keys().filter(|name| !expected.contains_key(*name)).map(|name| Drift::Unexpected(name.clone())));
    drift
}

/// `name`, with the first line where the two texts part.
fn first_difference(name: &str, expected: &str, found: &str) -> String {
    let mut lines = expected.lines().zip(found.lines());
    match lines.find(|(a, b)| a != b) {
        Some((a, b)) => format!("{name}\n    expected: {}\n    found:    {}", a.trim(), b.trim()),
        None => format!("{name}\n    (one has more lines than the other)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_named_by_their_object() {
        let expected =
            ["index CREATE INDEX a ON t (x)".to_string(), "function f() returns int\nbody 1\nPUBLIC may execute: false".to_string()];
        let actual = ["function f() returns int\nbody 1\nPUBLIC may execute: true".to_string(), "relation extra kind r".to_string()];
        let drift = compare(&expected, &actual);
        assert_eq!(drift.len(), 3, "{drift:?}");
        assert_eq!(
            drift[0],
            Drift::Changed(
                "function f() returns int\n    expected: PUBLIC may execute: false\n    found:    PUBLIC may execute: true".into()
            )
        );
        assert_eq!(drift[1], Drift::Missing("index CREATE INDEX a ON t (x)".into()));
        assert_eq!(drift[2], Drift::Unexpected("relation extra kind r".into()));
        assert!(compare(&expected, &expected).is_empty());
    }
}
