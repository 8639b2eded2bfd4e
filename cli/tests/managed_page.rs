//! docs/managed-postgresql.md, run as written: every fenced block after a
//! `<!-- page-test: … -->` line, in the page's order, against a server of the test's own that
//! asks every role but the test's superuser for its password (SCRAM), with TLS (a certificate of
//! cli/test.sh's CA, `OUTBOX_TEST_TLS`), and the sample docs/examples/pgbouncer.ini in front of
//! it. What the page writes for a deployment's own names (`db.example:5432`,
//! `pgbouncer.example:6432`, the receiver's URL, the metrics port, /etc and /var paths) is
//! replaced by the test's; nothing else. The page's event must reach a receiver on 127.0.0.1.
//!
//! The markers: `run as ROLE` (an SQL block, run by psql as ROLE: `the database owner` and `app`
//! are roles the test makes, with passwords it gives psql; any other logs in with the password
//! file the page wrote), `run` (a shell block, with the built `outbox` first on PATH and HOME a
//! directory of the test's), `run in the background` (the same, stopped with SIGTERM at the
//! end, which must exit 0), `write PATH [with mode NNN]` (the block is that file's text).
//!
//! Its ports: the shared cluster's (OUTBOX_TEST_URL) plus 1 for the server, plus 2 for
//! PgBouncer.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Receiver, BINARY};

const PAGE: &str = include_str!("../../docs/managed-postgresql.md");
const PGBOUNCER_INI: &str = include_str!("../../docs/examples/pgbouncer.ini");
const CLUSTER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/cluster.sh");
const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";
/// The roles the page expects to exist, made by the test: the database's owner, which may
/// create roles as a managed server's administrator may, and the application's.
const DATABASE_OWNER: (&str, &str) = ("app_admin", "admin password");
const APPLICATION: (&str, &str) = ("app", "app password");

/// What a marked block is for.
#[derive(Debug, PartialEq)]
enum Step {
    Sql { role: String },
    Shell,
    Background,
    Write { path: String, mode: u32 },
}

/// The page's marked blocks, in order: what to do, and the block's text.
fn marked_blocks(page: &str) -> Vec<(Step, String)> {
    let mut blocks = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let Some(marker) = line.trim().strip_prefix("<!-- page-test:").and_then(|m| m.strip_suffix("-->")) else {
            continue;
        };
        let marker = marker.trim();
        let fence = lines.next().unwrap_or_default();
        assert!(fence.starts_with("```"), "the marker {marker:?} is not followed by a fenced block but {fence:?}");
        let text: Vec<&str> = lines.by_ref().take_while(|line| !line.starts_with("```")).collect();
        let step = if let Some(role) = marker.strip_prefix("run as ") {
            Step::Sql { role: role.to_string() }
        } else if marker == "run" {
            Step::Shell
        } else if marker == "run in the background" {
            Step::Background
        } else if let Some(file) = marker.strip_prefix("write ") {
            let (path, mode) = file.split_once(" with mode ").unwrap_or((file, "644"));
            Step::Write { path: path.to_string(), mode: u32::from_str_radix(mode, 8).expect("an octal mode") }
        } else {
            panic!("an unknown marker {marker:?}");
        };
        blocks.push((step, text.join("\n") + "\n"));
    }
    blocks
}

/// The test's own server and PgBouncer, stopped when dropped.
struct Deployment {
    dir: PathBuf,
    port: u16,
    bouncer_port: u16,
    metrics_port: u16,
    receiver_url: String,
}

impl Deployment {
    /// `text` with the page's names for a deployment replaced by the test's.
    fn localize(&self, text: &str) -> String {
        let dir = self.dir.display();
        [
            ("db.example:5432", format!("127.0.0.1:{}", self.port)),
            ("host=db.example port=5432", format!("host=127.0.0.1 port={}", self.port)),
            ("pgbouncer.example:6432", format!("127.0.0.1:{}", self.bouncer_port)),
            ("listen_port = 6432", format!("listen_port = {}", self.bouncer_port)),
            ("https://billing.example/hooks", self.receiver_url.clone()),
            ("127.0.0.1:9187", format!("127.0.0.1:{}", self.metrics_port)),
            ("/etc/", format!("{dir}/etc/")),
            ("/var/log/postgresql/", format!("{dir}/pgbouncer/")),
            ("/var/run/postgresql/", format!("{dir}/pgbouncer/")),
        ]
        .iter()
        .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
    }

    /// Runs `script` after sourcing scripts/cluster.sh, with the test's server as its cluster.
    fn cluster_sh(&self, script: &str) -> Output {
        let script =
            format!(". {CLUSTER_SH}; PG_BIN=$TLS_PG_BIN CLUSTER_DIR={}/pg CLUSTER_PORT={}; {script}", self.dir.display(), self.port);
        Command::new("bash").args(["-euo", "pipefail", "-c", &script]).output().expect("run bash")
    }

