//! The console over HTTP: routes, the page compiled into the binary, and the headers that keep
//! what it shows inert (a strict Content-Security-Policy; the page's script sets text, never
//! markup).

use postgres::Client;

use super::actions::{Action, ActionError, Actions};
use super::filter::Filter;
use super::guard::{self, Credentials};
use super::reads::{Page, Reads};
use crate::connection::{connect, error_text};
use crate::listener::{Listener, Request, Response};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// Scripts, styles and requests only from the console itself; no frames, no plugins, no
/// inline script or style: a payload that reached the page as markup could still run nothing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An action's body is a few fields: the listener refuses anything longer unread.
pub const MAX_ACTION_BYTES: usize = 64 * 1024;

/// What every serving thread shares.
pub struct Site {
    pub prefix: String,
    /// Sent by the page with each action (guard::TOKEN_HEADER).
    pub token: String,
    pub credentials: Credentials,
    pub read_only: bool,
    pub database_url: String,
    pub reads: Reads,
    pub actions: Actions,
}

/// Answers the listener's requests until it is stopped; `client` is a first connection to use.
pub fn serve(listener: &Listener, site: &Site, mut client: Option<Client>) {
    while let Some(exchange) = listener.next() {
        let response = answer(&exchange.request, site, &mut client);
        exchange.answer(with_headers(response, site));
    }
}

fn answer(request: &Request, site: &Site, client: &mut Option<Client>) -> Response {
    if !site.credentials.admit(request) {
        return Response::error(401, "authentication required");
    }
    let Some(route) = request.path().strip_prefix(&site.prefix) else {
        return Response::error(404, "not found");
    };
    let query = request.query();
    match (request.method.as_str(), route) {
        ("GET", "/" | "/index.html") => Response::new(200, "text/html; charset=utf-8", INDEX),
        ("GET", "/console.js") => Response::new(200, "text/javascript; charset=utf-8", SCRIPT),
        ("GET", "/console.css") => Response::new(200, "text/css; charset=utf-8", STYLE),
        ("GET", "") => Response::new(308, "text/plain", format!("{}/", site.prefix)).with_header("location", format!("{}/", site.prefix)),
        ("GET", "/api/session") => session(site, client),
        ("GET", "/api/endpoints") => read(site, client, &Page::Endpoints),
        ("GET", "/api/activity") => read(site, client, &Page::Activity),
        ("GET", "/api/relays") => read(site, client, &Page::Relays),
        ("GET", "/api/leases") => read(site, client, &Page::Leases),
        ("GET", "/api/event") => match query.strip_prefix("id=").and_then(|id| id.parse::<i64>().ok()) {
            Some(id) => read(site, client, &Page::Event(id)),
            None => Response::error(400, "give the event's id: /api/event?id=42"),
        },
        ("GET", "/api/events" | "/api/count" | "/api/count/exact") => match Filter::parse(query) {
            Ok(filter) if route == "/api/events" => read(site, client, &Page::Events(filter)),
            Ok(filter) => read(site, client, &Page::Count(filter, route == "/api/count/exact")),
            Err(e) => Response::error(400, &e.to_string()),
        },
        ("POST", "/api/action") => act(request, site, client),
        (_, "/api/action") => Response::error(405, "an action is a POST"),
        _ => Response::error(404, "not found"),
    }
}

/// The token the page sends with its actions, whether actions are refused, and what the role
/// may read and do.
fn session(site: &Site, client: &mut Option<Client>) -> Response {
    with_client(site, client, |client| Ok(site.reads.read(client, &Page::Access)?)).map_or_else(
        |answer| answer,
        |access| {
            let access = access.unwrap_or_else(|| "{}".into());
            let read_only = site.read_only;
            let token = serde_json::Value::String(site.token.clone());
            Response::new(200, "application/json", format!("{{\"token\":{token},\"read_only\":{read_only},\"access\":{access}}}"))
        },
    )
}

fn read(site: &Site, client: &mut Option<Client>, page: &Page) -> Response {
    match with_client(site, client, |client| Ok(site.reads.read(client, page)?)) {
        Ok(Some(json)) => Response::new(200, "application/json", json),
        Ok(None) => Response::error(404, "no such event: it was never enqueued, rolled back, or retention removed it"),
        Err(answer) => answer,
    }
}

fn act(request: &Request, site: &Site, client: &mut Option<Client>) -> Response {
    if let Some(reason) = guard::not_from_the_page(request, &site.token) {
        return Response::error(403, reason);
    }
    if site.read_only {
        return Response::error(403, "this console is read-only (--read-only): it changes nothing");
    }
    let action: Action = match serde_json::from_slice(&request.body) {
        Ok(action) => action,
        Err(e) => return Response::error(400, &format!("not an action: {e}")),
    };
    match with_client(site, client, |client| site.actions.run(client, &action)) {
        Ok(result) => Response::new(200, "application/json", result),
        Err(answer) => answer,
    }
}

/// Runs `work` on this thread's connection, connecting first if it has none or lost it; an
/// error becomes the answer an operator can act on.
fn with_client<T>(
    site: &Site,
    client: &mut Option<Client>,
    work: impl FnOnce(&mut Client) -> Result<T, ActionError>,
) -> Result<T, Response> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = Some(
            connect(&site.database_url, "outbox console")
                .map_err(|e| Response::error(503, &format!("the database is not reachable: {e}")))?,
        );
    }
    let connection = client.as_mut().expect("connected above");
    work(connection).map_err(|e| match e {
        ActionError::Filter(e) => Response::error(400, &e.to_string()),
        ActionError::Database(e) => database_error(&e),
    })
}

/// A refusal of the role's privileges is 403, bad input 400, a statement stopped by its
/// timeout or a lost connection 503.
fn database_error(e: &postgres::Error) -> Response {
    let Some(code) = e.as_db_error().map(|db| db.code().code()) else {
        return Response::error(503, &format!("the database connection failed: {}", error_text(e)));
    };
    match code {
        "42501" => Response::error(403, &format!("the console's role may not do this: {}", error_text(e))),
        "57014" => Response::error(503, &format!("this took too long and was stopped: {}", error_text(e))),
        _ if ["22", "23", "42", "55", "P0"].iter().any(|class| code.starts_with(class)) => Response::error(400, &error_text(e)),
        _ => Response::error(500, &error_text(e)),
    }
}

/// The headers every answer carries.
fn with_headers(response: Response, site: &Site) -> Response {
    let mut response = response
        .with_header("content-security-policy", CONTENT_SECURITY_POLICY)
        .with_header("x-content-type-options", "nosniff")
        .with_header("x-frame-options", "DENY")
        .with_header("referrer-policy", "no-referrer")
        .with_header("cross-origin-resource-policy", "same-origin")
        // A new secret is in an action's answer: nothing is kept by a cache.
        .with_header("cache-control", "no-store");
    if response.status == 401 {
        if let Some(challenge) = site.credentials.challenge() {
            response = response.with_header("www-authenticate", challenge);
        }
    }
    response
}
