//! Connecting to the database, and finding the outbox in it: the extension, wherever it is
//! installed, or the SQL install in the schema given.

use std::str::FromStr;

use postgres::config::Host;
use postgres::types::Type;
use postgres::{Client, Config};

use crate::tls::{connector, take_tls, TlsError};
use outbox_core::statements::qualify;

const FIND_EXTENSION: &str = include_str!("../../sql/find_extension.sql");

/// The schema versions this binary runs against.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the database URL is not valid: {0}")]
    Url(postgres::Error),
    #[error("the database URL's TLS settings: {0}")]
    Tls(#[from] TlsError),
    #[error("cannot connect: {0}")]
    Connect(String),
}

/// Connects to `url` as `application_name` unless the URL names one (pg_stat_activity shows
/// it). No statement of ours depends on session state: a pooler in transaction mode may give
/// each transaction another server process. Every statement goes through `query_typed`, an
/// unnamed statement, never a named prepared one a pooler could not follow.
/// TLS as the URL's `sslmode` asks (crate::tls).
pub fn connect(url: &str, application_name: &str) -> Result<Client, ConnectError> {
    let (url, tls) = take_tls(url)?;
    let mut config = Config::from_str(&url).map_err(ConnectError::Url)?;
    if config.get_application_name().is_none() {
        config.application_name(application_name);
    }
    config.ssl_mode(tls.mode);
    config.connect(connector(&tls)?).map_err(|e| ConnectError::Connect(error_text(&e)))
}

/// The database `url` names, as a log line may show it: `postgres://user@host:port/database`,
/// rebuilt from what the URL parses to rather than masked in its text, so that no password can
/// reach the log however it was written (in the URL's user info, a `password=` pair of a
/// key=value string, quoted or not, or a `?password=` parameter).
pub fn describe(url: &str) -> String {
    let Some(config) = take_tls(url).ok().and_then(|(url, _)| Config::from_str(&url).ok()) else {
        return "a database URL that does not parse".to_string();
    };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(n, host)| {
            let name = match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]"),
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string().replace('/', "%2F"),
            };
            let port = ports.get(n).or(ports.first()).copied().unwrap_or(5432);
            format!("{name}:{port}")
        })
        .collect();
    let user = config.get_user().map(|user| format!("{user}@")).unwrap_or_default();
    format!("postgres://{user}{}/{}", hosts.join(","), config.get_dbname().unwrap_or(""))
}

/// A database error with its SQLSTATE, or what went wrong with the connection and why (a
/// TLS handshake fails for a reason the error's source gives).
pub fn error_text(error: &postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// An outbox found in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbox {
    /// Its schema, quoted for use in SQL.
    pub schema: String,
    /// The version of its schema.
    pub version: String,
    /// Its outbox_deliveries table's OID: the statements check that it is still the one they
    /// were made for (dropping and installing the outbox again gives a new one, and the same
    /// ids other events).
    pub deliveries: u32,
    /// The extension's install (else the SQL install), whose server settings the relay obeys
    /// as the workers do (crate::server_settings).
    pub extension: bool,
}

impl Outbox {
    /// `sql` naming the outbox's objects by its schema.
    pub fn qualify(&self, sql: &str) -> String {
        qualify(sql, &self.schema)
    }

