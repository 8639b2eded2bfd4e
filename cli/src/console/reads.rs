//! What the console reads: each page's data as JSON, made by one statement of `sql/` in a
//! read-only transaction under a statement timeout, with the privileges of the console's role.

use postgres::types::{ToSql, Type};
use postgres::Client;

use super::filter::{self, with_filter, Filter};
use outbox_core::statements::qualify;

/// How long a page's statement may run: pages answer in milliseconds, so a statement this
/// slow means a table far bigger than its indexes expect; better an error than a stuck page.
const PAGE_TIMEOUT: &str = "5s";

/// How long the exact count before a bulk action may run: it reads every match.
pub const BULK_TIMEOUT: &str = "60s";

/// The events page counts matches up to this many; more is shown as "more than".
pub const COUNT_CAP: i64 = 10_000;

/// The statements, named by the outbox's schema.
pub struct Reads {
    schema: String,
    access: String,
    endpoints: String,
    activity: String,
    relays: String,
    leases: String,
    event: String,
    events: String,
    count: String,
    estimate: String,
}

/// A page's data.
#[derive(Debug, Clone, PartialEq)]
pub enum Page {
    /// What the role may read and do.
    Access,
    Endpoints,
    Activity,
    Relays,
    Leases,
    Event(i64),
    Events(Filter),
    /// How many deliveries the filter matches, up to `COUNT_CAP`, or all of them when asked
    /// (the count a bulk action shows before it runs).
    Count(Filter, bool),
}

impl Reads {
    pub fn new(schema: &str) -> Reads {
        Reads {
            schema: schema.to_string(),
            access: include_str!("sql/access.sql").to_string(),
            endpoints: qualify(include_str!("sql/endpoints.sql"), schema),
            activity: qualify(include_str!("sql/activity.sql"), schema),
            relays: qualify(include_str!("sql/relays.sql"), schema),
            leases: qualify(include_str!("sql/leases.sql"), schema),
            event: qualify(include_str!("sql/event.sql"), schema),
            events: with_filter(include_str!("sql/events.sql"), schema),
            count: with_filter(include_str!("sql/count.sql"), schema),
            estimate: filter::estimate(schema),
        }
    }

    /// The page's JSON; `None` when it names nothing (an event that does not exist).
    pub fn read(&self, client: &mut Client, page: &Page) -> Result<Option<String>, postgres::Error> {
        let timeout = if matches!(page, Page::Count(_, true)) { BULK_TIMEOUT } else { PAGE_TIMEOUT };
        let mut transaction = client.build_transaction().read_only(true).start()?;
        transaction.batch_execute(&format!("SET LOCAL statement_timeout = '{timeout}'"))?;
        let row = match page {
            Page::Access => transaction.query_typed_opt(&self.access, &[(&self.schema, Type::TEXT)])?,
            Page::Endpoints => transaction.query_typed_opt(&self.endpoints, &[])?,
            Page::Activity => transaction.query_typed_opt(&self.activity, &[])?,
            Page::Relays => transaction.query_typed_opt(&self.relays, &[])?,
            Page::Leases => transaction.query_typed_opt(&self.leases, &[])?,
            Page::Event(id) => transaction.query_typed_opt(&self.event, &[(id, Type::INT8)])?,
            Page::Events(filter) => {
                let (after_id, after_endpoint) = filter.after.clone().map_or((None, None), |(id, endpoint)| (Some(id), Some(endpoint)));
                let mut parameters = filter.parameters();
                parameters.push((&after_id, Type::INT8));
                parameters.push((&after_endpoint, Type::TEXT));
                transaction.query_typed_opt(&self.events, &parameters)?
            }
            Page::Count(filter, exact) => {
                let cap = if *exact { i64::MAX } else { COUNT_CAP + 1 };
                let mut parameters: Vec<(&(dyn ToSql + Sync), Type)> = filter.parameters();
                parameters.push((&cap, Type::INT8));
                let count: i64 = transaction.query_typed_one(&self.count, &parameters)?.get(0);
                if count < cap {
                    transaction.commit()?;
                    return Ok(Some(format!("{{\"count\":{count},\"more\":false}}")));
                }
                parameters.pop();
                let plan = transaction.query_typed(&self.estimate, &parameters)?;
                let plan: String = plan.first().map_or_else(String::new, |line| line.get(0));
                transaction.commit()?;
                let estimate = planned_rows(&plan).map_or("null".to_string(), |rows| rows.max(COUNT_CAP).to_string());
                return Ok(Some(format!("{{\"count\":{COUNT_CAP},\"more\":true,\"estimate\":{estimate}}}")));
            }
        };
        transaction.commit()?;
        Ok(row.map(|row| row.get(0)))
    }
}

/// The rows the top of a plan expects, from EXPLAIN's first line (`… (cost=… rows=N width=…)`).
fn planned_rows(plan: &str) -> Option<i64> {
    let after = &plan[plan.find(" rows=")? + " rows=".len()..];
    after[..after.find(|c: char| !c.is_ascii_digit())?].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_rows_the_plan_expects() {
        assert_eq!(planned_rows("Hash Join  (cost=1.00..2.00 rows=123456 width=0)"), Some(123456));
        assert_eq!(planned_rows("Result  (cost=0.00..0.01 rows=1 width=0)"), Some(1));
        assert_eq!(planned_rows("nothing here"), None);
    }
}