    fn start(receiver_url: String) -> Deployment {
        let base = std::env::var("OUTBOX_TEST_URL").expect("OUTBOX_TEST_URL: run through cli/test.sh");
        let shared_port: u16 = base.rsplit_once(':').and_then(|(_, rest)| rest.split('/').next()?.parse().ok()).expect("a port");
        let tls = std::env::var("OUTBOX_TEST_TLS").expect("OUTBOX_TEST_TLS: run through cli/test.sh");
        let dir = std::env::temp_dir().join(format!("outbox-managed-page-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["home", "etc/outbox", "etc/pgbouncer", "pgbouncer"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let deployment = Deployment { dir, port: shared_port + 1, bouncer_port: shared_port + 2, metrics_port, receiver_url };

        // Password authentication for every role but the test's superuser.
        let started = deployment.cluster_sh(&format!(
            "start_cluster \"$CLUSTER_DIR\" $CLUSTER_PORT \"shared_preload_libraries = ''\" \"password_encryption = 'scram-sha-256'\" \
             \"ssl = on\" \"ssl_cert_file = '{tls}/server.pem'\" \"ssl_key_file = '{tls}/server.key'\"
             printf 'local all postgres trust\\nhost all postgres 127.0.0.1/32 trust\\nhost all all 127.0.0.1/32 scram-sha-256\\n' \
               | as_postgres tee \"$CLUSTER_DIR/data/pg_hba.conf\" >/dev/null
             psql_cluster -q -c 'SELECT pg_reload_conf()' \
               -c \"CREATE ROLE {} LOGIN CREATEROLE PASSWORD '{}'\" -c 'CREATE DATABASE app OWNER {}' \
               -c \"CREATE ROLE {} LOGIN PASSWORD '{}'\"",
            DATABASE_OWNER.0, DATABASE_OWNER.1, DATABASE_OWNER.0, APPLICATION.0, APPLICATION.1
        ));
        assert!(started.status.success(), "the test's server: {}", text(&started));
        std::fs::copy(format!("{tls}/ca.pem"), deployment.dir.join("etc/pgbouncer/root.crt")).unwrap();
        deployment
    }

    /// PgBouncer with the sample configuration, as PostgreSQL's OS user (it refuses root).
    fn start_pgbouncer(&self) {
        let ini = self.dir.join("pgbouncer/pgbouncer.ini");
        std::fs::write(&ini, self.localize(PGBOUNCER_INI)).unwrap();
        let started = self.cluster_sh(&format!(
            "chown -R postgres {dir}/pgbouncer {dir}/etc/pgbouncer 2>/dev/null || true
             as_postgres pgbouncer -d {ini}
             for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && exit 0; sleep 0.1; done
             echo 'PgBouncer does not listen'; cat {dir}/pgbouncer/pgbouncer.log; exit 1",
            dir = self.dir.display(),
            ini = ini.display(),
            port = self.bouncer_port
        ));
        assert!(started.status.success(), "PgBouncer with docs/examples/pgbouncer.ini: {}", text(&started));
    }

    /// A shell block's command: bash, with the built binary first on PATH and the test's HOME,
    /// and none of the environment's libpq or outbox variables.
    fn shell(&self, script: &str) -> Command {
        let bin = Path::new(BINARY).parent().expect("the binary's directory");
        let mut command = Command::new("bash");
        command
            .args(["-euo", "pipefail", "-c", script])
            .env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()))
            .env("HOME", self.dir.join("home"))
            .current_dir(&self.dir);
        for (name, _) in std::env::vars() {
            if name.starts_with("PG") || name.starts_with("OUTBOX_") {
                command.env_remove(name);
            }
        }
        command
    }

