//! The webhook endpoints a relay sends to, as it last read them: each row made into a
//! `Target` once (again only when the row or a setting it depends on changes), and how many
//! of each endpoint's deliveries the next claim may take.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::delivery::{Attempt, Sender, Target};
use crate::settings::{defaults, Settings};
use crate::shares::share_requests;

/// What one claim takes from one endpoint.
pub struct Claim {
    pub endpoint: Arc<str>,
    /// At most this many deliveries.
    pub limit: usize,
    /// How long the claim holds them.
    pub lease: Duration,
    /// A delivery that already had this many attempts is made dead, not claimed.
    pub max_attempts: i32,
    /// Per-key FIFO: its keys get their heads (`outbox_sequence`) before the claim.
    pub ordered: bool,
}

/// One claim over several endpoints, within the room left in the worker's budgets: the
/// endpoints' limits add up to no more than `outbox.max_requests_in_flight` leaves, and the
/// claim takes about `bytes` of payload (what `outbox.max_bytes_in_flight` leaves).
pub struct ClaimPlan {
    pub claims: Vec<Claim>,
    pub bytes: usize,
    /// The requests budget gave some endpoint less than it could take: due deliveries may be
    /// left out.
    pub cut_short: bool,
}

/// A webhook endpoint as its row says, before the worker makes a `Target` of it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointRow {
    pub name: String,
    pub url: Option<String>,
    pub headers: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// The endpoint's own, else the outbox's (`outbox.max_attempts`, as `sql/limits.sql` reads
    /// it where no session can change it).
    pub max_attempts: i32,
    pub max_in_flight: Option<i32>,
    /// The live signing secrets, newest first.
    pub secrets: Vec<String>,
    pub ordered: bool,
}

/// The endpoint whose null URL means the setting `outbox.webhook_url` (the relay's
/// `--webhook-url`).
const DEFAULT_ENDPOINT: &str = "default";
/// A claim's lease outlasts the endpoint's request timeout by at least this much, so that a
/// delivery is never claimed again while its request may still be running.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

struct Endpoint {
    row: EndpointRow,
    /// What the target was built from besides the row.
    webhook_url: String,
    http_timeout: Duration,
    /// Where to send, or why this endpoint's deliveries wait.
    target: Result<Arc<Target>, String>,
    max_in_flight: usize,
}

#[derive(Default)]
pub struct Endpoints {
    /// `outbox_endpoints_version` when they were read.
    pub version: i64,
    /// Every endpoint seen, also after it was disabled or dropped: failures still in flight
    /// are recorded with its attempt cap.
    known: HashMap<Arc<str>, Endpoint>,
    /// The enabled webhook endpoints of the last read, by name.
    active: Vec<Arc<str>>,
    /// Where the next claim starts handing out what the requests budget leaves over equal
    /// shares: moved at every claim.
    first_served: usize,
}

impl Endpoints {
    /// Takes the rows just read. Returns the endpoints that became unusable with this read,
    /// each with why, for the driver to say once (per change).
    pub fn refresh(&mut self, rows: Vec<EndpointRow>, version: i64, settings: &Settings) -> Vec<(Arc<str>, String)> {
        let mut became_unusable = Vec::new();
        self.version = version;
        self.active.clear();
        for row in rows {
            let name: Arc<str> = row.name.as_str().into();
            let (name, unchanged) = match self.known.get_key_value(&name) {
                Some((known_name, known)) => (
                    known_name.clone(),
                    known.row == row && known.webhook_url == settings.webhook_url && known.http_timeout == settings.http_timeout,
                ),
                None => (name, false),
            };
            if !unchanged {
                let url = match (&row.url, row.name.as_str()) {
                    (Some(url), _) => url.clone(),
                    (None, DEFAULT_ENDPOINT) => settings.webhook_url.clone(),
                    (None, _) => String::new(),
                };
                let target = Target::new(&url, &row.secrets, &row.headers, row.timeout.unwrap_or(settings.http_timeout))
                    .map(Arc::new)
                    .map_err(|reason| match (row.url.is_none(), row.name.as_str()) {
                        (true, DEFAULT_ENDPOINT) => format!(
                            "{reason}: set {}, or give the endpoint default a URL (outbox_endpoint_set('default', 'https://…')), \
                             or drop it (outbox_endpoint_drop('default')) if other endpoints take the events",
                            settings.webhook_url_from
                        ),
                        _ => reason.to_string(),
                    });
                if let Err(reason) = &target {
                    became_unusable.push((name.clone(), reason.clone()));
                }
                let endpoint = Endpoint {
                    row,
                    webhook_url: settings.webhook_url.clone(),
                    http_timeout: settings.http_timeout,
                    target,
                    max_in_flight: 0,
                };
                self.known.insert(name.clone(), endpoint);
            }
            let endpoint = self.known.get_mut(&name).expect("inserted above");
            endpoint.max_in_flight = endpoint.row.max_in_flight.map_or(settings.concurrency, |n| n.max(1) as usize);
            self.active.push(name);
        }
        became_unusable
    }

