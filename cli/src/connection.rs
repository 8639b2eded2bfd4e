//! Connecting to the database, and finding the outbox in it: the extension, wherever it is
//! installed, or the SQL install in the schema given.
//!
//! A database URL is made whole as libpq makes it: what the URL leaves out comes from libpq's
//! environment variables, and a password it does not give from `PGPASSWORD`, else from the
//! password file (crate::pgpass). Every connection of every command is made from `target`.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use postgres::config::Host;
use postgres::error::SqlState;
use postgres::types::Type;
use postgres::{Client, Config};

use crate::output;
use crate::pgpass::{self, Wanted};
use crate::tls::{connector, take_tls, Tls, TlsError};
use outbox_core::statements::qualify;

const FIND_EXTENSION: &str = include_str!("../../sql/find_extension.sql");

/// The schema versions this binary runs against.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The variables of libpq's that this binary reads as libpq does (`target`, crate::tls); a
/// configuration file may set them too (crate::options).
pub const LIBPQ_VARIABLES: [&str; 8] =
    ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD", "PGPASSFILE", "PGSSLMODE", "PGSSLROOTCERT"];

/// Where libpq looks for a server's Unix socket when neither the URL nor `PGHOST` names a host
/// (Debian's libpq, and PostgreSQL's packages for most distributions).
const DEFAULT_SOCKET_DIRECTORY: &str = "/var/run/postgresql";

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the database URL is not valid: {0}")]
    Url(postgres::Error),
    #[error("the database URL's TLS settings: {0}")]
    Tls(#[from] TlsError),
    #[error("{0}")]
    Environment(String),
    #[error("cannot connect: {0}")]
    Connect(String),
}

/// A connection's settings, made whole.
#[derive(Debug)]
pub struct Target {
    pub config: Config,
    pub tls: Tls,
    /// The password file the password was taken from, if it was: named when the server refuses
    /// the password, as libpq names it.
    pub password_file: Option<PathBuf>,
}

/// `url` (a `postgres://` URL or a `key=value` connection string) made whole as libpq does:
/// `PGHOST` (else the Unix socket in /var/run/postgresql), `PGPORT` (else 5432), `PGUSER`
/// (else the operating system's user), `PGDATABASE` (else the user's name) for what the URL
/// leaves out; the password from the URL, else `PGPASSWORD`, else the password file
/// (`PGPASSFILE`, else `~/.pgpass`); `sslmode` and `sslrootcert` from the URL, else
/// `PGSSLMODE` and `PGSSLROOTCERT` (crate::tls). No other variable of libpq's is read.
pub fn target(url: &str) -> Result<Target, ConnectError> {
    target_with(url, &|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
}

fn target_with(url: &str, environment: &dyn Fn(&str) -> Option<String>) -> Result<Target, ConnectError> {
    let (mut url, tls) = take_tls(url)?;
    let ports = environment("PGPORT").map(|ports| parse_ports(&ports)).transpose()?;
    if let Some(ports) = &ports {
        url = url_with_ports(&url, ports)?;
    }
    let mut config = Config::from_str(&url).map_err(ConnectError::Url)?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        match environment("PGHOST") {
            Some(hosts) => hosts.split(',').for_each(|host| {
                config.host(host.trim());
            }),
            None => {
                config.host_path(DEFAULT_SOCKET_DIRECTORY);
            }
        }
    }
    if config.get_ports().is_empty() {
        ports.iter().flatten().for_each(|port| {
            config.port(*port);
        });
    }
    let user = match (config.get_user().map(str::to_string), environment("PGUSER")) {
        (Some(user), _) | (None, Some(user)) => user,
        (None, None) => whoami::username()
            .map_err(|e| ConnectError::Environment(format!("no user in the database URL nor in PGUSER, and the system's: {e}")))?,
    };
    config.user(&user);
    if config.get_dbname().is_none() {
        config.dbname(&environment("PGDATABASE").unwrap_or_else(|| user.clone()));
    }
    let mut password_file = None;
    if config.get_password().is_none_or(<[u8]>::is_empty) {
        if let Some(password) = environment("PGPASSWORD") {
            config.password(password);
        } else if let Some(path) =
            environment("PGPASSFILE").map(PathBuf::from).or_else(|| environment("HOME").map(|home| Path::new(&home).join(".pgpass")))
        {
            match password_from_file(&path, &config) {
                Ok(Some(password)) if !password.is_empty() => {
                    config.password(password);
                    password_file = Some(path);
                }
                Ok(_) => {}
                Err(e) => warn_once(e.to_string()),
            }
        }
    }
    Ok(Target { config, tls, password_file })
}

