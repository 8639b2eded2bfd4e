//! `outbox`: the outbox_ext relay outside the server, for databases that load no custom
//! library (managed PostgreSQL), or beside the extension with `outbox.workers = 0`.
//!
//! - `options`: flags, environment variables and the configuration file.
//! - `connection`: connecting (the URL made whole from libpq's environment; `pgpass`: the
//!   password file), and finding the outbox and its version.
//! - `queue`: the relay's statements over a client connection (the core's `Queue`).
//! - `wake`: signals, LISTEN and polling (the core's `Wake`).
//! - `metrics`: counters and log lines (the core's `Report`); `health` serves them.
//! - `listener`: the HTTP listener of the console and of `health`: its bounds, and whom it answers.
//! - `presence`: the relay's row in outbox_relays.
//! - `relay`: the `relay` command.
//! - `migrate`: the `migrate` command; `script` makes its scripts from the extension's.
//! - `doctor`: the `doctor` command.
//! - `writers`: who besides the outbox's owner could change it (migrate refuses, doctor names).
//! - `console`: the `console` command, the operator's console in a browser.
//! - `output`: lines on standard output and error that never panic.

mod connection;
mod console;
mod doctor;
mod health;
mod listener;
mod log_stream;
mod metrics;
mod migrate;
mod options;
mod output;
mod pgpass;
mod presence;
mod queue;
mod relay;
mod replication;
mod script;
mod server_settings;
mod tls;
mod wake;
mod writers;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// glibc's allocator took a tenth of the relay's HTTP thread at high rates, much of it in its
/// arena locks; mimalloc keeps a heap per thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "outbox", version, about = "The outbox_ext relay, outside the server")]
struct Cli {
    /// Read OUTBOX_… variables (and libpq's PGPASSFILE, PGHOST, …) from this file (one
    /// NAME=value per line); the environment and the flags win over it.
    #[arg(long, env = "OUTBOX_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Deliver events to their webhook endpoints, as the extension's workers do.
    Relay(Box<options::RelayOptions>),
    /// Install the outbox as plain SQL into a schema, or upgrade it: no extension, no
    /// superuser (CREATE on the database is enough).
    Migrate {
        #[command(flatten)]
        database: options::DatabaseOptions,
        /// Print the SQL each step would run, and run nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stop at this version (default: this binary's).
        #[arg(long)]
        to: Option<String>,
    },
    /// Compare the outbox in a database with what its version should be; exit 2 on any
    /// difference.
    Doctor(options::DatabaseOptions),
    /// Serve the operator's console: see, search and fix deliveries in a browser, as the
    /// role the database URL names.
    Console(Box<options::ConsoleOptions>),
    /// Print this binary's version and the schema version it runs against.
    Version,
}

fn main() -> ExitCode {
    // The file sets variables the flags then read: before clap parses them.
    if let Some(path) = config_path() {
        if let Err(e) = options::load_config_file(&path) {
            output::say(&format!("outbox: {e}"));
            return ExitCode::from(2);
        }
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            output::answer(&format!("outbox {}\nschema version {}", connection::VERSION, connection::VERSION));
            ExitCode::SUCCESS
        }
        Command::Migrate { database, dry_run, to } => match migrate::run(&database, to.as_deref(), dry_run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                output::say(&format!("outbox migrate: error: {e}"));
                ExitCode::FAILURE
            }
        },
        Command::Doctor(database) => {
            match doctor::run(&database) {
                Ok((schema, version, drift)) if drift.is_empty() => {
                    output::answer(&format!("outbox doctor: the outbox in schema {schema} is as version {version} installs it, and only its owner can change it"));
                    ExitCode::SUCCESS
                }
                Ok((schema, version, drift)) => {
                    let mut lines =
                        vec![format!("outbox doctor: the outbox in schema {schema} (version {version}) has {} problems:", drift.len())];
                    lines.extend(drift.iter().map(|d| format!("  {d}")));
                    output::answer(&lines.join("\n"));
                    ExitCode::from(2)
                }
                Err(e) => {
                    output::say(&format!("outbox doctor: error: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Console(options) => match console::run(&options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                output::say(&format!("outbox console: error: {e}"));
                ExitCode::FAILURE
            }
        },
        Command::Relay(options) => match relay::run(&options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                output::say(&format!("outbox relay: error: {e}"));
                ExitCode::FAILURE
            }
        },
    }
}

/// `--config FILE`, `--config=FILE` or `OUTBOX_CONFIG`, looked for before the flags are parsed.
fn config_path() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy().into_owned();
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("OUTBOX_CONFIG").map(PathBuf::from)
}
