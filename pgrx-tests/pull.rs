//! Pull endpoints: consumers claim, ack, nack and extend over SQL, fenced by the attempt
//! number, with the workers' backoff and attempt cap; the relay leaves them alone; an
//! endpoint may notify its listeners at commit.

use std::collections::BTreeSet;
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::cluster::{db, wait_until, Db};
use super::receiver::{Receiver, Reply};

/// A claimed delivery: (event id, attempt).
type Claim = (i64, i32);

fn pull_endpoint(db: &mut Db, name: &str, topics: &str, extra: &str) {
    db.execute(&format!("SELECT outbox_endpoint_set('{name}', NULL, '{topics}', kind => 'pull'{extra})"));
}

fn claim(client: &mut postgres::Client, endpoint: &str, max: i32, lease: &str) -> Vec<Claim> {
    client
        .query("SELECT event_id, attempt FROM outbox_claim($1, $2, $3::text::interval)", &[&endpoint, &max, &lease])
        .unwrap_or_else(|e| panic!("outbox_claim: {e}"))
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Calls outbox_ack, outbox_nack or outbox_extend (`call`, with its SQL arguments after the
/// endpoint) and returns its answer.
fn answer(db: &mut Db, call: &str) -> bool {
    db.value(&format!("SELECT {call}"))
}

#[test]
fn a_pull_endpoint_is_claimed_and_acked_over_sql_and_the_relay_never_claims_it() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    pull_endpoint(&mut db, "jobs", "{job.*}", "");
    let jobs: Vec<i64> =
        (1..=5).map(|n| db.value(&format!("SELECT outbox_enqueue('job.email', '{{\"n\": {n}}}', key => 'k{n}')"))).collect();
    // The workers deliver default's copy of the last job; claims come in id order, so by then
    // they have claimed past every pull delivery, had they been claiming those.
    wait_until("the webhook copy of the last job is sent", Duration::from_secs(10), || db.is_sent(jobs[4]));
    assert_eq!(db.count_to("jobs", "attempts = 0"), 5, "the relay workers never claim a pull endpoint");

    let rows =
        db.client.query("SELECT event_id, topic, payload::text, key, attempt FROM outbox_claim('jobs', 3)", &[]).expect("outbox_claim");
    let first: Vec<(i64, String, String, String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    assert_eq!(
        first,
        (0..3).map(|i| (jobs[i], "job.email".to_string(), format!("{{\"n\": {}}}", i + 1), format!("k{}", i + 1), 1)).collect::<Vec<_>>()
    );
    let rest = claim(&mut db.client, "jobs", 10, "30 s");
    assert_eq!(rest, vec![(jobs[3], 1), (jobs[4], 1)]);
    assert!(claim(&mut db.client, "jobs", 10, "30 s").is_empty(), "claimed deliveries are leased");

    for &id in &jobs[..3] {
        assert!(answer(&mut db, &format!("outbox_ack('jobs', {id}, 1)")));
    }
    // A batch: the ids whose attempt is the current claim, or sent the delivery, come back.
    let mut acked: Vec<i64> =
        db.column(&format!("SELECT outbox_ack_batch('jobs', ARRAY[{}, {}, {}], ARRAY[1, 1, 2])", jobs[3], jobs[4], jobs[0]));
    acked.sort();
    assert_eq!(acked, vec![jobs[3], jobs[4]], "attempt 2 of the first job is no claim");
    assert!(answer(&mut db, &format!("outbox_ack('jobs', {}, 1)", jobs[0])), "a repeated ack is answered as the first");
    assert_eq!(db.count_to("jobs", "sent_at IS NOT NULL"), 5);
    let stats: (i64, i64) = {
        let row = db.client.query_one("SELECT pending, waiting FROM outbox_endpoint_stats() WHERE endpoint = 'jobs'", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(stats, (0, 0));
    assert_eq!(db.value::<i64>("SELECT sent FROM outbox_stats()"), 10, "five webhook and five pull deliveries counted");
    assert!(db.value::<bool>("SELECT last_success_at IS NOT NULL FROM outbox_endpoints WHERE name = 'jobs'"));

    // Replay makes sent ones claimable again, with a fresh budget of attempts and an attempt
    // number no earlier claim had.
    assert_eq!(db.value::<i64>("SELECT outbox_replay('jobs', now() - interval '1 hour')"), 5);
    assert_eq!(claim(&mut db.client, "jobs", 10, "30 s"), jobs.iter().map(|&id| (id, 2)).collect::<Vec<_>>());
    assert_eq!(db.count_to("jobs", "attempts = 1"), 5);
}

#[test]
fn a_consumer_whose_lease_ran_out_cannot_ack_nack_or_extend_after_another_claimed() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", "");
    let id = db.enqueue("job", "{}");
    assert_eq!(claim(&mut db.client, "jobs", 1, "100 ms"), vec![(id, 1)]);
    let mut second = Vec::new();
    wait_until("the lease runs out and another consumer claims the job", Duration::from_secs(10), || {
        second = claim(&mut db.client, "jobs", 1, "30 s");
        !second.is_empty()
    });
    assert_eq!(second, vec![(id, 2)]);
    let before: String = db.value(&format!("SELECT row(d.*)::text FROM outbox_deliveries d WHERE endpoint = 'jobs' AND event_id = {id}"));
    for stale in [
        format!("outbox_ack('jobs', {id}, 1)"),
        format!("outbox_nack('jobs', {id}, 1, 'late')"),
        format!("outbox_extend('jobs', {id}, 1, '1 hour')"),
    ] {
        assert!(!answer(&mut db, &stale), "{stale} is fenced off");
    }
    let after: String = db.value(&format!("SELECT row(d.*)::text FROM outbox_deliveries d WHERE endpoint = 'jobs' AND event_id = {id}"));
    assert_eq!(after, before, "the stale consumer changed nothing");

    assert!(answer(&mut db, &format!("outbox_extend('jobs', {id}, 2, '1 hour')")), "the current claim extends");
    assert!(db.value::<bool>(&format!(
        "SELECT available_at > now() + interval '59 minutes' FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}"
    )));
    assert!(answer(&mut db, &format!("outbox_ack('jobs', {id}, 2)")));
    assert!(!answer(&mut db, &format!("outbox_ack('jobs', {id}, 1)")), "still fenced after the ack");
}

#[test]
fn nack_backs_off_or_waits_retry_in_and_the_attempt_cap_makes_the_job_dead() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", ", max_attempts => 3");
    let id = db.enqueue("job", "{}");
    let due_in = |db: &mut Db| -> f64 {
        db.value(&format!(
            "SELECT extract(epoch FROM available_at - now())::float8 FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}"
        ))
    };

    assert_eq!(claim(&mut db.client, "jobs", 1, "30 s"), vec![(id, 1)]);
    assert!(answer(&mut db, &format!("outbox_nack('jobs', {id}, 1, 'smtp: 451 try later', '0 s')")));
    assert!(!answer(&mut db, &format!("outbox_nack('jobs', {id}, 1, 'again')")), "a nacked attempt is no claim any more");
    assert!(!answer(&mut db, &format!("outbox_ack('jobs', {id}, 1)")), "nor can it be acked");
    assert_eq!(claim(&mut db.client, "jobs", 1, "30 s"), vec![(id, 2)], "retry_in 0: due at once");

    // Without retry_in, the relay's backoff: 2 s after the second attempt, jittered over its upper half.
    assert!(answer(&mut db, &format!("outbox_nack('jobs', {id}, 2, 'timeout')")));
    let delay = due_in(&mut db);
    assert!((0.9..=2.0).contains(&delay), "second attempt backs off 1 to 2 s, not {delay}");
    assert!(claim(&mut db.client, "jobs", 1, "30 s").is_empty(), "not claimable while backing off");
    let health: (bool, String) = {
        let row =
            db.client.query_one("SELECT failing_since IS NOT NULL, last_error FROM outbox_endpoints WHERE name = 'jobs'", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(health, (true, "timeout".to_string()));

    db.execute(&format!("UPDATE outbox_deliveries SET available_at = now() WHERE endpoint = 'jobs' AND event_id = {id}"));
    assert_eq!(claim(&mut db.client, "jobs", 1, "30 s"), vec![(id, 3)]);
    assert!(answer(&mut db, &format!("outbox_nack('jobs', {id}, 3, E'boom\\nline two')")), "the nack that reaches the cap");
    assert!(db.value::<bool>(&format!("SELECT dead_at IS NOT NULL FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}")));
    assert_eq!(
        db.value::<String>(&format!("SELECT last_error FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}")),
        "boom line two"
    );
    assert_eq!(db.value::<i64>("SELECT dead FROM outbox_stats()"), 1);
    assert!(claim(&mut db.client, "jobs", 1, "30 s").is_empty(), "a dead job is not claimed");
    assert!(!answer(&mut db, &format!("outbox_ack('jobs', {id}, 3)")), "nor acked");

    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id}, 'jobs')")), 1);
    assert_eq!(claim(&mut db.client, "jobs", 1, "30 s"), vec![(id, 4)], "the attempt number goes on");
    assert_eq!(db.count_to("jobs", &format!("id = {id} AND attempts = 1")), 1, "requeue starts the attempts afresh");
}

#[test]
fn claims_skip_what_others_hold_never_take_a_future_deliver_at_and_stop_while_disabled() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", "");
    let later: i64 = db.value("SELECT outbox_enqueue('job', '{}', deliver_at => now() + interval '1 hour')");
    let ids: BTreeSet<i64> = (0..200).map(|_| db.enqueue("job", "{}")).collect();

    // Two consumers claim at the same time until nothing is left: each job goes to one of them.
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let mut client = db.connect("pgrx_tests", "postgres");
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                loop {
                    let batch = claim(&mut client, "jobs", 7, "30 s");
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(batch.into_iter().map(|(id, _)| id));
                }
            })
        })
        .collect();
    let taken: Vec<Vec<i64>> = consumers.into_iter().map(|c| c.join().expect("consumer")).collect();
    let all: BTreeSet<i64> = taken.iter().flatten().copied().collect();
    assert_eq!(taken.iter().map(Vec::len).sum::<usize>(), all.len(), "no job was claimed twice");
    assert_eq!(all, ids, "every due job was claimed, the scheduled one was not");
    assert!(!all.contains(&later));
    assert_eq!(db.value::<i64>("SELECT waiting FROM outbox_endpoint_stats() WHERE endpoint = 'jobs'"), 201);

    db.execute(&format!("UPDATE outbox_deliveries SET available_at = now() WHERE endpoint = 'jobs' AND event_id = {later}"));
    db.execute("SELECT outbox_endpoint_disable('jobs')");
    assert!(claim(&mut db.client, "jobs", 10, "30 s").is_empty(), "a disabled endpoint gives nothing");
    db.execute("SELECT outbox_endpoint_enable('jobs')");
    assert_eq!(claim(&mut db.client, "jobs", 10, "30 s"), vec![(later, 1)]);
}

