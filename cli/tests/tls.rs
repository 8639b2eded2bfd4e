//! TLS to the database, against a real server with `ssl = on` and a certificate for 127.0.0.1
//! signed by a CA of cli/test.sh's making (`OUTBOX_TEST_TLS` holds ca.pem and other-ca.pem):
//! the tests' server that offers TLS (`OUTBOX_TEST_TLS_URL`), as managed services do.

mod support;

use std::time::Duration;

use support::*;

fn certificate(name: &str) -> String {
    let dir = std::env::var("OUTBOX_TEST_TLS").expect("OUTBOX_TEST_TLS: run through cli/test.sh");
    format!("{dir}/{name}")
}

/// `outbox migrate --dry-run` (which connects and reads the schema's version) to `url`.
fn dry_run(url: &str) -> (bool, String) {
    let output = outbox(&["migrate", "--dry-run", "--database-url", url]);
    (output.status.success(), text(&output))
}

#[test]
fn each_sslmode_checks_what_libpqs_does() {
    fresh_database_on(Server::Tls, "outbox_t_tls");
    let base = url_on(Server::Tls, "outbox_owner", "outbox_t_tls");
    let ca = certificate("ca.pem");
    let other = certificate("other-ca.pem");

    for trusted in
        [format!("{base}?sslmode=verify-full&sslrootcert={ca}"), format!("{base}?sslmode=require"), format!("{base}?sslmode=disable")]
    {
        let (ok, said) = dry_run(&trusted);
        assert!(ok, "{trusted}: {said}");
    }
    for (refused, why) in [
        (format!("{base}?sslmode=verify-full&sslrootcert={other}"), "UnknownIssuer"),
        (format!("{base}?sslmode=verify-full"), "UnknownIssuer"),
        (format!("{base}?sslmode=require&sslrootcert={other}"), "UnknownIssuer"),
        (format!("{base}?sslmode=verify-all"), "sslmode must be disable, allow, prefer, require, verify-ca or verify-full"),
        (
            format!("{base}?sslmode=verify-ca&sslrootcert=/nonexistent.pem"),
            "cannot read the root certificates in sslrootcert /nonexistent.pem",
        ),
    ] {
        let (ok, said) = dry_run(&refused);
        assert!(!ok && said.contains(why), "{refused}: {said}");
    }

    // The certificate names 127.0.0.1, not localhost: verify-ca trusts it, verify-full does not.
    let by_name = base.replace("127.0.0.1", "localhost");
    let (ok, said) = dry_run(&format!("{by_name}?sslmode=verify-ca&sslrootcert={ca}"));
    assert!(ok, "{said}");
    let (ok, said) = dry_run(&format!("{by_name}?sslmode=verify-full&sslrootcert={ca}"));
    assert!(!ok && said.contains("certificate not valid for name \"localhost\""), "{said}");
}

#[test]
fn the_relay_connects_over_tls_when_asked_and_in_clear_when_told() {
    let mut db = fresh_database_on(Server::Tls, "outbox_t_tls_relay");
    migrate_on(Server::Tls, "outbox_t_tls_relay", &[]);
    let base = url_on(Server::Tls, "outbox_relay", "outbox_t_tls_relay");
    let encrypted = |db: &mut postgres::Client| -> Vec<bool> {
        db.query(
            "SELECT s.ssl FROM pg_stat_activity AS a JOIN pg_stat_ssl AS s USING (pid)
              WHERE a.datname = 'outbox_t_tls_relay' AND a.application_name LIKE 'outbox relay%' ORDER BY a.application_name",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
    };
    for (query, expected) in
        [(format!("sslmode=verify-full&sslrootcert={}", certificate("ca.pem")), true), ("sslmode=disable".to_string(), false)]
    {
        let relay_url = format!("{base}?{query}");
        let relay = Relay::start(&["--database-url", &relay_url, "--listen-url", &relay_url]);
        wait_until("the relay and its listener are connected", Duration::from_secs(20), || encrypted(&mut db).len() == 2);
        assert_eq!(encrypted(&mut db), [expected, expected], "{query}");
        let (status, said) = relay.stop();
        assert_eq!(status, 0, "{said}");
        wait_until("the relay's connections are closed", Duration::from_secs(20), || encrypted(&mut db).is_empty());
    }
}