    /// How many deliveries of each endpoint to claim now, and for how long: none for an
    /// endpoint unless at least half a batch fits in its free request slots, so that claims
    /// stay batched while earlier requests are in flight. Together no more than the worker's
    /// requests budget leaves (`shares`), and about the bytes it leaves; none when either is
    /// spent.
    pub fn claim_plan(&mut self, sender: &Sender, settings: &Settings) -> ClaimPlan {
        let (requests, bytes) = budget_left(sender, settings);
        let mut claims: Vec<Claim> = if requests > 0 && bytes > 0 { self.claims(sender, settings).collect() } else { Vec::new() };
        let wanted: Vec<usize> = claims.iter().map(|claim| claim.limit).collect();
        let idle: Vec<bool> = claims.iter().map(|claim| sender.in_flight_to(&claim.endpoint) == 0).collect();
        let given = share_requests(&wanted, &idle, requests, self.reserve(&claims, sender, settings), self.first_served);
        self.first_served = self.first_served.wrapping_add(1);
        let cut_short = given != wanted;
        for (claim, limit) in claims.iter_mut().zip(given) {
            claim.limit = limit;
        }
        claims.retain(|claim| claim.limit > 0);
        ClaimPlan { claims, bytes, cut_short }
    }

    /// Whether some endpoint, as last read, can take a claim. Asked on every turn of the
    /// worker's loop, so it builds no plan.
    pub fn can_claim(&self, sender: &Sender, settings: &Settings) -> bool {
        let (requests, bytes) = budget_left(sender, settings);
        requests > 0 && bytes > 0 && self.claims(sender, settings).next().is_some()
    }

    /// Whether `finished` gave some endpoint back the room for a claim it lacked: its events
    /// committed meanwhile were left out of every claim, and no commit may come to wake the
    /// worker for them. (What the worker's budgets left out, the claim says: see `left_out`.)
    pub fn room_regained(&self, finished: &[&Attempt], sender: &Sender, settings: &Settings) -> bool {
        self.active.iter().any(|name| {
            let ended = finished.iter().filter(|attempt| attempt.endpoint == *name).count();
            let free = self.free_slots(name, sender, settings);
            let needed = self.room_needed(name, sender, settings);
            // Saturating: max_in_flight may have been lowered below what was in flight.
            ended > 0 && free >= needed && free.saturating_sub(ended) < needed
        })
    }

    /// The most requests an endpoint may have in flight now: its own max_in_flight, and its
    /// share of the worker's `outbox.max_requests_in_flight`. The endpoints with requests in
    /// flight share that, with one share kept for an endpoint that has none yet, so however
    /// many endpoints hang (each holding its share until its requests time out), the others
    /// still get theirs.
    fn slots(&self, name: &str, sender: &Sender, settings: &Settings) -> usize {
        let share = (settings.max_requests_in_flight / (sender.busy_endpoints() + 1)).max(1);
        self.known[name].max_in_flight.min(share)
    }

    /// Requests kept back for the enabled endpoints not in `claims` that have nothing in
    /// flight, one each, so that a claim for endpoints that hang leaves one for each of them.
    /// At most half the budget, so that many idle endpoints do not starve a busy one.
    fn reserve(&self, claims: &[Claim], sender: &Sender, settings: &Settings) -> usize {
        let claiming: HashSet<&str> = claims.iter().map(|claim| &*claim.endpoint).collect();
        let idle = self.active.iter().filter(|name| sender.in_flight_to(name) == 0 && !claiming.contains(&***name)).count();
        idle.min(settings.max_requests_in_flight / 2)
    }

    fn free_slots(&self, name: &str, sender: &Sender, settings: &Settings) -> usize {
        self.slots(name, sender, settings).saturating_sub(sender.in_flight_to(name))
    }

    /// Free request slots an endpoint needs for a claim: half a batch (of what fits its slots).
    fn room_needed(&self, name: &str, sender: &Sender, settings: &Settings) -> usize {
        settings.batch_size.min(self.slots(name, sender, settings)).div_ceil(2)
    }

