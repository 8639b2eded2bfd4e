use super::cluster::db;

#[test]
fn every_setting_shows_its_unit_context_and_default() {
    let mut db = db();
    let rows = db
        .client
        .query("SELECT name, context, coalesce(unit, ''), current_setting(name), short_desc <> '' FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name", &[])
        .unwrap();
    let settings: Vec<(String, String, String, String, bool)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    let expected = [
        ("outbox.allowed_destinations", "sighup", "", "0.0.0.0/0, ::/0"),
        ("outbox.batch_size", "sighup", "", "100"),
        ("outbox.concurrency", "sighup", "", "128"),
        ("outbox.database", "postmaster", "", ""),
        ("outbox.dead_retention", "sighup", "s", "30d"),
        ("outbox.deliver_at_horizon", "superuser", "s", "90d"),
        ("outbox.endpoint_disable_after", "sighup", "s", "5d"),
        ("outbox.http_timeout", "sighup", "ms", "10s"),
        ("outbox.lease", "sighup", "ms", "30s"),
        ("outbox.max_attempts", "sighup", "", "10"),
        ("outbox.max_bytes_in_flight", "sighup", "B", "64MB"),
        ("outbox.max_payload_bytes", "superuser", "B", "1MB"),
        ("outbox.max_requests_in_flight", "sighup", "", "256"),
        ("outbox.poll_interval", "sighup", "ms", "1s"),
        ("outbox.relay", "superuser", "", "on"),
        ("outbox.retention", "sighup", "s", "7d"),
        ("outbox.signing_secret", "sighup", "", ""),
        ("outbox.webhook_url", "sighup", "", ""),
        ("outbox.workers", "postmaster", "", "2"),
    ];
    assert_eq!(settings.len(), expected.len(), "{settings:?}");
    for ((name, context, unit, value, described), expected) in settings.iter().zip(expected) {
        assert_eq!((name.as_str(), context.as_str(), unit.as_str(), value.as_str()), expected);
        assert!(described, "{name} has a description");
    }

    let error = db.client.batch_execute("SET outbox.max_payload_bytes = 0").expect_err("out of range");
    assert!(error.as_db_error().unwrap().message().contains("outside the valid range"), "{error}");
    for huge_or_zero in ["0", "1000000"] {
        let error = db.client.batch_execute(&format!("ALTER SYSTEM SET outbox.batch_size = {huge_or_zero}")).expect_err("out of range");
        assert!(error.as_db_error().unwrap().message().contains("outside the valid range"), "{error}");
    }
}
