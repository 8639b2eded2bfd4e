//! What the relay loop asks of the database, as one trait a driver implements by running
//! the statements of `statements` (each in a short transaction of its own), and the values
//! those statements take and return. The arguments are built here, as columns, so that both
//! drivers bind exactly the same arrays.

use std::sync::Arc;
use std::time::Duration;

use crate::delivery::{retry_delay, Attempt, AttemptKey, Event};
use crate::endpoints::{ClaimPlan, EndpointRow};
use crate::log::batch::Deferrals;
use crate::log::routes::TopicRoute;

/// Why a statement of the queue failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The outbox the driver prepared its statements for is gone: dropped, moved, or changed
    /// version. What is in flight belongs to rows that may no longer exist.
    #[error("the outbox was dropped or changed")]
    Gone,
    /// Anything else (a lock or statement timeout, a lost connection, bad values): the loop
    /// logs it and goes on; what the statement would have recorded is kept or left to a lease.
    #[error("{0}")]
    Failed(String),
}

/// The database's side of the relay loop.
pub trait Queue {
    /// Disables the endpoints failing for longer than `disable_after`, then reads the webhook
    /// endpoints to claim for and the version they are at.
    fn load_endpoints(&mut self, disable_after: Option<Duration>) -> Result<EndpointsRead, QueueError>;
    /// Claims what `claim` asks for, unless the endpoints are no longer at `version`
    /// (`Ok(None)`): rows of `sql/claim_batch.sql`. Only a driver that a server crash stops
    /// too may commit it with synchronous_commit off.
    fn claim_batch(&mut self, claim: &ClaimArguments, version: i64) -> Result<Option<Vec<ClaimedRow>>, QueueError>;
    /// Records acknowledged deliveries durably, in a transaction of their own; returns how
    /// many deliveries of ordered keys that made claimable.
    fn mark_sent(&mut self, acks: &AttemptColumns) -> Result<i64, QueueError>;
    /// Records failed attempts: a retry after backoff, or dead at the attempt cap.
    fn record_failures(&mut self, failures: &FailureColumns) -> Result<Vec<DeadDelivery>, QueueError>;
    /// Takes back the attempts a stopping relay abandons, without waiting on locks for long.
    fn uncount_abandoned(&mut self, abandoned: &AttemptColumns) -> Result<(), QueueError>;
    /// Records, in the health of each endpoint named, why the relay cannot send to it.
    fn note_unusable_endpoints(&mut self, names: &[String], reasons: &[String]) -> Result<(), QueueError>;
    /// Deletes up to `limit` expired deliveries, then the events they leave behind; returns how
    /// many deliveries and unrouted events went.
    fn delete_expired(&mut self, retention: Option<Duration>, dead_retention: Option<Duration>, limit: usize) -> Result<usize, QueueError>;

    // Log mode (sql/log.sql): the relay that holds the lease reads the slot.

    /// Takes the lease on reading the slot, or renews it (`fence`: the one this relay holds,
    /// 0 for none); `None` while another relay holds it, or before log mode was ever on.
    fn log_lease(&mut self, fence: i64, lease: Duration) -> Result<Option<LogLease>, QueueError>;
    /// Makes the slot again if it is missing or lost; true if it did. In autocommit: a slot
    /// cannot be made in a transaction that wrote.
    fn log_make_slot(&mut self, fence: i64) -> Result<bool, QueueError>;
    /// Copies every event the slot may not hold any more into the table path; returns how many
    /// deliveries that made.
    fn log_recover(&mut self, fence: i64) -> Result<i64, QueueError>;
    /// Up to about `max_changes` changes of whole transactions from the slot, not consumed;
    /// `None` if `fence` no longer holds the lease. `after`: the end of the last read still on
    /// its way (0: none), past which a queue that reads ahead reads.
    fn log_read(&mut self, fence: i64, max_changes: i32, after: u64) -> Result<Option<LogRows>, QueueError>;
    /// Whether a read under `fence` may begin before the reads on their way are confirmed: not
    /// for a queue that reads the slot itself, which hands out from its confirmed position.
    fn log_reads_ahead(&self, _fence: i64) -> bool {
        false
    }
    /// Where events of `topics` go (`outbox_log_route`), by the endpoints as they are now.
    fn log_route(&mut self, topics: &[String]) -> Result<Vec<TopicRoute>, QueueError>;
    /// Copies deliveries into the table path; returns how many it made.
    fn log_defer(&mut self, deferrals: &Deferrals) -> Result<i64, QueueError>;
    /// Lets the slot go of everything before `end`; false if this relay lost the lease.
    fn log_confirm(&mut self, fence: i64, end: u64, oldest: i64) -> Result<bool, QueueError>;
    /// Makes the log's next partitions and drops those read and confirmed.
    fn log_maintain(&mut self) -> Result<i32, QueueError>;
}