fn parse_ports(ports: &str) -> Result<Vec<u16>, ConnectError> {
    let port = |port: &str| port.trim().parse().map_err(|_| ConnectError::Environment(format!("PGPORT: {port:?} is not a port number")));
    ports.split(',').map(port).collect()
}

/// `url` with `ports` (PGPORT) given to its hosts, if it is a `postgres://` URL whose hosts
/// name no port: as libpq would connect, where rust-postgres takes 5432 for such a host.
fn url_with_ports(url: &str, ports: &[u16]) -> Result<String, ConnectError> {
    let Some(scheme_end) = url.find("://").filter(|_| url.starts_with("postgres://") || url.starts_with("postgresql://")) else {
        return Ok(url.to_string());
    };
    let authority_start = scheme_end + 3;
    let authority_end = url[authority_start..].find(['/', '?']).map_or(url.len(), |n| authority_start + n);
    let hosts_start = url[authority_start..authority_end].rfind('@').map_or(authority_start, |n| authority_start + n + 1);
    let hosts = &url[hosts_start..authority_end];
    let names_port = |host: &str| match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').is_some_and(|(_, after)| after.starts_with(':')),
        None => host.contains(':'),
    };
    if hosts.is_empty() || hosts.split(',').any(names_port) {
        return Ok(url.to_string());
    }
    let hosts: Vec<&str> = hosts.split(',').collect();
    if ports.len() != 1 && ports.len() != hosts.len() {
        return Err(ConnectError::Environment(format!("PGPORT names {} ports for the URL's {} hosts", ports.len(), hosts.len())));
    }
    let with_ports: Vec<String> = hosts.iter().enumerate().map(|(i, host)| format!("{host}:{}", ports[i.min(ports.len() - 1)])).collect();
    Ok(format!("{}{}{}", &url[..hosts_start], with_ports.join(","), &url[authority_end..]))
}

/// The password the file at `path` holds for the first host of `config` (a connection to
/// several hosts takes one password): as libpq, `localhost` stands for a Unix socket, and 5432
/// for no port.
fn password_from_file(path: &Path, config: &Config) -> Result<Option<String>, pgpass::PasswordFileError> {
    let host = match (config.get_hosts().first(), config.get_hostaddrs().first()) {
        (Some(Host::Tcp(host)), _) => host.clone(),
        (None, Some(address)) => address.to_string(),
        _ => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let (database, user) = (config.get_dbname().unwrap_or_default(), config.get_user().unwrap_or_default());
    pgpass::read(path, Wanted { host: &host, port: &port, database, user })
}

/// Says `text` on standard error, once per process: a relay connects again and again.
fn warn_once(text: String) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if !said.contains(&text) {
        output::say(&format!("outbox: warning: {text}"));
        said.push(text);
    }
}