#[test]
fn bad_pull_calls_are_class_22_errors() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", "");
    for (sql, message) in [
        ("SELECT * FROM outbox_claim('default')", "is a webhook endpoint"),
        ("SELECT * FROM outbox_claim('missing')", "does not exist"),
        ("SELECT * FROM outbox_claim('jobs', 0)", "max_events must be"),
        ("SELECT * FROM outbox_claim('jobs', 10, '0 s')", "lease must be positive"),
        ("SELECT * FROM outbox_claim('jobs', 10, '2 days')", "at most 1 day"),
        ("SELECT outbox_ack('default', 1, 1)", "outbox_ack: endpoint 'default' is a webhook endpoint"),
        ("SELECT outbox_ack('missing', 1, 1)", "outbox_ack: endpoint 'missing' does not exist"),
        ("SELECT outbox_nack('missing', 1, 1, 'e')", "does not exist"),
        ("SELECT outbox_nack('jobs', 1, 1, 'e', '-1 s')", "between 0 and 1 day"),
        ("SELECT outbox_nack('jobs', 1, 1, 'e', '100 years')", "between 0 and 1 day"),
        ("SELECT outbox_ack_batch('jobs', ARRAY[1, 2], ARRAY[1])", "same length"),
        ("SELECT outbox_ack_batch('missing', '{}', '{}')", "outbox_ack_batch: endpoint 'missing' does not exist"),
        ("SELECT outbox_endpoint_set('default', NULL, kind => 'pull')", "a name of its own"),
        ("SELECT outbox_extend('jobs', 1, 1, NULL)", "lease must be positive"),
        ("SELECT outbox_endpoint_set('p', 'http://127.0.0.1/', kind => 'pull')", "has no url"),
        ("SELECT outbox_endpoint_set('p', NULL, kind => 'pull', timeout => '1 s')", "are for webhook requests"),
        ("SELECT outbox_endpoint_set('p', 'http://127.0.0.1/', notify => true)", "only a pull endpoint notifies"),
        ("SELECT outbox_endpoint_set(repeat('p', 57), NULL, kind => 'pull', notify => true)", "at most 56 bytes"),
    ] {
        let error = db.client.batch_execute(sql).expect_err(sql);
        let error = error.as_db_error().unwrap_or_else(|| panic!("{sql}: {error}"));
        assert_eq!(error.code().code(), "22023", "{sql}: {}", error.message());
        assert!(error.message().contains(message), "{sql}: {:?} should say {message:?}", error.message());
    }
}