/// What `log_lease` got: the fence to read and confirm with, and the slot's state
/// (`outbox_log_lease`: ready, missing or lost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLease {
    pub fence: i64,
    pub slot_ready: bool,
}

/// What `log_read` returned: the pgoutput messages, the oldest transaction running when the
/// read began and the WAL positions written and flushed then (0 for flushed: none known, and
/// a read with no transaction confirms nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRows {
    pub messages: Vec<Vec<u8>>,
    pub oldest: i64,
    pub began_at: i64,
    pub flushed_at: i64,
    /// The endpoints' version as the read began.
    pub endpoints_version: i64,
    /// outbox_log's oid: only its rows are events, whatever else a publication of that name
    /// sends.
    pub log_relation: u32,
}

/// What `load_endpoints` read: the endpoints just disabled (name and reason), those to claim
/// for, and the version of the endpoints they are.
pub struct EndpointsRead {
    pub disabled: Vec<(String, String)>,
    pub endpoints: Vec<EndpointRow>,
    pub version: i64,
}

/// The arguments of `sql/claim_batch.sql`, one element per endpoint, and the ordered
/// endpoints whose keys need a head first (`outbox_sequence`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimArguments {
    pub endpoints: Vec<String>,
    pub limits: Vec<i64>,
    /// Milliseconds.
    pub leases: Vec<f64>,
    pub caps: Vec<i32>,
    pub bytes: i64,
    pub ordered: Vec<String>,
}

impl ClaimArguments {
    pub fn new(plan: &ClaimPlan) -> ClaimArguments {
        let claims = &plan.claims;
        ClaimArguments {
            endpoints: claims.iter().map(|claim| claim.endpoint.to_string()).collect(),
            limits: claims.iter().map(|claim| claim.limit as i64).collect(),
            leases: claims.iter().map(|claim| millis(claim.lease)).collect(),
            caps: claims.iter().map(|claim| claim.max_attempts).collect(),
            bytes: plan.bytes as i64,
            ordered: claims.iter().filter(|claim| claim.ordered).map(|claim| claim.endpoint.to_string()).collect(),
        }
    }
}

/// One row of `sql/claim_batch.sql`: a claimed delivery (with its body), one found out of
/// attempts (no body, its last error), or (no endpoint) the mark that the bytes budget left
/// due deliveries out.
#[derive(Debug, Clone, Default)]
pub struct ClaimedRow {
    pub endpoint: Option<String>,
    pub event_id: i64,
    pub attempts: i32,
    pub body: Option<String>,
    pub last_error: Option<String>,
    pub fence: i32,
}

/// What a claim got.
pub struct Claimed {
    pub deliveries: Vec<Event>,
    pub dead: Vec<DeadDelivery>,
    /// Due deliveries were left out for want of budget.
    pub left_out: bool,
}

impl Claimed {
    /// The claim's rows as deliveries to send, sharing the endpoint names of `plan`.
    pub fn from_rows(rows: Vec<ClaimedRow>, plan: &ClaimPlan) -> Claimed {
        let mut claimed = Claimed { deliveries: Vec::new(), dead: Vec::new(), left_out: plan.cut_short };
        for row in rows {
            let Some(endpoint) = row.endpoint else {
                claimed.left_out = true;
                continue;
            };
            match row.body {
                Some(body) => {
                    let Some(claim) = plan.claims.iter().find(|claim| *claim.endpoint == *endpoint) else { continue };
                    claimed.deliveries.push(Event {
                        endpoint: claim.endpoint.clone(),
                        id: row.event_id,
                        attempts: row.attempts,
                        fence: row.fence,
                        body: body.into(),
                    });
                }
                None => claimed.dead.push(DeadDelivery {
                    endpoint,
                    event_id: row.event_id,
                    attempts: row.attempts,
                    last_error: row.last_error.unwrap_or_default(),
                }),
            }
        }
        claimed
    }

    /// How many deliveries of `endpoint` the claim took, dead ones included.
    pub fn taken(&self, endpoint: &str) -> usize {
        self.deliveries.iter().filter(|d| *d.endpoint == *endpoint).count() + self.dead.iter().filter(|d| d.endpoint == endpoint).count()
    }
}

/// A delivery that ran out of attempts, and the last failure it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadDelivery {
    pub endpoint: String,
    pub event_id: i64,
    pub attempts: i32,
    pub last_error: String,
}

/// Attempts as the statements take them: endpoint, event id and fencing token, as columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptColumns {
    pub endpoints: Vec<String>,
    pub ids: Vec<i64>,
    pub fences: Vec<i32>,
}

impl<'a> FromIterator<&'a AttemptKey> for AttemptColumns {
    fn from_iter<I: IntoIterator<Item = &'a AttemptKey>>(keys: I) -> AttemptColumns {
        let mut columns = AttemptColumns::default();
        for (endpoint, id, fence) in keys {
            columns.endpoints.push(endpoint.to_string());
            columns.ids.push(*id);
            columns.fences.push(*fence);
        }
        columns
    }
}

