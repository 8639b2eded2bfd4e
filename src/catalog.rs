//! Where the extension lives: its objects are in the schema CREATE EXTENSION chose, which
//! need not be on the caller's (or the worker's) search_path.

use pgrx::spi::{SpiClient, SpiResult};

const FIND_EXTENSION: &str = include_str!("../sql/find_extension.sql");

/// The library's version: the schema version the workers and `outbox_enqueue` are written for.
pub const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// An installed outbox_ext in the current database.
#[derive(Debug, Clone, PartialEq)]
pub struct Installation {
    /// The extension's schema, quoted for use in SQL.
    pub schema: String,
    /// `pg_extension.extversion`: which version's schema is installed.
    pub version: String,
    /// `pg_extension.oid`: a new one after DROP and CREATE EXTENSION.
    pub oid: pgrx::pg_sys::Oid,
    /// The schema's OID.
    pub namespace: pgrx::pg_sys::Oid,
    /// The outbox_deliveries table's OID, which the relay's statements check: a new one after
    /// DROP and CREATE EXTENSION.
    pub deliveries: pgrx::pg_sys::Oid,
}

impl Installation {
    /// Looks the extension up; `None` while it is not installed.
    pub fn find(client: &SpiClient<'_>) -> SpiResult<Option<Installation>> {
        let rows = client.select(FIND_EXTENSION, Some(1), &[])?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        let (schema, version) = (row.get::<String>(1)?, row.get::<String>(2)?);
        Ok(Some(Installation {
            schema: pgrx::spi::quote_identifier(schema.unwrap_or_default()),
            version: version.unwrap_or_default(),
            oid: row.get::<pgrx::pg_sys::Oid>(3)?.unwrap_or(pgrx::pg_sys::InvalidOid),
            namespace: row.get::<pgrx::pg_sys::Oid>(4)?.unwrap_or(pgrx::pg_sys::InvalidOid),
            deliveries: row.get::<pgrx::pg_sys::Oid>(5)?.unwrap_or(pgrx::pg_sys::InvalidOid),
        }))
    }

    /// True when the installed schema is the one this library was built for; otherwise
    /// `ALTER EXTENSION outbox_ext UPDATE` has yet to run.
    pub fn is_current(&self) -> bool {
        self.version == LIBRARY_VERSION
    }

    /// `sql` with `@extschema@` replaced by the extension's schema, as CREATE EXTENSION does
    /// for the install scripts.
    pub fn qualify(&self, sql: &str) -> String {
        outbox_core::statements::qualify(sql, &self.schema)
    }
}