#[test]
fn an_endpoint_that_notifies_wakes_its_listeners_at_commit_and_not_on_rollback() {
    let mut db = db();
    pull_endpoint(&mut db, "loud", "{*}", ", notify => true");
    pull_endpoint(&mut db, "quiet", "{*}", "");
    let mut listener = db.connect("pgrx_tests", "postgres");
    listener.batch_execute("LISTEN \"outbox.loud\"; LISTEN \"outbox.quiet\"").unwrap();
    let mut next = |timeout: Duration| -> Option<String> {
        listener.notifications().timeout_iter(timeout).next().unwrap().map(|n| n.channel().to_string())
    };

    let mut tx = db.client.transaction().unwrap();
    tx.execute("SELECT outbox_enqueue('job', '{}')", &[]).unwrap();
    tx.execute("SELECT outbox_enqueue('job', '{}')", &[]).unwrap();
    tx.rollback().unwrap();
    let mut tx = db.client.transaction().unwrap();
    tx.execute("SELECT outbox_enqueue('job', '{}')", &[]).unwrap();
    tx.execute("SELECT outbox_enqueue('job', '{}')", &[]).unwrap();
    tx.commit().unwrap();

    // Notifications come in commit order: had the rolled-back transaction notified, or did
    // quiet notify, it would come before or with this one.
    assert_eq!(next(Duration::from_secs(10)).as_deref(), Some("outbox.loud"));
    assert_eq!(next(Duration::ZERO), None, "one notification per transaction, none for quiet or the rollback");
}