/// Connects to `url` (made whole by `target`) as `application_name` unless the URL names one
/// (pg_stat_activity shows it). No statement of ours depends on session state: a pooler in
/// transaction mode may give each transaction another server process. Every statement goes
/// through `query_typed`, an unnamed statement, never a named prepared one a pooler could not
/// follow. TLS as the URL's `sslmode` asks (crate::tls).
pub fn connect(url: &str, application_name: &str) -> Result<Client, ConnectError> {
    let Target { mut config, tls, password_file } = target(url)?;
    if config.get_application_name().is_none() {
        config.application_name(application_name);
    }
    config.ssl_mode(tls.mode);
    config.connect(connector(&tls)?).map_err(|e| {
        let mut text = error_text(&e);
        if let (Some(path), Some(&SqlState::INVALID_PASSWORD)) = (password_file, e.code()) {
            text.push_str(&format!(" (password retrieved from file \"{}\")", path.display()));
        }
        ConnectError::Connect(text)
    })
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

    fn target_in(url: &str, variables: &[(&str, &str)]) -> Result<Target, ConnectError> {
        target_with(url, &|name| variables.iter().find(|(n, _)| *n == name).map(|(_, value)| value.to_string()))
    }

    fn password(target: &Target) -> &str {
        std::str::from_utf8(target.config.get_password().unwrap_or_default()).unwrap()
    }

    #[test]
    fn what_the_url_leaves_out_comes_from_libpq_variables_and_the_url_wins() {
        let variables = [("PGHOST", "db.example,/run/pg"), ("PGPORT", "6432,5433"), ("PGUSER", "relay"), ("PGDATABASE", "app")];
        let target = target_in("postgres://", &variables).unwrap();
        assert_eq!(target.config.get_hosts(), [Host::Tcp("db.example".into()), Host::Unix("/run/pg".into())]);
        assert_eq!(target.config.get_ports(), [6432, 5433]);
        assert_eq!((target.config.get_user(), target.config.get_dbname()), (Some("relay"), Some("app")));

        let target = target_in("postgres://owner@127.0.0.1:5999/shop", &variables).unwrap();
        assert_eq!(target.config.get_hosts(), [Host::Tcp("127.0.0.1".into())]);
        assert_eq!(target.config.get_ports(), [5999]);
        assert_eq!((target.config.get_user(), target.config.get_dbname()), (Some("owner"), Some("shop")));

        let target = target_in("host=127.0.0.1 user=owner", &[]).unwrap();
        assert_eq!(target.config.get_dbname(), Some("owner"), "the database is the user's name, as libpq's");
        assert_eq!(target_in("user=owner", &[]).unwrap().config.get_hosts(), [Host::Unix(DEFAULT_SOCKET_DIRECTORY.into())]);
        let error = target_in("postgres://x@h/d", &[("PGPORT", "543x")]).unwrap_err().to_string();
        assert_eq!(error, "PGPORT: \"543x\" is not a port number");
        let hosts_without_ports = target_in("postgres://x:p@db.example,[::1]/d?sslmode=disable", &[("PGPORT", "6432")]).unwrap();
        assert_eq!(hosts_without_ports.config.get_ports(), [6432, 6432], "a URL's host with no port takes PGPORT, as libpq's");
        assert_eq!(target_in("postgres://x@db.example/d", &[]).unwrap().config.get_ports(), [5432]);
        let paired = target_in("postgres://x@a,b/d", &[("PGPORT", "1,2")]).unwrap();
        assert_eq!(paired.config.get_ports(), [1, 2]);
        assert!(target_in("postgres://x@a,b,c/d", &[("PGPORT", "1,2")]).unwrap_err().to_string().contains("2 ports for the URL's 3 hosts"));
    }

    #[test]
    fn the_password_comes_from_the_url_else_pgpassword_else_the_password_file() {
        let dir = std::env::temp_dir().join(format!("outbox-connection-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(".pgpass");
        std::fs::write(&file, "127.0.0.1:5999:shop:relay:from\\\\the\\\\file\nlocalhost:*:*:relay:over a socket\n").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let passfile = file.to_str().unwrap();
        let url = "postgres://relay@127.0.0.1:5999/shop";

        let from_file = target_in(url, &[("PGPASSFILE", passfile)]).unwrap();
        assert_eq!((password(&from_file), from_file.password_file.as_deref()), ("from\\the\\file", Some(file.as_path())));
        let home = target_in(url, &[("HOME", dir.to_str().unwrap())]).unwrap();
        assert_eq!(password(&home), "from\\the\\file", "~/.pgpass without PGPASSFILE");
        let socket = target_in("postgres://relay@%2Frun%2Fpg/shop", &[("PGPASSFILE", passfile)]).unwrap();
        assert_eq!(password(&socket), "over a socket", "a Unix socket is localhost");
        let environment = target_in(url, &[("PGPASSFILE", passfile), ("PGPASSWORD", "from the environment")]).unwrap();
        assert_eq!((password(&environment), environment.password_file.as_deref()), ("from the environment", None));
        let in_url = target_in("postgres://relay:in%20the%20url@127.0.0.1:5999/shop", &[("PGPASSWORD", "x"), ("PGPASSFILE", passfile)]);
        assert_eq!(password(&in_url.unwrap()), "in the url");
        let unmatched = target_in("postgres://relay@127.0.0.1:5999/other", &[("PGPASSFILE", passfile)]).unwrap();
        assert_eq!((unmatched.config.get_password(), unmatched.password_file), (None, None));

        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let readable = target_in(url, &[("PGPASSFILE", passfile)]).unwrap();
        assert_eq!(readable.config.get_password(), None, "a file others may read is not read");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
