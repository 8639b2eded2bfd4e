//! The relay's configuration: each flag also reads an environment variable (`OUTBOX_…`), and
//! `--config FILE` reads such variables from a file (one `OUTBOX_NAME=value` per line, as
//! systemd's `EnvironmentFile=` takes them, and libpq's variables that the connections read,
//! such as `PGPASSFILE`). A flag wins over the environment, the environment over the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use outbox_core::delivery::Destinations;
use outbox_core::settings::{defaults, millis, Settings};

use crate::connection::LIBPQ_VARIABLES;

/// Where the outbox is.
#[derive(Args, Debug, Clone)]
pub struct DatabaseOptions {
    /// libpq connection URL (postgres://user@host:port/database) or key=value string; may name
    /// a PgBouncer in transaction pooling mode. As libpq, what it leaves out comes from PGHOST,
    /// PGPORT, PGUSER, PGDATABASE, PGSSLMODE and PGSSLROOTCERT, and a password it does not give
    /// from PGPASSWORD, else the password file (PGPASSFILE, else ~/.pgpass).
    #[arg(long, env = "OUTBOX_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// The schema of the SQL install (ignored where the extension is installed, which is found
    /// wherever it is).
    #[arg(long, env = "OUTBOX_SCHEMA", default_value = "outbox")]
    pub schema: String,
}

/// `outbox relay`.
#[derive(Args, Debug, Clone)]
pub struct RelayOptions {
    #[command(flatten)]
    pub database: DatabaseOptions,
    /// A direct connection (not through a pooler in transaction mode) to LISTEN on for
    /// commits; without it the relay polls.
    #[arg(long, env = "OUTBOX_LISTEN_URL", hide_env_values = true)]
    pub listen_url: Option<String>,
    /// Serve /healthz, /readyz and /metrics on this address (e.g. 127.0.0.1:9187).
    #[arg(long, env = "OUTBOX_METRICS")]
    pub metrics: Option<String>,
    /// How often to look for due deliveries and endpoint changes when no commit wakes it.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", value_parser = duration, default_value = "1s")]
    pub poll_interval: Duration,
    /// The default endpoint's URL when its own is null.
    #[arg(long, env = "OUTBOX_WEBHOOK_URL", hide_env_values = true, default_value = "")]
    pub webhook_url: String,
    /// How long a request may take; an endpoint's own timeout wins.
    #[arg(long, env = "OUTBOX_HTTP_TIMEOUT", value_parser = duration, default_value = "10s")]
    pub http_timeout: Duration,
    /// Most deliveries one claim takes per endpoint.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = defaults::BATCH_SIZE as usize, value_parser = count)]
    pub batch_size: usize,
    /// Most requests in flight to one endpoint (its own max_in_flight wins).
    #[arg(long, env = "OUTBOX_CONCURRENCY", default_value_t = defaults::CONCURRENCY as usize, value_parser = count)]
    pub concurrency: usize,
    /// How long a claimed delivery is the relay's before another may claim it.
    #[arg(long, env = "OUTBOX_LEASE", value_parser = duration, default_value = "30s")]
    pub lease: Duration,
    /// Attempts before a delivery is dead (an endpoint's own max_attempts wins).
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = defaults::MAX_ATTEMPTS, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,
    /// How long sent events are kept; 0 keeps them.
    #[arg(long, env = "OUTBOX_RETENTION", value_parser = duration, default_value = "7d")]
    pub retention: Duration,
    /// How long dead deliveries are kept; 0 keeps them.
    #[arg(long, env = "OUTBOX_DEAD_RETENTION", value_parser = duration, default_value = "30d")]
    pub dead_retention: Duration,
    /// Disable an endpoint failing for this long; 0 never does.
    #[arg(long, env = "OUTBOX_ENDPOINT_DISABLE_AFTER", value_parser = duration, default_value = "5d")]
    pub endpoint_disable_after: Duration,
    /// Addresses requests may go to: CIDR blocks, each optionally with :port.
    #[arg(long, env = "OUTBOX_ALLOWED_DESTINATIONS", default_value = defaults::ALLOWED_DESTINATIONS, value_parser = destinations)]
    pub allowed_destinations: String,
    /// Most requests in flight over all endpoints.
    #[arg(long, env = "OUTBOX_MAX_REQUESTS_IN_FLIGHT", default_value_t = defaults::MAX_REQUESTS_IN_FLIGHT as usize, value_parser = count)]
    pub max_requests_in_flight: usize,
    /// Most bytes of request bodies held over all endpoints.
    #[arg(long, env = "OUTBOX_MAX_BYTES_IN_FLIGHT", default_value_t = defaults::MAX_BYTES_IN_FLIGHT as usize)]
    pub max_bytes_in_flight: usize,
}

