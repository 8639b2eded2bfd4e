//! The console over HTTP: routes, the page compiled into the binary, and the headers that keep
//! what it shows inert (a strict Content-Security-Policy; the page's script sets text, never
//! markup).

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use postgres::Client;
use tiny_http::{Header, Method, Request, Response, Server};

use super::actions::{Action, ActionError, Actions};
use super::filter::Filter;
use super::guard::{self, Credentials};
use super::reads::{Page, Reads};
use crate::connection::{connect, error_text};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// Scripts, styles and requests only from the console itself; no frames, no plugins, no
/// inline script or style: a payload that reached the page as markup could still run nothing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An action's body is a few fields: anything longer is refused unread.
const MAX_ACTION_BYTES: u64 = 64 * 1024;

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

/// An answer: status, content type and body.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Answer {
    fn json(status: u16, body: String) -> Answer {
        Answer { status, content_type: "application/json", body }
    }

    fn error(status: u16, message: &str) -> Answer {
        Answer::json(status, serde_json::json!({ "error": message }).to_string())
    }
}

/// Serves requests until `stopping` is set and the server unblocked; `client` is a first
/// connection to use. A connection that failed before its request arrived is only skipped.
pub fn serve(http: &Server, site: &Site, mut client: Option<Client>, stopping: &AtomicBool) {
    loop {
        match http.recv() {
            Ok(mut request) => {
                let answer = answer(&mut request, site, &mut client);
                // The browser may have gone: nothing is left to tell it.
                let _ = request.respond(with_headers(answer, site));
            }
            Err(_) if stopping.load(Ordering::SeqCst) => return,
            Err(_) => continue,
        }
    }
}

fn answer(request: &mut Request, site: &Site, client: &mut Option<Client>) -> Answer {
    if !site.credentials.admit(request) {
        return Answer::error(401, "authentication required");
    }
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let Some(route) = path.strip_prefix(&site.prefix) else {
        return Answer::error(404, "not found");
    };
    let method = request.method().clone();
    match (method, route) {
        (Method::Get, "/" | "/index.html") => Answer { status: 200, content_type: "text/html; charset=utf-8", body: INDEX.to_string() },
        (Method::Get, "/console.js") => Answer { status: 200, content_type: "text/javascript; charset=utf-8", body: SCRIPT.to_string() },
        (Method::Get, "/console.css") => Answer { status: 200, content_type: "text/css; charset=utf-8", body: STYLE.to_string() },
        (Method::Get, "") => Answer { status: 308, content_type: "text/plain", body: format!("{}/", site.prefix) },
        (Method::Get, "/api/session") => session(site, client),
        (Method::Get, "/api/endpoints") => read(site, client, &Page::Endpoints),
        (Method::Get, "/api/activity") => read(site, client, &Page::Activity),
        (Method::Get, "/api/relays") => read(site, client, &Page::Relays),
        (Method::Get, "/api/leases") => read(site, client, &Page::Leases),
        (Method::Get, "/api/event") => match query.strip_prefix("id=").and_then(|id| id.parse::<i64>().ok()) {
            Some(id) => read(site, client, &Page::Event(id)),
            None => Answer::error(400, "give the event's id: /api/event?id=42"),
        },
        (Method::Get, "/api/events" | "/api/count" | "/api/count/exact") => match Filter::parse(query) {
            Ok(filter) if route == "/api/events" => read(site, client, &Page::Events(filter)),
            Ok(filter) => read(site, client, &Page::Count(filter, route == "/api/count/exact")),
            Err(e) => Answer::error(400, &e.to_string()),
        },
        (Method::Post, "/api/action") => act(request, site, client),
        (_, "/api/action") => Answer::error(405, "an action is a POST"),
        _ => Answer::error(404, "not found"),
    }
}

/// The token the page sends with its actions, whether actions are refused, and what the role
/// may read and do.
fn session(site: &Site, client: &mut Option<Client>) -> Answer {
    with_client(site, client, |client| Ok(site.reads.read(client, &Page::Access)?)).map_or_else(
        |answer| answer,
        |access| {
            let access = access.unwrap_or_else(|| "{}".into());
            let read_only = site.read_only;
            let token = serde_json::Value::String(site.token.clone());
            Answer::json(200, format!("{{\"token\":{token},\"read_only\":{read_only},\"access\":{access}}}"))
        },
    )
}

