//! The relay's configuration: each flag also reads an environment variable (`OUTBOX_…`), and
//! `--config FILE` reads such variables from a file (one `OUTBOX_NAME=value` per line, as
//! systemd's `EnvironmentFile=` takes them, and libpq's variables that the connections read,
//! such as `PGPASSFILE`). A flag wins over the environment, the environment over the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use outbox_core::delivery::Destinations;
use outbox_core::settings::{defaults, Settings};

use crate::connection::LIBPQ_VARIABLES;

use crate::listener::{allowed_host, HostName};

/// Where the outbox is. No Debug: the URL may carry a password.
#[derive(Args, Clone)]
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
#[derive(Args, Clone)]
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
    /// Also answer /metrics requests that name this host (a name Prometheus scrapes by);
    /// without it, only the --metrics address, localhost on loopback, or any IP address on
    /// 0.0.0.0 or [::]. Repeat it, or separate names with commas.
    #[arg(long = "allowed-host", env = "OUTBOX_ALLOWED_HOST", value_delimiter = ',', value_parser = allowed_host)]
    pub allowed_hosts: Vec<HostName>,
    /// How often to look for due deliveries and endpoint changes when no commit wakes it
    /// (10ms to 1h).
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", value_parser = short_time, default_value = "1s")]
    pub poll_interval: Duration,
    /// The default endpoint's URL when its own is null.
    #[arg(long, env = "OUTBOX_WEBHOOK_URL", hide_env_values = true, default_value = "")]
    pub webhook_url: String,
    /// How long a request may take (10ms to 1h); an endpoint's own timeout wins.
    #[arg(long, env = "OUTBOX_HTTP_TIMEOUT", value_parser = short_time, default_value = "10s")]
    pub http_timeout: Duration,
    /// Most deliveries one claim takes per endpoint (1 to 10000).
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = defaults::BATCH_SIZE as usize, value_parser = |text: &str| count(text, 10_000))]
    pub batch_size: usize,
    /// Most requests in flight to one endpoint (1 to 1000; its own max_in_flight wins).
    #[arg(long, env = "OUTBOX_CONCURRENCY", default_value_t = defaults::CONCURRENCY as usize, value_parser = |text: &str| count(text, 1_000))]
    pub concurrency: usize,
    /// How long a claimed delivery is the relay's before another may claim it (1s to 24h).
    #[arg(long, env = "OUTBOX_LEASE", value_parser = lease, default_value = "30s")]
    pub lease: Duration,
    /// How long sent events are kept; 0 keeps them.
    #[arg(long, env = "OUTBOX_RETENTION", value_parser = long_time, default_value = "7d")]
    pub retention: Duration,
    /// How long dead deliveries are kept; 0 keeps them.
    #[arg(long, env = "OUTBOX_DEAD_RETENTION", value_parser = long_time, default_value = "30d")]
    pub dead_retention: Duration,
    /// Disable an endpoint failing for this long; 0 never does.
    #[arg(long, env = "OUTBOX_ENDPOINT_DISABLE_AFTER", value_parser = long_time, default_value = "5d")]
    pub endpoint_disable_after: Duration,
    /// Addresses requests may go to: CIDR blocks, each optionally with :port.
    #[arg(long, env = "OUTBOX_ALLOWED_DESTINATIONS", default_value = defaults::ALLOWED_DESTINATIONS, value_parser = destinations)]
    pub allowed_destinations: String,
    /// Most requests in flight over all endpoints (1 to 10000).
    #[arg(long, env = "OUTBOX_MAX_REQUESTS_IN_FLIGHT", default_value_t = defaults::MAX_REQUESTS_IN_FLIGHT as usize, value_parser = |text: &str| count(text, 10_000))]
    pub max_requests_in_flight: usize,
    /// Most bytes of request bodies held over all endpoints (at least 1MB), e.g. 64MB.
    #[arg(long, env = "OUTBOX_MAX_BYTES_IN_FLIGHT", value_parser = bytes_in_flight, default_value = "64MB")]
    pub max_bytes_in_flight: usize,
}