#[test]
fn a_job_whose_last_lease_runs_out_unanswered_is_dead_instead_of_claimed_forever() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", ", max_attempts => 2");
    let id = db.enqueue("job", "{}");
    // A consumer that dies on this job every time: it claims, then never acks nor nacks.
    for attempt in 1..=2 {
        let mut claimed = Vec::new();
        wait_until("the lease runs out and the job is claimed again", Duration::from_secs(10), || {
            claimed = claim(&mut db.client, "jobs", 1, "100 ms");
            !claimed.is_empty()
        });
        assert_eq!(claimed, vec![(id, attempt)]);
    }
    wait_until("the last lease runs out and a claim finds the job", Duration::from_secs(10), || {
        assert!(claim(&mut db.client, "jobs", 1, "100 ms").is_empty(), "claimed past the cap");
        db.value::<bool>(&format!("SELECT dead_at IS NOT NULL FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}"))
    });
    let error: String = db.value(&format!("SELECT last_error FROM outbox_deliveries WHERE endpoint = 'jobs' AND event_id = {id}"));
    assert_eq!(error, "the lease of attempt 2 ran out with no ack or nack");
}

#[test]
fn a_claim_skips_rows_another_transaction_holds_instead_of_waiting_for_them() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{*}", "");
    let ids: Vec<i64> = (0..4).map(|_| db.enqueue("job", "{}")).collect();
    let mut holder = db.connect("pgrx_tests", "postgres");
    let mut held = holder.transaction().unwrap();
    // A consumer that claimed inside a transaction still open: its rows stay locked.
    let first: Vec<i64> = held.query("SELECT event_id FROM outbox_claim('jobs', 2)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(first, ids[..2]);
    db.execute("SET lock_timeout = '200ms'");
    let second = claim(&mut db.client, "jobs", 4, "30 s");
    db.execute("RESET lock_timeout");
    assert_eq!(second, vec![(ids[2], 1), (ids[3], 1)], "the locked rows are skipped, not waited for");
    held.rollback().unwrap();
    assert_eq!(claim(&mut db.client, "jobs", 4, "30 s"), vec![(ids[0], 1), (ids[1], 1)], "a rolled-back claim leaves them due");
}

