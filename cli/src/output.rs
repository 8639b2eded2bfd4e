//! Lines for a terminal or a journal that never panic as `println!` and `eprintln!` do: a
//! reader that went away (`outbox version | head -1`, a log collector that died) must not stop
//! a command, nor a relay or a console that is serving.

use std::io::Write;

/// A command's answer on standard output. A reader that stopped reading ends it early, and
/// the exit status stays the command's own.
pub fn answer(text: &str) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{text}") {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            say(&format!("outbox: cannot write to standard output: {e}"));
        }
    }
}

/// A line on standard error, where systemd's journal and container logs collect it. When it
/// cannot be written there is nowhere left to say so.
pub fn say(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}
