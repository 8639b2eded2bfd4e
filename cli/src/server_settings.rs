//! What the server tells an `outbox relay` serving the extension's install, which the relay
//! workers obey too (sql/relays.sql, `outbox_relay_server_settings`): whether `outbox.relay`
//! lets a relay serve this database, where `outbox.allowed_destinations` lets it connect, and
//! `outbox.webhook_url`, the URL of the endpoint `default` while its own is null.
//! The relay looks when it connects and at every poll (crate::queue, `load_endpoints`).

use outbox_core::settings::Settings;
use postgres::Client;

use crate::connection::Outbox;

/// No Debug: `webhook_url` may carry a token.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub serves: bool,
    pub allowed_destinations: String,
    pub webhook_url: String,
}

impl ServerSettings {
    /// `settings` as a relay serving the extension's install runs with: within the server's
    /// allowed destinations, and the server's `outbox.webhook_url` when it sets one, as the
    /// workers would use.
    pub fn apply(&self, settings: &mut Settings) {
        settings.server_allowed_destinations = Some(self.allowed_destinations.clone());
        if !self.webhook_url.trim().is_empty() {
            settings.webhook_url = self.webhook_url.trim().to_string();
            settings.webhook_url_from = "outbox.webhook_url";
        }
    }

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
    let statement = outbox.qualify("SELECT serves, allowed_destinations, webhook_url FROM @extschema@.outbox_relay_server_settings()");
    Ok(client.query_typed_opt(&statement, &[])?.map(|row| ServerSettings {
        serves: row.get(0),
        allowed_destinations: row.get(1),
        webhook_url: row.get(2),
    }))
}