#[test]
fn retention_deletes_acked_jobs_and_keeps_dead_and_waiting_ones() {
    let mut db = db();
    db.execute("SELECT outbox_endpoint_drop('default')");
    pull_endpoint(&mut db, "jobs", "{*}", ", max_attempts => 1");
    let acked = db.enqueue("job", "{}");
    let dead = db.enqueue("job", "{}");
    let waiting = db.enqueue("job", "{}");
    assert_eq!(claim(&mut db.client, "jobs", 2, "30 s"), vec![(acked, 1), (dead, 1)]);
    assert!(answer(&mut db, &format!("outbox_ack('jobs', {acked}, 1)")));
    assert!(answer(&mut db, &format!("outbox_nack('jobs', {dead}, 1, 'bad job')")));
    // As if all three were enqueued and handled two hours ago.
    db.execute(
        "UPDATE outbox SET created_at = now() - interval '2 hours';
                UPDATE outbox_deliveries SET sent_at = now() - interval '2 hours' WHERE sent_at IS NOT NULL",
    );
    db.configure(&[("outbox.retention", "1h")]);
    wait_until("the acked job is deleted", Duration::from_secs(30), || db.count_events(&format!("id = {acked}")) == 0);
    assert_eq!(db.count_events(&format!("id IN ({dead}, {waiting})")), 2, "dead and waiting jobs stay");
}

/// Claims every due job of `endpoint`, 100 at a time, in a session of its own.
fn claim_all(db: &mut Db, endpoint: &str) -> Vec<Claim> {
    let mut claimer = db.connect("pgrx_tests", "postgres");
    let mut claims = Vec::new();
    loop {
        let batch = claim(&mut claimer, endpoint, 100, "10 minutes");
        if batch.is_empty() {
            return claims;
        }
        claims.extend(batch);
    }
}

/// Acks each claim, `rounds` times over, in one transaction of the consumer's session, one
/// call each as a client does. Returns what those calls read of outbox_deliveries: rows by
/// table scans, and entries of its partial index of sent deliveries. These are the session's
/// own counts, taken before and after within the transaction (a session reports none in the
/// middle of one), so other sessions cannot blur them.
fn ack_each(consumer: &mut postgres::Client, endpoint: &str, claims: &[Claim], rounds: usize) -> [i64; 2] {
    let mut tx = consumer.transaction().unwrap();
    let before = deliveries_read(&mut tx);
    for _ in 0..rounds {
        for &(id, attempt) in claims {
            let ok: bool = tx.query_one("SELECT outbox_ack($1, $2, $3)", &[&endpoint, &id, &attempt]).unwrap().get(0);
            assert!(ok, "the ack of job {id} attempt {attempt}");
        }
    }
    let after = deliveries_read(&mut tx);
    tx.commit().unwrap();
    [after[0] - before[0], after[1] - before[1]]
}

