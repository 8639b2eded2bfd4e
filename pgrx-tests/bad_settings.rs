use std::time::Duration;

use super::cluster::{db, wait_until};
use super::receiver::{Receiver, Reply};

#[test]
fn unusable_settings_deliver_nothing_lose_nothing_and_crash_nothing() {
    let mut db = db();
    let receiver = Receiver::start(Reply::Status(204));
    let pids = db.worker_pids();
    let mut ids = Vec::new();
    for url in ["not a url", "ftp://127.0.0.1/events", ""] {
        db.configure(&[("outbox.webhook_url", url)]);
        ids.push(db.enqueue("kept", "{}")); // its commit wakes the workers
    }
    assert_eq!(db.worker_pids(), pids, "no worker crashed or restarted");
    // The endpoint's health says why, as outbox_endpoint_stats() and the alerts read it.
    wait_until("the endpoint is failing", Duration::from_secs(10), || {
        db.value::<bool>("SELECT failing_since IS NOT NULL FROM outbox_endpoints WHERE name = 'default'")
    });
    wait_until("its last error is the reason", Duration::from_secs(10), || {
        db.value::<Option<String>>("SELECT last_error FROM outbox_endpoints WHERE name = 'default'").is_some_and(|error| {
            error.starts_with("cannot be sent to: it has no URL: set outbox.webhook_url, or give the endpoint default a URL")
        })
    });

    db.configure(&[("outbox.webhook_url", &receiver.url)]);
    wait_until("everything kept is delivered once the settings are fixed", Duration::from_secs(10), || db.count("sent_at IS NULL") == 0);
    wait_until("the endpoint is healthy again", Duration::from_secs(10), || {
        db.value::<bool>("SELECT failing_since IS NULL FROM outbox_endpoints WHERE name = 'default'")
    });
    for id in ids {
        // A claim under the unusable settings would have counted an attempt (and leased the
        // row for 30 s, past the wait above).
        assert_eq!(db.value::<i32>(&format!("SELECT attempts FROM outbox_deliveries WHERE event_id = {id}")), 1, "claimed only once fixed");
        assert_eq!(receiver.deliveries_of(id).len(), 1);
    }
}

#[test]
fn an_unreachable_receiver_is_retried_with_a_readable_error() {
    let mut db = db();
    // A port nobody listens on: bind one, learn its number, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    db.configure(&[("outbox.webhook_url", &format!("http://127.0.0.1:{port}/events"))]);
    let id = db.enqueue("unreachable", "{}");
    wait_until("the failed attempt is recorded", Duration::from_secs(10), || {
        db.count(&format!("id = {id} AND last_error IS NOT NULL")) == 1
    });
    let error: String = db.value(&format!("SELECT last_error FROM outbox_deliveries WHERE event_id = {id}"));
    assert!(error.starts_with("unreachable: ") && error.to_lowercase().contains("connect"), "{error}");
    assert_eq!(db.count(&format!("id = {id} AND dead_at IS NULL AND sent_at IS NULL")), 1, "it waits for a retry");
}
