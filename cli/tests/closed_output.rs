//! A reader that goes away: `outbox version | head -1`, or a relay whose log collector died.
//! Neither may panic the binary, and a relay goes on delivering.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// The write end of a pipe whose read end is already closed: every write gets EPIPE.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    writer
}

#[test]
fn version_into_a_closed_pipe_exits_as_it_would_have() {
    let output = Command::new(BINARY).arg("version").stdout(closed_pipe()).stderr(Stdio::piped()).output().expect("run outbox version");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "outbox version failed: {:?}\n{said}", output.status);
    assert!(!said.contains("panicked"), "outbox version panicked:\n{said}");
}

#[test]
fn a_relay_with_a_closed_standard_error_goes_on_delivering() {
    fresh_database("outbox_t_closed_log");
    migrate("outbox_t_closed_log", &[]);
    let receiver = Receiver::start();
    let mut owner = connect("outbox_owner", "outbox_t_closed_log");
    owner.batch_execute(&format!("SELECT outbox.outbox_endpoint_set('default', '{}')", receiver.url)).unwrap();
    let relay_url = url("outbox_relay", "outbox_t_closed_log");
    // Its start-up line and every later line hit the closed pipe.
    let mut relay = Command::new(BINARY)
        .args(["relay", "--database-url", &relay_url, "--poll-interval", "50ms"])
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .spawn()
        .expect("start outbox relay");
    owner.batch_execute("SELECT outbox.outbox_enqueue('order.placed', '{\"n\": 1}')").unwrap();
    wait_until("the relay delivers with nowhere to log", Duration::from_secs(30), || {
        assert!(relay.try_wait().unwrap().is_none(), "the relay exited: {:?}", relay.try_wait());
        receiver.count() == 1
    });
    // Its stop is logged too, into the same closed pipe.
    // SAFETY: signals a child process of ours, which has not been waited for yet.
    unsafe { libc::kill(relay.id() as i32, libc::SIGTERM) };
    assert_eq!(relay.wait().unwrap().code(), Some(0), "the relay did not stop cleanly");
}