/// What this session has read of outbox_deliveries and not yet reported: rows by table scans,
/// entries of the partial index of sent deliveries.
fn deliveries_read(tx: &mut postgres::Transaction) -> [i64; 2] {
    let row = tx
        .query_one(
            "SELECT t.seq_tup_read, pg_stat_get_xact_tuples_returned('outbox_deliveries_sent'::regclass)
               FROM pg_stat_xact_user_tables AS t
              WHERE t.relid = 'outbox_deliveries'::regclass",
            &[],
        )
        .unwrap();
    [row.get(0), row.get(1)]
}

#[test]
fn acks_planned_while_the_deliveries_were_few_never_read_them_whole_once_they_are_many() {
    // The consumer's session below plans its acks (once, for the session) on a table of a
    // few rows, with statistics that say so, as after CREATE EXTENSION or a TRUNCATE once
    // autovacuum has been by.
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{job}", "");
    let mut consumer = db.connect("pgrx_tests", "postgres");
    db.insert_deliveries_to("jobs", "job", 6, "attempts", "0");
    db.execute("ANALYZE outbox_deliveries");
    let claims = claim_all(&mut db, "jobs");
    ack_each(&mut consumer, "jobs", &claims, 1);

    db.insert_deliveries_to("jobs", "job", 3000, "attempts", "0");
    let claims = claim_all(&mut db, "jobs");
    assert_eq!(claims.len(), 3000);
    let [table_rows, _] = ack_each(&mut consumer, "jobs", &claims, 1);
    // A table scan for each ack would read the deliveries 3,000 times over: millions of rows.
    assert_eq!(table_rows, 0, "rows of outbox_deliveries read by table scans");
}

#[test]
fn a_repeated_ack_looks_its_delivery_up_instead_of_reading_every_sent_one() {
    let mut db = db();
    pull_endpoint(&mut db, "jobs", "{job}", "");
    // Statistics taken while nothing was sent make the partial index of sent deliveries look
    // empty: the cheapest place to find sent rows, to a planner that believes them.
    db.insert_deliveries_to("jobs", "job", 3000, "attempts", "0");
    db.execute("ANALYZE outbox_deliveries");
    let claims = claim_all(&mut db, "jobs");
    assert_eq!(claims.len(), 3000);
    // Each job acked twice, as by a consumer whose first answer was lost with its connection:
    // the second ack is told the delivery is sent.
    let mut consumer = db.connect("pgrx_tests", "postgres");
    let [_, sent_entries] = ack_each(&mut consumer, "jobs", &claims, 2);
    // Reading the sent index for each repeated ack would read up to 3,000 entries each time.
    assert!(sent_entries < 10_000, "{sent_entries} entries of outbox_deliveries_sent read");
}

