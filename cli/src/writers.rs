//! Who, besides the outbox's owner, could change what the outbox in a schema does: the schema's
//! owner, CREATE on it, the owners of the objects in it, TRIGGER or writes on its tables, the
//! owner's default privileges, pg_write_all_data (`sql/schema_writers.sql`). `outbox migrate` installs nothing while anyone could;
//! `outbox doctor` names each.
//!
//! Superusers can change anything anyway, so they do not count; nor do the members of the
//! owning role, which may SET ROLE to it and so are that role (the relay's login role is one).

use postgres::types::Type;
use postgres::GenericClient;

const WRITERS: &str = include_str!("../../sql/schema_writers.sql");

/// One way another role could change the outbox, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub problem: String,
    pub remedy: String,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.problem, self.remedy)
    }
}

/// Whose outbox the schema is meant to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The role connected, which `outbox migrate` runs as: the schema must be its own.
    Migrating,
    /// The SQL install's: whoever owns the schema.
    Schema,
    /// The extension's owner: only the extension's objects in its schema are looked at, as the
    /// schema may hold the database's other objects.
    Extension,
}

/// Every way a role other than `owner` could change what is in `schema` (its name unquoted,
/// as the catalog spells it); none if there is no such schema.
pub fn writers(client: &mut impl GenericClient, schema: &str, owner: Owner) -> Result<Vec<Writer>, postgres::Error> {
    let (migrating, extension) = (owner == Owner::Migrating, owner == Owner::Extension);
    let rows = client.query_typed(WRITERS, &[(&schema, Type::TEXT), (&migrating, Type::BOOL), (&extension, Type::BOOL)])?;
    Ok(rows.iter().map(|row| Writer { problem: row.get(0), remedy: row.get(1) }).collect())
}