fn read(site: &Site, client: &mut Option<Client>, page: &Page) -> Answer {
    match with_client(site, client, |client| Ok(site.reads.read(client, page)?)) {
        Ok(Some(json)) => Answer::json(200, json),
        Ok(None) => Answer::error(404, "no such event: it was never enqueued, rolled back, or retention removed it"),
        Err(answer) => answer,
    }
}

fn act(request: &mut Request, site: &Site, client: &mut Option<Client>) -> Answer {
    if let Some(reason) = guard::cross_site(request, &site.token) {
        return Answer::error(403, reason);
    }
    if site.read_only {
        return Answer::error(403, "this console is read-only (--read-only): it changes nothing");
    }
    let mut body = String::new();
    if request.as_reader().take(MAX_ACTION_BYTES + 1).read_to_string(&mut body).is_err() || body.len() as u64 > MAX_ACTION_BYTES {
        return Answer::error(400, "an action is a JSON object of at most 64 kB");
    }
    let action: Action = match serde_json::from_str(&body) {
        Ok(action) => action,
        Err(e) => return Answer::error(400, &format!("not an action: {e}")),
    };
    match with_client(site, client, |client| site.actions.run(client, &action)) {
        Ok(result) => Answer::json(200, result),
        Err(answer) => answer,
    }
}

/// Runs `work` on this thread's connection, connecting first if it has none or lost it; an
/// error becomes the answer an operator can act on.
fn with_client<T>(site: &Site, client: &mut Option<Client>, work: impl FnOnce(&mut Client) -> Result<T, ActionError>) -> Result<T, Answer> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = Some(
            connect(&site.database_url, "outbox console")
                .map_err(|e| Answer::error(503, &format!("the database is not reachable: {e}")))?,
        );
    }
    let connection = client.as_mut().expect("connected above");
    work(connection).map_err(|e| match e {
        ActionError::Filter(e) => Answer::error(400, &e.to_string()),
        ActionError::Database(e) => database_error(&e),
    })
}

/// A refusal of the role's privileges is 403, bad input 400, a statement stopped by its
/// timeout or a lost connection 503.
fn database_error(e: &postgres::Error) -> Answer {
    let Some(code) = e.as_db_error().map(|db| db.code().code()) else {
        return Answer::error(503, &format!("the database connection failed: {}", error_text(e)));
    };
    match code {
        "42501" => Answer::error(403, &format!("the console's role may not do this: {}", error_text(e))),
        "57014" => Answer::error(503, &format!("this took too long and was stopped: {}", error_text(e))),
        _ if ["22", "23", "42", "55", "P0"].iter().any(|class| code.starts_with(class)) => Answer::error(400, &error_text(e)),
        _ => Answer::error(500, &error_text(e)),
    }
}

fn with_headers(answer: Answer, site: &Site) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut response = Response::from_string(answer.body).with_status_code(answer.status);
    let mut headers = vec![
        ("content-type", answer.content_type.to_string()),
        ("content-security-policy", CONTENT_SECURITY_POLICY.to_string()),
        ("x-content-type-options", "nosniff".to_string()),
        ("x-frame-options", "DENY".to_string()),
        ("referrer-policy", "no-referrer".to_string()),
        ("cross-origin-resource-policy", "same-origin".to_string()),
        // A new secret is in an action's answer: nothing is kept by a cache.
        ("cache-control", "no-store".to_string()),
    ];
    if answer.status == 308 {
        headers.push(("location", format!("{}/", site.prefix)));
    }
    if answer.status == 401 {
        if let Some(challenge) = site.credentials.challenge() {
            headers.push(("www-authenticate", challenge.to_string()));
        }
    }
    for (name, value) in headers {
        response.add_header(Header::from_bytes(name, value).expect("a valid header"));
    }
    response
}
