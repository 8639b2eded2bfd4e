//! `outbox relay`: finds the outbox, then runs the relay loop of `outbox_core` on it, with a
//! client connection for the queue; waits while the database cannot be reached or its outbox
//! is missing or older than this binary; exits at once if it is newer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::relay::{Asked, Ended, Level, Relay, Wake};

use crate::connection::{connect, error_text, find_outbox, Compatibility, Outbox, VERSION};
use crate::metrics::{say, Metrics, ProcessReport};
use crate::options::RelayOptions;
use crate::presence::{self, Presence};
use crate::queue::ClientQueue;
use crate::server_settings::{self, ServerSettings};
use crate::wake::ProcessWake;

/// Why the relay could not run.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Setup(String),
    #[error(
        "the outbox in schema {schema} is version {version}, newer than this relay ({VERSION}): run a relay of version {version} or later"
    )]
    SchemaNewer { schema: String, version: String },
}

pub fn run(options: &RelayOptions) -> Result<(), RelayError> {
    let own_settings = options.settings();
    let metrics = Arc::new(Metrics::default());
    if let Some(address) = &options.metrics {
        crate::health::serve(address, &options.allowed_hosts, metrics.clone()).map_err(RelayError::Setup)?;
    }
    let mut wake =
        ProcessWake::new(options.listen_url.as_deref()).map_err(|e| RelayError::Setup(format!("cannot wait for signals: {e}")))?;
    let (url, schema) = (&options.database.database_url, &options.database.schema);
    loop {
        let Some((mut client, outbox, server)) = wait_for_outbox(url, schema, &mut wake, &metrics, own_settings.poll_interval)? else {
            return Ok(());
        };
        let mut settings = own_settings.clone();
        if let Some(server) = &server {
            server.apply(&mut settings);
        }
        let presence = match Presence::register(&mut client, &outbox, wake.wants_notifications.clone(), wake.unheard.clone()) {
            Ok(presence) => presence,
            Err(e) => {
                say(Level::Warning, &format!("cannot record this relay in outbox_relays: {}", error_text(&e)));
                wake.wait(-1, own_settings.poll_interval.max(Duration::from_secs(1)));
                continue;
            }
        };
        let (id, quoted_schema) = (presence.id, outbox.schema.clone());
        say(Level::Log, &format!("relay {id} delivering from the outbox in schema {} (version {})", outbox.schema, outbox.version));
        let queue = ClientQueue::new(url, client, outbox, schema, presence, metrics.clone(), wake.log_streamed.clone()).obeying(server);
        let report = ProcessReport { metrics: metrics.clone() };
        let relay = Relay::new(queue, &mut wake, report, settings.clone(), true).map_err(|e| RelayError::Setup(e.to_string()))?;
        match relay.run() {
            Ended::Asked => {
                // Gone from outbox_relay_processes() now, not a minute from now.
                let removed = connect(url, "outbox relay")
                    .map_err(|e| e.to_string())
                    .and_then(|mut client| presence::remove(&mut client, &quoted_schema, id).map_err(|e| error_text(&e)));
                if let Err(e) = removed {
                    say(Level::Warning, &format!("cannot remove this relay from outbox_relays (it ages out): {e}"));
                }
                return Ok(());
            }
            // What was in flight belonged to rows that are gone.
            Ended::Gone => metrics.schema_supported.store(false, Ordering::Relaxed),
        }
    }
}

/// Connects and finds an outbox this binary runs against, with the server's settings for it
/// (the extension's install); waits (saying why, once) while the database is unreachable, has
/// no outbox, or an older one, or the server says not to serve it. `None` when asked to stop.
fn wait_for_outbox(
    url: &str,
    schema: &str,
    wake: &mut ProcessWake,
    metrics: &Metrics,
    poll_interval: Duration,
) -> Result<Option<(postgres::Client, Outbox, Option<ServerSettings>)>, RelayError> {
    let mut said = String::new();
    loop {
        let found = connect(url, "outbox relay").map_err(|e| e.to_string()).and_then(|mut client| {
            let outbox = find_outbox(&mut client, schema).map_err(|e| format!("cannot look for the outbox: {}", error_text(&e)))?;
            Ok((client, outbox))
        });
        metrics.database_up.store(found.is_ok(), Ordering::Relaxed);
        let reason = match found {
            Ok((mut client, Some(outbox))) => match outbox.compatibility() {
                Compatibility::Current => match server_settings::read(&mut client, &outbox) {
                    Ok(server) => match server.as_ref().and_then(ServerSettings::refusal) {
                        Some(refusal) => refusal,
                        None => {
                            metrics.schema_supported.store(true, Ordering::Relaxed);
                            return Ok(Some((client, outbox, server)));
                        }
                    },
                    Err(e) => format!("cannot read the server's settings for the relay: {}", error_text(&e)),
                },
                Compatibility::Newer => return Err(RelayError::SchemaNewer { schema: outbox.schema, version: outbox.version }),
                Compatibility::Older => format!(
                    "waiting for the outbox in schema {} to be upgraded from {} to {VERSION} (outbox migrate, or ALTER EXTENSION outbox_ext UPDATE)",
                    outbox.schema, outbox.version
                ),
            },
            Ok((_, None)) => {
                format!("waiting for an outbox in this database (outbox migrate --schema {schema}, or CREATE EXTENSION outbox_ext)")
            }
            Err(e) => format!("waiting for the database: {e}"),
        };
        metrics.schema_supported.store(false, Ordering::Relaxed);
        if reason != said {
            say(Level::Log, &reason);
            said = reason;
        }
        wake.wait(-1, poll_interval.max(Duration::from_secs(1)));
        if matches!(wake.asked(), Asked::Stop) {
            return Ok(None);
        }
    }
}