    /// How this binary's version compares with the schema's.
    pub fn compatibility(&self) -> Compatibility {
        match (parse_version(&self.version), parse_version(VERSION)) {
            (Some(schema), Some(binary)) if schema == binary => Compatibility::Current,
            (Some(schema), Some(binary)) if schema < binary => Compatibility::Older,
            _ => Compatibility::Newer,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compatibility {
    Current,
    /// The schema waits for `outbox migrate` or `ALTER EXTENSION outbox_ext UPDATE`.
    Older,
    /// Written by a newer release than this binary: it must not touch it.
    Newer,
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|part| part.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// Whether `version` is one this binary is older than (or cannot read).
pub fn newer_than_binary(version: &str) -> bool {
    match (parse_version(version), parse_version(VERSION)) {
        (Some(schema), Some(binary)) => schema > binary,
        _ => true,
    }
}

/// The extension's schema and version, if this database has it.
pub fn find_extension(client: &mut Client) -> Result<Option<(String, String)>, postgres::Error> {
    Ok(client.query_typed_opt(FIND_EXTENSION, &[])?.map(|row| (row.get(0), row.get(1))))
}

/// The outbox in this database: the extension wherever it is, else the SQL install in
/// `schema`; `None` while there is neither.
pub fn find_outbox(client: &mut Client, schema: &str) -> Result<Option<Outbox>, postgres::Error> {
    if let Some(row) = client.query_typed_opt(FIND_EXTENSION, &[])? {
        let name: String = row.get(0);
        return Ok(Some(Outbox { schema: quote_ident(client, &name)?, version: row.get(1), deliveries: row.get(4), extension: true }));
    }
    let schema = quote_ident(client, schema)?;
    let Some(version) = crate::migrate::applied_version(client, &schema)? else {
        return Ok(None);
    };
    let deliveries: Option<u32> = client
        .query_typed_one("SELECT pg_catalog.to_regclass($1)::pg_catalog.oid", &[(&format!("{schema}.outbox_deliveries"), Type::TEXT)])?
        .get(0);
    Ok(Some(Outbox { schema, version, deliveries: deliveries.unwrap_or(0), extension: false }))
}

pub fn quote_ident(client: &mut Client, name: &str) -> Result<String, postgres::Error> {
    Ok(client.query_typed_one("SELECT pg_catalog.quote_ident($1)", &[(&name, Type::TEXT)])?.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(version: &str) -> Outbox {
        Outbox { schema: "public".into(), version: version.into(), deliveries: 1, extension: false }
    }

    #[test]
    fn a_described_url_never_shows_its_password() {
        for (url, described) in [
            ("postgres://ops:s3cret@127.0.0.1:5433/app", "postgres://ops@127.0.0.1:5433/app"),
            ("postgresql://ops:s3%40cret@db.example/app?sslmode=require", "postgres://ops@db.example:5432/app"),
            ("postgres://ops@127.0.0.1/app?password=s3cret&application_name=x", "postgres://ops@127.0.0.1:5432/app"),
            ("postgres://ops@127.0.0.1/app?application_name=x&password=s3cret", "postgres://ops@127.0.0.1:5432/app"),
            ("host=127.0.0.1 port=5433 user=ops password=s3cret dbname=app", "postgres://ops@127.0.0.1:5433/app"),
            ("host=127.0.0.1 user=ops password='s3cret with spaces' dbname=app", "postgres://ops@127.0.0.1:5432/app"),
            ("host=a,b port=1,2 user=ops password=s3cret dbname=app", "postgres://ops@a:1,b:2/app"),
            ("host=/run/postgresql user=ops password=s3cret", "postgres://ops@%2Frun%2Fpostgresql:5432/"),
            ("postgres://ops:s3cret@[::1]:5433/app", "postgres://ops@[::1]:5433/app"),
            ("postgres://ops:s3cret@127.0.0.1:notaport/app", "a database URL that does not parse"),
            ("host=127.0.0.1 password='s3cret", "a database URL that does not parse"),
        ] {
            assert_eq!(describe(url), described, "{url}");
        }
    }

    #[test]
    fn a_schema_newer_than_the_binary_is_never_touched() {
        assert_eq!(outbox(VERSION).compatibility(), Compatibility::Current);
        assert_eq!(outbox("0.2.0").compatibility(), Compatibility::Older);
        assert_eq!(outbox("0.10.0").compatibility(), Compatibility::Newer);
        assert_eq!(outbox("1.0.0").compatibility(), Compatibility::Newer);
        assert_eq!(outbox("1.0").compatibility(), Compatibility::Newer, "what it cannot read, it does not touch");
    }
}
