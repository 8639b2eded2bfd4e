//! Where the extension lives: its objects are in the schema CREATE EXTENSION chose, which
//! need not be on the caller's (or the worker's) search_path.

use pgrx::spi::{SpiClient, SpiResult};

const FIND_EXTENSION: &str = include_str!("../sql/find_extension.sql");

/// The extension's schema, quoted for use in SQL; `None` while it is not installed.
pub fn extension_schema(client: &SpiClient<'_>) -> SpiResult<Option<String>> {
    let schema: Option<String> = client.select(FIND_EXTENSION, None, &[])?.first().get_one()?;
    Ok(schema.map(pgrx::spi::quote_identifier))
}