/// `outbox console`.
#[derive(Args, Clone)]
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
    /// Also answer requests that name this host, and pages of its origin (the name of a
    /// reverse proxy in front); without it, only the --listen address, localhost on loopback,
    /// or any IP address on 0.0.0.0 or [::]. Repeat it, or separate names with commas.
    #[arg(long = "allowed-host", env = "OUTBOX_ALLOWED_HOST", value_delimiter = ',', value_parser = allowed_host)]
    pub allowed_hosts: Vec<HostName>,
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
            poll_interval: self.poll_interval,
            retention: never_if_zero(self.retention),
            endpoint_disable_after: never_if_zero(self.endpoint_disable_after),
            dead_retention: never_if_zero(self.dead_retention),
            allowed_destinations: self.allowed_destinations.clone(),
            server_allowed_destinations: None,
            max_requests_in_flight: self.max_requests_in_flight,
            max_bytes_in_flight: self.max_bytes_in_flight,
        }
    }
}

/// The units of PostgreSQL's time settings, in milliseconds.
const TIME_UNITS: [(&str, f64); 6] =
    [("us", 0.001), ("ms", 1.0), ("s", 1_000.0), ("min", 60_000.0), ("h", 3_600_000.0), ("d", 86_400_000.0)];
/// The units of PostgreSQL's memory settings, in bytes.
const SIZE_UNITS: [(&str, f64); 5] =
    [("B", 1.0), ("kB", 1024.0), ("MB", 1_048_576.0), ("GB", 1_073_741_824.0), ("TB", 1_099_511_627_776.0)];
const HOUR_MS: i64 = 3_600_000;
/// The largest value of an `int4` setting, which the extension's settings are.
const INT_MAX: i64 = i32::MAX as i64;

/// `--poll-interval`, `--http-timeout`: as `outbox.poll_interval` and `outbox.http_timeout`,
/// 10ms to 1h, a bare number in milliseconds.
fn short_time(text: &str) -> Result<Duration, String> {
    setting_value(text, "ms", &TIME_UNITS, 10, HOUR_MS).map(|ms| Duration::from_millis(ms as u64))
}

/// `--lease`: as `outbox.lease`, 1s to 24h, a bare number in milliseconds.
fn lease(text: &str) -> Result<Duration, String> {
    setting_value(text, "ms", &TIME_UNITS, 1_000, 24 * HOUR_MS).map(|ms| Duration::from_millis(ms as u64))
}

/// `--retention`, `--dead-retention`, `--endpoint-disable-after`: as the settings of the same
/// names, in whole seconds (a bare number too), 0 for never.
fn long_time(text: &str) -> Result<Duration, String> {
    setting_value(text, "s", &TIME_UNITS, 0, INT_MAX).map(|s| Duration::from_secs(s as u64))
}

/// `--max-bytes-in-flight`: as `outbox.max_bytes_in_flight`, 1MB to 2147483647 bytes, a bare
/// number in bytes.
fn bytes_in_flight(text: &str) -> Result<usize, String> {
    setting_value(text, "B", &SIZE_UNITS, 1_048_576, INT_MAX).map(|bytes| bytes as usize)
}

/// `text` as PostgreSQL reads an integer setting whose own unit is `unit`: a number (a
/// fraction is rounded to the unit), optionally followed by one of `units`, spelled as
/// PostgreSQL spells them; the result, in `unit`, must be from `min` to `max`.
fn setting_value(text: &str, unit: &str, units: &[(&str, f64)], min: i64, max: i64) -> Result<i64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, given_unit) = (&trimmed[..split], trimmed[split..].trim());
    let spelled = units.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
    let scale = |name: &str| units.iter().find(|(known, _)| *known == name).map(|(_, scale)| *scale);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a number with an optional unit ({spelled})"))?;
    let given = if given_unit.is_empty() { unit } else { given_unit };
    let Some(given_scale) = scale(given) else {
        return Err(format!("{given_unit:?} is not a unit here: use {spelled}, as PostgreSQL spells them"));
    };
    let value = (number * given_scale / scale(unit).expect("the setting's own unit is one of its units")).round();
    let show = |v: i64| match v {
        0 => "0".to_string(),
        INT_MAX => format!("{v}{unit}"),
        _ => shortest(v, unit, units),
    };
    if value < min as f64 || value > max as f64 {
        return Err(format!("{text:?} is out of range: from {} to {}", show(min), show(max)));
    }
    Ok(value as i64)
}

