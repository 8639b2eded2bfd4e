//! What the server tells an `outbox relay` serving the extension's install, which the relay
//! workers obey too (sql/relays.sql, `outbox_relay_server_settings`): whether `outbox.relay`
//! lets a relay serve this database, and where `outbox.allowed_destinations` lets it connect.
//! The relay looks when it connects and at every poll (crate::queue, `load_endpoints`).

use postgres::Client;

use crate::connection::Outbox;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub serves: bool,
    pub allowed_destinations: String,
}

impl ServerSettings {
    /// Why the relay must not deliver under these settings, if it must not.
    pub fn refusal(&self) -> Option<String> {
        (!self.serves).then(|| {
            "outbox.relay is off for this database (ALTER DATABASE … SET outbox.relay = off, or the server's configuration): not delivering until it is on again".to_string()
        })
    }
}

/// The server's settings for `outbox`; `None` for the SQL install, which has none.
pub fn read(client: &mut Client, outbox: &Outbox) -> Result<Option<ServerSettings>, postgres::Error> {
    if !outbox.extension {
        return Ok(None);
    }
    let statement = outbox.qualify("SELECT serves, allowed_destinations FROM @extschema@.outbox_relay_server_settings()");
    Ok(client.query_typed_opt(&statement, &[])?.map(|row| ServerSettings { serves: row.get(0), allowed_destinations: row.get(1) }))
}