#[test]
fn a_claims_attempt_never_repeats_so_a_consumer_whose_lease_ran_out_changes_nothing_after_a_requeue_or_replay() {
    let mut db = db();
    pull_endpoint(&mut db, "fenced", "{fenced}", "");
    let id = db.enqueue("fenced", "{}");
    let lease_ran_out = |db: &mut Db| db.count_to("fenced", &format!("id = {id} AND available_at <= now()")) == 1;
    // A consumer claims it and stalls past its lease; an operator requeues it (a fresh budget of
    // attempts) and another consumer claims it.
    assert_eq!(claim(&mut db.client, "fenced", 1, "50 milliseconds"), vec![(id, 1)]);
    db.wait_for("the first lease runs out", Duration::from_secs(10), lease_ran_out);
    assert_eq!(db.value::<i32>(&format!("SELECT outbox_requeue({id}, 'fenced')")), 1);
    assert_eq!(db.count_to("fenced", &format!("id = {id} AND attempts = 0")), 1, "the requeue gave a fresh budget");
    assert_eq!(claim(&mut db.client, "fenced", 1, "1 minute"), vec![(id, 2)], "the new claim's attempt is not the stale one's");
    // The stalled consumer wakes up: none of its calls touch the live claim.
    for stale in [
        format!("outbox_ack('fenced', {id}, 1)"),
        format!("outbox_nack('fenced', {id}, 1, 'late')"),
        format!("outbox_extend('fenced', {id}, 1, '1 hour')"),
    ] {
        assert!(!answer(&mut db, &stale), "{stale} answered true");
    }
    assert_eq!(db.count_to("fenced", &format!("id = {id} AND sent_at IS NULL AND last_error IS NULL AND claimed_by IS NOT NULL")), 1);
    assert!(answer(&mut db, &format!("outbox_ack('fenced', {id}, 2)")));

    // A replay sends it again: the ack of the attempt that sent it before no longer counts.
    assert_eq!(db.value::<i64>("SELECT outbox_replay('fenced', now() - interval '1 hour', now() + interval '1 hour')"), 1);
    assert_eq!(claim(&mut db.client, "fenced", 1, "1 minute"), vec![(id, 3)]);
    assert!(!answer(&mut db, &format!("outbox_ack('fenced', {id}, 2)")), "an ack from before the replay");
    assert_eq!(db.count_to("fenced", &format!("id = {id} AND sent_at IS NULL")), 1, "the replayed delivery is not marked sent by it");
    assert!(answer(&mut db, &format!("outbox_ack('fenced', {id}, 3)")));
    db.execute("SELECT outbox_endpoint_drop('fenced')");
}

#[test]
fn nacks_keep_a_history_of_the_last_ten_claims_and_leases_show_each_role_its_own_endpoints() {
    let mut db = db();
    pull_endpoint(&mut db, "history-jobs", "{history.*}", ", max_attempts => 50");
    pull_endpoint(&mut db, "other-jobs", "{other.*}", "");
    db.fresh_role("history_consumer");
    db.execute(
        "GRANT EXECUTE ON FUNCTION outbox_leases() TO history_consumer;
         SELECT outbox_endpoint_grant('history-jobs', 'history_consumer')",
    );
    let id = db.enqueue("history.job", "{}");
    let other = db.enqueue("other.job", "{}");
    for attempt in 1..=12 {
        assert_eq!(claim(&mut db.client, "history-jobs", 1, "30 s"), vec![(id, attempt)]);
        assert!(answer(&mut db, &format!("outbox_nack('history-jobs', {id}, {attempt}, 'failure {attempt}', '0 s')")));
    }
    let kept = db.column::<String>(&format!(
        "SELECT concat_ws(' ', attempt, error, status IS NULL) FROM outbox_attempts WHERE event_id = {id} ORDER BY attempt"
    ));
    let expected: Vec<String> = (3..=12).map(|n| format!("{n} failure {n} t")).collect();
    assert_eq!(kept, expected, "the last ten claims, each with its error");

    // Each consumer sees the leases of the endpoints it may consume, with the attempt to extend or nack.
    let (held, _) = (claim(&mut db.client, "history-jobs", 1, "30 s"), claim(&mut db.client, "other-jobs", 1, "30 s"));
    let seen = db.as_role("history_consumer", "SELECT endpoint, event_id, attempt FROM outbox_leases()").unwrap();
    let seen: Vec<(String, i64, i32)> = seen.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(seen, vec![("history-jobs".to_string(), held[0].0, held[0].1)]);
    assert!(!seen.iter().any(|(_, event, _)| *event == other), "another endpoint's lease stays hidden");
    let everything = db.value::<i64>("SELECT count(*) FROM outbox_leases() WHERE event_id IN (SELECT event_id FROM outbox_deliveries WHERE endpoint IN ('history-jobs', 'other-jobs'))");
    assert_eq!(everything, 2, "a superuser sees every lease");
    db.execute("SELECT outbox_endpoint_drop('history-jobs'); SELECT outbox_endpoint_drop('other-jobs')");
    assert_eq!(
        db.value::<i64>(&format!("SELECT count(*) FROM outbox_attempts WHERE event_id = {id}")),
        0,
        "the history goes with its delivery"
    );
}