/// `value` in `unit`, written with the largest of `units` it is a whole number of.
fn shortest(value: i64, unit: &str, units: &[(&str, f64)]) -> String {
    let base = units.iter().find(|(name, _)| *name == unit).map_or(1.0, |(_, scale)| *scale);
    let in_base = value as f64 * base;
    units
        .iter()
        .rev()
        .find(|(_, scale)| *scale >= base && in_base % scale == 0.0)
        .map_or(format!("{value}{unit}"), |(name, scale)| format!("{}{name}", (in_base / scale) as i64))
}

/// A number of events or requests, from 1 to `max`.
fn count(text: &str, max: usize) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{text:?} is not a number from 1 to {max}")),
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
    fn durations_take_the_units_of_postgresql_settings_and_their_ranges() {
        assert_eq!(short_time("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(short_time("500"), Ok(Duration::from_millis(500)), "a bare number is in the setting's unit");
        assert_eq!(short_time("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(short_time(" 30 s "), Ok(Duration::from_secs(30)));
        assert_eq!(lease("5min"), Ok(Duration::from_secs(300)));
        assert_eq!(lease("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(long_time("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(long_time("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(long_time("0"), Ok(Duration::ZERO));
        assert_eq!(short_time("5ms").unwrap_err(), "\"5ms\" is out of range: from 10ms to 1h");
        assert_eq!(lease("25h").unwrap_err(), "\"25h\" is out of range: from 1s to 1d");
        assert_eq!(long_time("100000d").unwrap_err(), "\"100000d\" is out of range: from 0 to 2147483647s");
        assert!(short_time("5 minutes").unwrap_err().contains("\"minutes\" is not a unit here: use us, ms, s, min, h, d"));
        assert!(short_time("5S").unwrap_err().contains("not a unit"), "units are spelled as PostgreSQL spells them");
        assert!(short_time("-1s").unwrap_err().contains("is not a number"));
        assert!(short_time("").unwrap_err().contains("is not a number"));
    }

    #[test]
    fn sizes_take_the_units_of_postgresql_settings() {
        assert_eq!(bytes_in_flight("64MB"), Ok(64 << 20));
        assert_eq!(bytes_in_flight("1GB"), Ok(1 << 30));
        assert_eq!(bytes_in_flight("2048kB"), Ok(2 << 20));
        assert_eq!(bytes_in_flight("1048576"), Ok(1 << 20), "a bare number is bytes");
        assert_eq!(bytes_in_flight("512kB").unwrap_err(), "\"512kB\" is out of range: from 1MB to 2147483647B");
        assert!(bytes_in_flight("64mb").unwrap_err().contains("use B, kB, MB, GB, TB"));
        assert!(bytes_in_flight("2GB").unwrap_err().contains("out of range"));
    }

    #[test]
    fn a_bad_value_names_its_flag_and_every_default_is_valid() {
        #[derive(clap::Parser)]
        struct Relay {
            #[command(flatten)]
            options: RelayOptions,
        }
        let parse = |extra: &[&str]| {
            let arguments = ["outbox", "--database-url", "postgres://x@127.0.0.1/db"].iter().chain(extra);
            <Relay as clap::Parser>::try_parse_from(arguments)
        };
        let relay = parse(&["--max-bytes-in-flight", "64MB", "--lease", "2min"]).unwrap().options;
        assert_eq!((relay.max_bytes_in_flight, relay.lease), (64 << 20, Duration::from_secs(120)));
        let defaults = parse(&[]).unwrap().options.settings();
        assert_eq!((defaults.max_bytes_in_flight, defaults.poll_interval), (64 << 20, Duration::from_secs(1)));
        let error = parse(&["--max-bytes-in-flight", "64XB"]).err().expect("refused").to_string();
        assert!(error.contains("--max-bytes-in-flight") && error.contains("\"XB\" is not a unit here"), "{error}");
        let error = parse(&["--concurrency", "1001"]).err().expect("refused").to_string();
        assert!(error.contains("--concurrency") && error.contains("from 1 to 1000"), "{error}");
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
