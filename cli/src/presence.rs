//! The relay's row in `outbox_relays` (sql/relays.sql): added when it starts (its id is what
//! its claims record), refreshed within its transactions every few seconds and whenever it
//! changes its mind about wanting a NOTIFY per commit, removed when it stops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::Client;

use crate::connection::{Outbox, VERSION};

/// How often the row's seen_at is refreshed; outbox_relay_processes() counts a relay seen in the
/// last minute.
const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// Rows not refreshed for this long belong to relays that were killed: a starting relay
/// removes them.
const FORGET_AFTER: &str = "5 minutes";

pub struct Presence {
    /// The row's id, negative.
    pub id: i32,
    host: String,
    /// Whether the relay waits for commits and wants them notified (set by the wake side).
    pub wants_notifications: Arc<AtomicBool>,
    /// Set once the row says so: a commit that read the row before then sent no notification,
    /// and the claim that followed may have been too early to see it.
    unheard: Arc<AtomicBool>,
    /// The open transaction turns notifications on.
    turns_on: bool,
    /// What the row says, and when it was last written; `None` after a transaction that
    /// wrote it failed.
    written: Option<(bool, Instant)>,
    upsert: String,
}

impl Presence {
    /// Adds the relay's row to the outbox's `outbox_relays`, first removing rows of relays
    /// long gone.
    pub fn register(
        client: &mut Client,
        outbox: &Outbox,
        wants_notifications: Arc<AtomicBool>,
        unheard: Arc<AtomicBool>,
    ) -> Result<Presence, postgres::Error> {
        let schema = &outbox.schema;
        let host = hostname();
        client.batch_execute(&format!(
            "DELETE FROM {schema}.outbox_relays WHERE seen_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '{FORGET_AFTER}')"
        ))?;
        let arguments: [(&(dyn ToSql + Sync), Type); 3] =
            [(&host, Type::TEXT), (&(std::process::id() as i32), Type::INT4), (&VERSION, Type::TEXT)];
        let id: i32 = client
            .query_typed_one(
                &format!("INSERT INTO {schema}.outbox_relays (host, pid, version) VALUES ($1, $2, $3) RETURNING id"),
                &arguments,
            )?
            .get(0);
        Ok(Presence {
            id,
            host,
            wants_notifications,
            unheard,
            turns_on: false,
            written: Some((false, Instant::now())),
            // Also puts the row back if it was removed as a dead relay's meanwhile (the
            // database was out of reach for minutes).
            upsert: format!(
                "INSERT INTO {schema}.outbox_relays AS r (id, host, pid, version, listening) OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (id) DO UPDATE SET seen_at = pg_catalog.now(), listening = excluded.listening"
            ),
        })
    }

    /// Refreshes the row in the transaction `client` has open, if it is due or the relay
    /// changed its mind about notifications.
    pub fn refresh_if_due(&mut self, client: &mut Client) -> Result<(), postgres::Error> {
        let wanted = self.wants_notifications.load(Ordering::Relaxed);
        if self.written.is_some_and(|(said, at)| said == wanted && at.elapsed() < REFRESH_EVERY) {
            return Ok(());
        }
        let arguments: [(&(dyn ToSql + Sync), Type); 5] = [
            (&self.id, Type::INT4),
            (&self.host, Type::TEXT),
            (&(std::process::id() as i32), Type::INT4),
            (&VERSION, Type::TEXT),
            (&wanted, Type::BOOL),
        ];
        client.query_typed(&self.upsert, &arguments)?;
        self.turns_on = wanted && !self.written.is_some_and(|(said, _)| said);
        self.written = Some((wanted, Instant::now()));
        Ok(())
    }

    /// The transaction committed.
    pub fn committed(&mut self) {
        if std::mem::take(&mut self.turns_on) {
            self.unheard.store(true, Ordering::Relaxed);
        }
    }

    /// The transaction that refreshed the row did not commit: write it again in the next.
    pub fn unwritten(&mut self) {
        self.written = None;
        self.turns_on = false;
    }
}

/// Removes relay `id`'s row from the outbox in `schema` (quoted), as the relay stops.
pub fn remove(client: &mut Client, schema: &str, id: i32) -> Result<(), postgres::Error> {
    client.query_typed(&format!("DELETE FROM {schema}.outbox_relays WHERE id OPERATOR(pg_catalog.=) $1"), &[(&id, Type::INT4)])?;
    Ok(())
}

fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most the buffer's length into it.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    if ok {
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    } else {
        String::new()
    }
}
