//! pg_dump and pg_restore keep every row and keep ids growing: a restored outbox never hands
//! out an id it gave out before, even when retention had deleted the rows that carried it.

use std::process::Command;

use super::cluster::db;

#[test]
fn a_dump_restored_into_a_fresh_database_keeps_rows_and_never_reuses_an_id() {
    let mut db = db();
    db.execute(
        "SELECT outbox_endpoint_set('billing', 'http://127.0.0.1:9/billing', '{order.*}');
         SELECT outbox_endpoint_rotate_secret('billing')",
    );
    let kept: Vec<i64> = (0..3).map(|n| db.enqueue("kept", &format!(r#"{{"n": {n}}}"#))).collect();
    let deleted: Vec<i64> = (0..3).map(|_| db.enqueue("deleted.by.retention", "{}")).collect();
    db.execute(&format!("SELECT outbox_mark_processed({}, 'billing')", deleted[2]));
    db.execute(
        "DELETE FROM outbox_deliveries WHERE event_id IN (SELECT id FROM outbox WHERE topic = 'deleted.by.retention');
         DELETE FROM outbox WHERE topic = 'deleted.by.retention'",
    );
    let deliveries: i64 = db.value("SELECT count(*) FROM outbox_deliveries");
    let highest_ever = *deleted.iter().max().unwrap();
    db.fresh_role("restored_producer");
    db.execute("GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, timestamptz) TO restored_producer");

    let (host, port) = db.server_address();
    // The server's own tools: a pg_dump older than the server refuses it.
    let bin: String = db.value("SELECT setting FROM pg_config WHERE name = 'BINDIR'");
    let dump = std::env::temp_dir().join(format!("outbox_ext-dump-{}.custom", std::process::id()));
    let connection = ["-h", host.as_str(), "-p", port.as_str(), "-U", "postgres"];
    db.execute("DROP DATABASE IF EXISTS outbox_restored");
    // A copy must not deliver what the original delivers (docs/installation.md, "Copies, dumps and restores").
    db.execute("CREATE DATABASE outbox_restored");
    db.execute("ALTER DATABASE outbox_restored SET outbox.relay = off");
    run(Command::new(format!("{bin}/pg_dump")).args(connection).args(["-Fc", "-d", "pgrx_tests", "-f"]).arg(&dump));
    run(Command::new(format!("{bin}/pg_restore")).args(connection).args(["--exit-on-error", "-d", "outbox_restored"]).arg(&dump));
    let _ = std::fs::remove_file(&dump);

    let mut restored = db.connect("outbox_restored", "postgres");
    let ids: Vec<i64> = restored.query("SELECT id FROM outbox ORDER BY id", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, kept, "every row is restored");
    let processed: i64 = restored.query_one("SELECT count(*) FROM processed_events WHERE consumer = 'billing'", &[]).unwrap().get(0);
    assert_eq!(processed, 1, "processed_events is restored");
    let endpoints: Vec<String> =
        restored.query("SELECT name FROM outbox_endpoints ORDER BY name", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(endpoints, ["billing", "default"], "endpoints are restored, default once");
    let restored_deliveries: i64 = restored.query_one("SELECT count(*) FROM outbox_deliveries", &[]).unwrap().get(0);
    assert_eq!(restored_deliveries, deliveries, "deliveries are restored");
    let secrets: i64 = restored.query_one("SELECT count(*) FROM outbox_endpoint_secrets WHERE endpoint = 'billing'", &[]).unwrap().get(0);
    assert_eq!(secrets, 1, "the signing secret is restored");
    let next: i64 = restored.query_one("SELECT outbox_enqueue('after.restore', '{}')", &[]).unwrap().get(0);
    assert!(next > highest_ever, "the first id after the restore ({next}) is above every id given out before ({highest_ever})");
    let first_time: bool = restored.query_one("SELECT outbox_mark_processed($1, 'billing')", &[&next]).unwrap().get(0);
    assert!(first_time, "a consumer does not mistake the new event for one it applied");
    let granted: bool = restored
        .query_one("SELECT has_function_privilege('restored_producer', 'outbox_enqueue(text, jsonb, text, timestamptz)', 'EXECUTE')", &[])
        .unwrap()
        .get(0);
    assert!(granted, "a GRANT made after CREATE EXTENSION is restored");
    let public: bool = restored
        .query_one("SELECT has_function_privilege('public', 'outbox_enqueue(text, jsonb, text, timestamptz)', 'EXECUTE')", &[])
        .unwrap()
        .get(0);
    assert!(!public, "PUBLIC still may not enqueue");
    drop(restored);
    db.execute("DROP DATABASE outbox_restored");
    db.execute("DROP OWNED BY restored_producer; DROP ROLE restored_producer");
}

fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
}