    fn claims<'a>(&'a self, sender: &'a Sender, settings: &'a Settings) -> impl Iterator<Item = Claim> + 'a {
        self.active.iter().filter_map(move |name| {
            let endpoint = &self.known[name];
            let target = endpoint.target.as_ref().ok()?;
            let free = self.free_slots(name, sender, settings);
            (free >= self.room_needed(name, sender, settings)).then(|| Claim {
                endpoint: name.clone(),
                limit: free.min(settings.batch_size),
                lease: settings.lease.max(target.timeout + LEASE_MARGIN),
                max_attempts: endpoint.row.max_attempts,
                ordered: endpoint.row.ordered,
            })
        })
    }

    /// The endpoint's name as the relay shares it, if it can be sent to.
    pub fn sendable(&self, name: &str) -> Option<Arc<str>> {
        let (name, endpoint) = self.known.get_key_value(name)?;
        endpoint.target.is_ok().then(|| name.clone())
    }

    /// Whether one more request to the endpoint fits in its request slots and the worker's
    /// budgets (a delivery read from the log, which is sent without a claim).
    pub fn has_room(&self, name: &str, sender: &Sender, settings: &Settings) -> bool {
        let (requests, bytes) = budget_left(sender, settings);
        requests > 0 && bytes > 0 && self.known.contains_key(name) && self.free_slots(name, sender, settings) > 0
    }

    pub fn target(&self, name: &str) -> Option<Arc<Target>> {
        self.known.get(name)?.target.as_ref().ok().cloned()
    }

    /// The enabled endpoints of the last read that cannot be sent to, with the reason, as
    /// their health records it (names, reasons).
    pub fn unusable(&self) -> (Vec<String>, Vec<String>) {
        self.active
            .iter()
            .filter_map(|name| {
                let reason = self.known.get(name)?.target.as_ref().err()?;
                Some((name.to_string(), format!("cannot be sent to: {reason}")))
            })
            .unzip()
    }

    /// The attempt cap of an endpoint, or the default for one never seen.
    pub fn max_attempts(&self, name: &str) -> i32 {
        self.known.get(name).map_or(defaults::MAX_ATTEMPTS, |endpoint| endpoint.row.max_attempts)
    }
}

/// The room left in the worker's budgets over all endpoints: (requests, bytes).
fn budget_left(sender: &Sender, settings: &Settings) -> (usize, usize) {
    (settings.max_requests_in_flight.saturating_sub(sender.in_flight()), settings.max_bytes_in_flight.saturating_sub(sender.held_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(webhook_url: &str) -> Settings {
        Settings {
            webhook_url: webhook_url.to_string(),
            webhook_url_from: "outbox.webhook_url",
            http_timeout: Duration::from_secs(10),
            batch_size: 100,
            concurrency: 128,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            retention: None,
            endpoint_disable_after: None,
            dead_retention: None,
            allowed_destinations: "0.0.0.0/0, ::/0".to_string(),
            server_allowed_destinations: None,
            max_requests_in_flight: 256,
            max_bytes_in_flight: 64 << 20,
        }
    }

    fn row(name: &str, url: Option<&str>) -> EndpointRow {
        EndpointRow {
            name: name.to_string(),
            url: url.map(str::to_string),
            headers: Vec::new(),
            timeout: None,
            max_attempts: 10,
            max_in_flight: None,
            secrets: Vec::new(),
            ordered: false,
        }
    }

    #[test]
    fn an_endpoint_that_cannot_be_sent_to_is_reported_once_per_change() {
        let mut endpoints = Endpoints::default();
        let rows = vec![row(DEFAULT_ENDPOINT, None), row("orders", Some("http://127.0.0.1:9/orders"))];
        let unusable = endpoints.refresh(rows.clone(), 1, &settings(""));
        assert_eq!(unusable.len(), 1, "{unusable:?}");
        assert_eq!(&*unusable[0].0, DEFAULT_ENDPOINT);
        assert!(unusable[0].1.contains("set outbox.webhook_url"), "{}", unusable[0].1);
        assert!(unusable[0].1.contains("outbox_endpoint_drop('default')"), "{}", unusable[0].1);
        let relay = Settings { webhook_url_from: "--webhook-url", ..settings("") };
        let said = Endpoints::default().refresh(vec![row(DEFAULT_ENDPOINT, None)], 1, &relay);
        assert!(said[0].1.contains("set --webhook-url,") && !said[0].1.contains("outbox.webhook_url"), "{}", said[0].1);
        assert!(endpoints.refresh(rows.clone(), 2, &settings("")).is_empty(), "unchanged: not said again");
        assert!(endpoints.refresh(rows.clone(), 3, &settings("http://127.0.0.1:9/")).is_empty(), "the setting fixed it");
        assert_eq!(endpoints.refresh(rows, 4, &settings("")).len(), 1, "unset again: said again");
    }
}