    /// psql as `role` on the database app: with its password for the roles the test made, else
    /// with the password file the page wrote (HOME is the test's).
    fn psql(&self, role: &str, sql: &str) -> Output {
        let url = format!("postgres://{role}@127.0.0.1:{}/app", self.port);
        let mut command = self.shell(&format!("{PSQL} -X -q -v ON_ERROR_STOP=1 '{url}'"));
        for (made, password) in [DATABASE_OWNER, APPLICATION] {
            if made == role {
                command.env("PGPASSWORD", password);
            }
        }
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run psql");
        std::io::Write::write_all(&mut child.stdin.take().expect("piped"), sql.as_bytes()).unwrap();
        child.wait_with_output().expect("psql ends")
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let pid = self.dir.join("pgbouncer/pgbouncer.pid");
        let _ = self.cluster_sh(&format!("[ ! -f {0} ] || as_postgres kill -INT \"$(cat {0})\"; stop_cluster", pid.display()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A background block's process group, stopped with SIGTERM.
struct Background {
    child: Child,
    log: PathBuf,
}

impl Background {
    /// SIGTERM to the block's processes; its exit status and what it printed.
    fn stop(mut self) -> (i32, String) {
        let status = self.signal(libc::SIGTERM);
        (status, std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    fn signal(&mut self, signal: i32) -> i32 {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status.code().unwrap_or(-1);
        }
        // SAFETY: signals the process group of a child of ours that has not been waited for.
        unsafe { libc::kill(-(self.child.id() as i32), signal) };
        self.child.wait().expect("wait for the block").code().unwrap_or(-1)
    }
}

impl Drop for Background {
    /// A test that failed leaves no relay behind.
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

#[test]
fn the_managed_page_as_written_installs_the_outbox_and_delivers_an_event_through_pgbouncer() {
    let blocks = marked_blocks(PAGE);
    let roles: Vec<&str> =
        blocks.iter().filter_map(|(step, _)| if let Step::Sql { role } = step { Some(role.as_str()) } else { None }).collect();
    assert_eq!(roles, ["the database owner", "outbox_owner", "app", "outbox_owner"], "the page's SQL blocks and who runs them");
    assert!(blocks.iter().any(|(step, _)| *step == Step::Background), "the page runs the relay");

    let receiver = Receiver::start();
    let deployment = Deployment::start(receiver.url.clone());
    let mut background = Vec::new();
    for (step, text_as_written) in &blocks {
        let block = deployment.localize(text_as_written);
        match step {
            Step::Sql { role } => {
                let role = if role == "the database owner" { DATABASE_OWNER.0 } else { role.as_str() };
                if role == "outbox_owner" && block.contains("GRANT") {
                    // Why the page says who grants: the database's owner may not.
                    let refused = deployment.psql(DATABASE_OWNER.0, &block);
                    assert!(!refused.status.success() && text(&refused).contains("permission denied"), "{}", text(&refused));
                }
                let output = deployment.psql(role, &block);
                assert!(output.status.success(), "the page's SQL as {role} fails:\n{text_as_written}\n{}", text(&output));
            }
            Step::Shell => {
                let output = deployment.shell(&block).output().expect("run bash");
                assert!(output.status.success(), "the page's shell block fails:\n{text_as_written}\n{}", text(&output));
            }
            Step::Background => {
                // The page's PgBouncer, which the relay's URL names, runs as a service would.
                if background.is_empty() {
                    deployment.start_pgbouncer();
                }
                let log = deployment.dir.join(format!("background-{}.log", background.len()));
                let file = std::fs::File::create(&log).unwrap();
                let child = deployment
                    .shell(&block)
                    .stdout(file.try_clone().unwrap())
                    .stderr(file)
                    .process_group(0)
                    .spawn()
                    .expect("start the block");
                background.push(Background { child, log });
            }
            Step::Write { path, mode } => {
                let path = PathBuf::from(deployment.localize(path));
                std::fs::write(&path, &block).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
    }

    let arrived = || receiver.received.lock().unwrap().iter().any(|(_, body)| body.contains("order.placed") && body.contains("1001"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !arrived() {
        let ended = background.iter_mut().any(|block| !matches!(block.child.try_wait(), Ok(None)));
        if ended || Instant::now() > deadline {
            let said: Vec<String> = background.into_iter().map(|block| block.stop().1).collect();
            let bouncer = std::fs::read_to_string(deployment.dir.join("pgbouncer/pgbouncer.log")).unwrap_or_default();
            panic!(
                "the page's event did not reach the receiver (within 30 s, or the relay ended); it said:\n{}\nPgBouncer's log:\n{bouncer}",
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing else waits: no delivery is left pending (for an endpoint default with no URL,
    // say), and no endpoint is failing.
    let waiting = || {
        let output = deployment.psql(
            "postgres",
            "\\pset tuples_only on\n\\pset format unaligned\n\
             SELECT endpoint, pending, waiting, failing_since FROM outbox.outbox_endpoint_stats()
              WHERE pending + waiting > 0 OR failing_since IS NOT NULL;",
        );
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !waiting().is_empty() {
        assert!(Instant::now() < deadline, "after the page's steps, deliveries wait or endpoints fail: {}", waiting());
        std::thread::sleep(Duration::from_millis(50));
    }
    for block in background {
        let (status, said) = block.stop();
        assert_eq!(status, 0, "the relay exits 0 on SIGTERM:\n{said}");
        assert!(!said.contains("warning"), "the page's steps give no warning:\n{said}");
    }
}
