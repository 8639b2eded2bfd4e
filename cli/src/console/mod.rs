//! `outbox console`: the operator's console, a few pages served by this binary, reading and
//! acting through the SQL the contract defines, as the role it connects as.
//!
//! - `guard`: who may connect, and that every action comes from the console's own page.
//! - `filter`: the events filter, from a query string.
//! - `reads`: each page's data, one statement each (`sql/`).
//! - `actions`: each action, one call of a contract function.
//! - `server`: the HTTP side: routes, the compiled-in page, security headers.

mod actions;
mod filter;
mod guard;
mod reads;
mod server;

use std::sync::Arc;

use crate::connection::{self, Compatibility};
use crate::listener::Listener;
use crate::options::ConsoleOptions;
use crate::output;

/// How many requests are served at once, each with its own database connection.
const SERVING_THREADS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("{0}")]
    Guard(#[from] guard::GuardError),
    #[error("{0}")]
    Connect(#[from] connection::ConnectError),
    #[error("{0}")]
    Database(String),
    #[error("no outbox in schema {0}, nor the extension: install it with `outbox migrate` or CREATE EXTENSION outbox_ext")]
    NoOutbox(String),
    #[error("the outbox is at version {0}; this console runs against {1}: {2}")]
    Version(String, &'static str, &'static str),
    #[error("--prefix {0:?}: write a path such as /outbox (letters, digits, -, _, . and /)")]
    Prefix(String),
    #[error("cannot serve on {0}: {1}")]
    Serve(String, String),
    #[error("cannot make the console's token: {0}")]
    Token(std::io::Error),
}

/// Serves the console until SIGTERM or SIGINT.
pub fn run(options: &ConsoleOptions) -> Result<(), ConsoleError> {
    let credentials = guard::Credentials::load(
        options.token_file.as_deref(),
        std::env::var("OUTBOX_CONSOLE_TOKEN").ok(),
        options.basic_auth_file.as_deref(),
    )?;
    let addresses = guard::listen_addresses(&options.listen, &credentials)?;
    let prefix = prefix(&options.prefix)?;

    let mut client = connection::connect(&options.database.database_url, "outbox console")?;
    let outbox = connection::find_outbox(&mut client, &options.database.schema)
        .map_err(|e| ConsoleError::Database(connection::error_text(&e)))?
        .ok_or_else(|| ConsoleError::NoOutbox(options.database.schema.clone()))?;
    match outbox.compatibility() {
        Compatibility::Current => {}
        Compatibility::Older => {
            return Err(ConsoleError::Version(
                outbox.version,
                connection::VERSION,
                "upgrade it first (outbox migrate, or ALTER EXTENSION outbox_ext UPDATE)",
            ))
        }
        Compatibility::Newer => return Err(ConsoleError::Version(outbox.version, connection::VERSION, "run a console of its version")),
    }

    let listener = Listener::start(&addresses, &options.allowed_hosts, server::MAX_ACTION_BYTES, "outbox-console")
        .map_err(|e| ConsoleError::Serve(options.listen.clone(), e.to_string()))?;
    let site = Arc::new(server::Site {
        prefix,
        token: guard::random_token().map_err(ConsoleError::Token)?,
        credentials,
        read_only: options.read_only,
        database_url: options.database.database_url.clone(),
        reads: reads::Reads::new(&outbox.schema),
        actions: actions::Actions::new(&outbox.schema),
    });
    let listener = Arc::new(listener);
    let mut first = Some(client);
    let threads: Vec<_> = (0..SERVING_THREADS)
        .map(|n| {
            let (listener, site, client) = (Arc::clone(&listener), Arc::clone(&site), first.take());
            std::thread::Builder::new()
                .name(format!("outbox-console-{n}"))
                .spawn(move || server::serve(&listener, &site, client))
                .map_err(|e| ConsoleError::Serve(options.listen.clone(), e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    output::say(&format!(
        "outbox console: serving http://{}{}/ for {} (schema {}, version {}){}",
        listener.address(),
        site.prefix,
        connection::describe(&options.database.database_url),
        outbox.schema,
        outbox.version,
        if site.read_only { ", read-only" } else { "" }
    ));

    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .map_err(|e| ConsoleError::Serve(options.listen.clone(), e.to_string()))?;
    signals.forever().next();
    listener.stop();
    for thread in threads {
        let _ = thread.join();
    }
    output::say("outbox console: stopped");
    Ok(())
}

/// `--prefix` as the routes start with it: empty, or `/name` with no trailing slash.
fn prefix(given: &str) -> Result<String, ConsoleError> {
    let trimmed = given.trim().trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_./".contains(c);
    if !trimmed.starts_with('/') || !trimmed.chars().all(allowed) || trimmed.contains("//") || trimmed.contains("..") {
        return Err(ConsoleError::Prefix(given.to_string()));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_a_plain_path() {
        assert_eq!(prefix("").unwrap(), "");
        assert_eq!(prefix("/").unwrap(), "");
        assert_eq!(prefix("/outbox/").unwrap(), "/outbox");
        assert_eq!(prefix("/ops/outbox-1").unwrap(), "/ops/outbox-1");
        for bad in ["outbox", "/a b", "/a\"b", "/../x", "//evil.example", "/a?b"] {
            assert!(prefix(bad).is_err(), "{bad}");
        }
    }
}