/// `outbox console`.
#[derive(Args, Debug, Clone)]
pub struct ConsoleOptions {
    #[command(flatten)]
    pub database: DatabaseOptions,
    /// Serve the console on this address. Any address but loopback needs authentication:
    /// --token-file, OUTBOX_CONSOLE_TOKEN or --basic-auth-file.
    #[arg(long, env = "OUTBOX_CONSOLE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Serve under this path, behind a reverse proxy (e.g. /outbox).
    #[arg(long, env = "OUTBOX_CONSOLE_PREFIX", default_value = "")]
    pub prefix: String,
    /// Refuse every action, whatever the role may do.
    #[arg(long, env = "OUTBOX_CONSOLE_READ_ONLY")]
    pub read_only: bool,
    /// Require `Authorization: Bearer <token>`, with the token in this file (or in
    /// OUTBOX_CONSOLE_TOKEN): for a proxy in front that adds it.
    #[arg(long, env = "OUTBOX_CONSOLE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Require HTTP basic authentication, with `user:password` in this file.
    #[arg(long, env = "OUTBOX_CONSOLE_BASIC_AUTH_FILE")]
    pub basic_auth_file: Option<PathBuf>,
}

impl RelayOptions {
    pub fn settings(&self) -> Settings {
        let never_if_zero = |d: Duration| (!d.is_zero()).then_some(d);
        Settings {
            webhook_url: self.webhook_url.trim().to_string(),
            webhook_url_from: "--webhook-url (OUTBOX_WEBHOOK_URL)",
            http_timeout: self.http_timeout,
            batch_size: self.batch_size,
            concurrency: self.concurrency,
            lease: self.lease,
            max_attempts: self.max_attempts,
            poll_interval: self.poll_interval.max(millis(10)),
            retention: never_if_zero(self.retention),
            endpoint_disable_after: never_if_zero(self.endpoint_disable_after),
            dead_retention: never_if_zero(self.dead_retention),
            allowed_destinations: self.allowed_destinations.clone(),
            max_requests_in_flight: self.max_requests_in_flight,
            max_bytes_in_flight: self.max_bytes_in_flight.max(1024 * 1024),
        }
    }
}

/// A duration as `500ms`, `30s`, `5min`, `2h` or `7d`; a bare number is seconds.
pub fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration: write 500ms, 30s, 5min, 2h or 7d"))?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("{other:?} is not a unit of time: use ms, s, min, h or d")),
    };
    number.checked_mul(unit_ms).map(Duration::from_millis).ok_or_else(|| format!("{text:?} is too long"))
}

/// A number of events or requests, from 1 to 10,000.
fn count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=10_000) => Ok(n),
        _ => Err(format!("{text:?} is not a number from 1 to 10000")),
    }
}

fn destinations(text: &str) -> Result<String, String> {
    Destinations::parse(text).map(|_| text.to_string()).map_err(|e| e.to_string())
}

/// Sets, from `path`, the `OUTBOX_…` variables the environment does not set already; called
/// before the flags are parsed, while the process has one thread.
pub fn load_config_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for (name, value) in parse_config(&text).map_err(|e| format!("{}: {e}", path.display()))? {
        if std::env::var_os(&name).is_none() {
            std::env::set_var(name, value);
        }
    }
    Ok(())
}

/// The `NAME=value` lines of a configuration file (`OUTBOX_…` and `LIBPQ_VARIABLES`); blank
/// lines and `#` comments are skipped, and a value may be quoted.
fn parse_config(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {}: expected OUTBOX_NAME=value", number + 1));
        };
        let name = name.trim();
        let ours = name.starts_with("OUTBOX_") && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !ours && !LIBPQ_VARIABLES.contains(&name) {
            return Err(format!(
                "line {}: {name:?} is neither an OUTBOX_ variable nor one of libpq's read here ({})",
                number + 1,
                LIBPQ_VARIABLES.join(", ")
            ));
        }
        let value = value.trim();
        let unquoted = ['"', '\''].iter().find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)));
        pairs.push((name.to_string(), unquoted.unwrap_or(value).to_string()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_units_of_postgresql_settings() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("5min"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert!(duration("5 minutes").unwrap_err().contains("not a unit"));
        assert!(duration("-1s").unwrap_err().contains("not a duration"));
        assert!(duration("99999999999999999999d").is_err());
    }

    #[test]
    fn a_config_file_holds_outbox_variables_only() {
        let pairs =
            parse_config("# a comment\n\nOUTBOX_DATABASE_URL='postgres://x@127.0.0.1/db'\n OUTBOX_METRICS = 127.0.0.1:9 \n").unwrap();
        assert_eq!(
            pairs,
            [
                ("OUTBOX_DATABASE_URL".to_string(), "postgres://x@127.0.0.1/db".to_string()),
                ("OUTBOX_METRICS".to_string(), "127.0.0.1:9".to_string())
            ]
        );
        assert!(parse_config("PATH=/tmp").unwrap_err().contains("neither an OUTBOX_ variable nor one of libpq's"));
        assert!(parse_config("PGOPTIONS=-c x=1").unwrap_err().contains("PGHOST, PGPORT"), "only the variables this binary reads");
        assert_eq!(parse_config("PGPASSFILE=/etc/outbox/pgpass").unwrap(), [("PGPASSFILE".to_string(), "/etc/outbox/pgpass".to_string())]);
        assert!(parse_config("OUTBOX_X").unwrap_err().contains("line 1"));
    }
}