/// Failed attempts as `sql/record_failures.sql` takes them: each with its error, when to try
/// again (milliseconds, backoff with jitter) and its endpoint's attempt cap; and for the
/// history, the receiver's status and the start of its answer (when it answered) and how long
/// the attempt took (milliseconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureColumns {
    pub attempts: AttemptColumns,
    pub errors: Vec<String>,
    pub retry_ms: Vec<f64>,
    pub caps: Vec<i32>,
    pub statuses: Vec<Option<i32>>,
    pub took_ms: Vec<f64>,
    pub responses: Vec<Option<String>>,
}

impl FailureColumns {
    /// `failed` with each one's attempt cap; `jitter` gives each a number in [0, 1).
    pub fn new(failed: &[(&Attempt, i32)], mut jitter: impl FnMut() -> f64) -> FailureColumns {
        let keys: Vec<AttemptKey> = failed.iter().map(|(a, _)| (Arc::clone(&a.endpoint), a.id, a.fence)).collect();
        FailureColumns {
            attempts: keys.iter().collect(),
            errors: failed.iter().map(|(a, _)| a.outcome.last_error().unwrap_or_default()).collect(),
            retry_ms: failed.iter().map(|(a, _)| millis(retry_delay(a.attempts, a.outcome.retry_after(), jitter()))).collect(),
            caps: failed.iter().map(|(_, cap)| *cap).collect(),
            statuses: failed.iter().map(|(a, _)| a.outcome.status().map(i32::from)).collect(),
            took_ms: failed.iter().map(|(a, _)| millis(a.took)).collect(),
            responses: failed.iter().map(|(a, _)| a.outcome.response().map(str::to_string)).collect(),
        }
    }
}

/// A duration as float8 milliseconds, the type the statements multiply an interval by.
pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::Outcome;
    use crate::endpoints::Claim;

    fn plan() -> ClaimPlan {
        let claim =
            |name: &str, ordered| Claim { endpoint: name.into(), limit: 2, lease: Duration::from_millis(1500), max_attempts: 5, ordered };
        ClaimPlan { claims: vec![claim("a", false), claim("b", true)], bytes: 1000, cut_short: false }
    }

    #[test]
    fn claim_arguments_are_the_plan_as_columns() {
        let arguments = ClaimArguments::new(&plan());
        assert_eq!(arguments.endpoints, ["a", "b"]);
        assert_eq!(arguments.limits, [2, 2]);
        assert_eq!(arguments.leases, [1500.0, 1500.0]);
        assert_eq!(arguments.caps, [5, 5]);
        assert_eq!(arguments.bytes, 1000);
        assert_eq!(arguments.ordered, ["b"]);
    }

    #[test]
    fn claimed_rows_become_deliveries_dead_ones_and_the_left_out_mark() {
        let row = |endpoint: Option<&str>, id, body: Option<&str>| ClaimedRow {
            endpoint: endpoint.map(str::to_string),
            event_id: id,
            attempts: 1,
            body: body.map(str::to_string),
            last_error: body.is_none().then(|| "HTTP 500".to_string()),
            fence: 3,
        };
        let plan = plan();
        let claimed = Claimed::from_rows(vec![row(Some("a"), 1, Some("{}")), row(Some("b"), 2, None)], &plan);
        assert_eq!(claimed.deliveries.len(), 1);
        assert!(Arc::ptr_eq(&claimed.deliveries[0].endpoint, &plan.claims[0].endpoint), "the plan's name is shared");
        assert_eq!(claimed.dead, [DeadDelivery { endpoint: "b".into(), event_id: 2, attempts: 1, last_error: "HTTP 500".into() }]);
        assert_eq!((claimed.taken("a"), claimed.taken("b")), (1, 1));
        assert!(!claimed.left_out);
        assert!(Claimed::from_rows(vec![row(None, 0, None)], &plan).left_out);
    }

    #[test]
    fn failures_carry_their_error_backoff_and_cap() {
        let attempt = Attempt {
            endpoint: "a".into(),
            id: 7,
            attempts: 3,
            fence: 2,
            outcome: Outcome::Rejected { status: 503, retry_after: None, response: "try later".into() },
            took: Duration::from_millis(40),
        };
        let columns = FailureColumns::new(&[(&attempt, 9)], || 0.5);
        assert_eq!(columns.attempts, AttemptColumns { endpoints: vec!["a".into()], ids: vec![7], fences: vec![2] });
        assert_eq!(columns.caps, [9]);
        assert_eq!(columns.errors, [attempt.outcome.last_error().unwrap()]);
        assert_eq!(columns.retry_ms, [millis(retry_delay(3, None, 0.5))]);
        assert_eq!((columns.statuses, columns.took_ms, columns.responses), (vec![Some(503)], vec![40.0], vec![Some("try later".into())]));
    }
}
