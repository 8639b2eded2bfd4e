//! How the relay process waits: for a finished request (the sender's doorbell), a commit (a
//! NOTIFY on `outbox_enqueued`, heard by a thread holding a direct connection, if it has one),
//! a transaction from the log's stream, a signal, or its timer.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::delivery::Doorbell;
use outbox_core::relay::{Asked, Commits, Level, Wake};
use outbox_core::timers::wait_millis;
use postgres::fallible_iterator::FallibleIterator;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::connection::connect;
use crate::log_stream::StreamSignal;
use crate::metrics::say;

/// The channel an enqueuing commit notifies.
pub const CHANNEL: &str = "outbox_enqueued";

/// Notifications end a wait at most once per this long. Any role may NOTIFY the channel in a
/// loop, and each wakeup costs a claim and a read of the log: this bounds what a flood costs
/// (to 200 of each a second), while a commit is still heard within it.
const NOTIFIED_AT_MOST_EVERY: Duration = Duration::from_millis(5);

pub struct ProcessWake {
    /// Rung by the listener thread at each notification.
    commits: Option<Arc<Doorbell>>,
    /// The log's stream: a transaction handed over, or streaming due to be tried again.
    pub log_streamed: Arc<StreamSignal>,
    /// Whether the relay wants a NOTIFY per commit now, which its row in outbox_relays says.
    pub wants_notifications: Arc<AtomicBool>,
    /// Commits may have gone unheard: set by the listener thread when it (re)connects, and by
    /// the relay's row once it says the relay wants notifications (crate::presence).
    pub unheard: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    hangup: Arc<AtomicBool>,
    /// Readable once a signal arrived, so that a wait ends at once.
    signalled: UnixStream,
    /// When a notification last ended a wait.
    last_notified: Instant,
}

impl ProcessWake {
    /// Catches SIGTERM, SIGINT and SIGHUP, and starts listening on `listen_url` if given.
    pub fn new(listen_url: Option<&str>) -> std::io::Result<ProcessWake> {
        let (signalled, signal_sender) = UnixStream::pair()?;
        signalled.set_nonblocking(true)?;
        let (stop, hangup) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        for signal in [SIGTERM, SIGINT] {
            signal_hook::flag::register(signal, stop.clone())?;
            signal_hook::low_level::pipe::register(signal, signal_sender.try_clone()?)?;
        }
        signal_hook::flag::register(SIGHUP, hangup.clone())?;
        signal_hook::low_level::pipe::register(SIGHUP, signal_sender)?;
        let unheard = Arc::new(AtomicBool::new(false));
        let commits = match listen_url {
            Some(url) => {
                let bell = Arc::new(Doorbell::new()?);
                start_listener(url.to_string(), bell.clone(), unheard.clone())?;
                Some(bell)
            }
            None => None,
        };
        Ok(ProcessWake {
            commits,
            log_streamed: Arc::new(StreamSignal::new()?),
            wants_notifications: Arc::new(AtomicBool::new(false)),
            unheard,
            stop,
            hangup,
            signalled,
            last_notified: Instant::now(),
        })
    }
}

impl Wake for ProcessWake {
    /// A NOTIFY makes committers take turns: the relay asks for them (through its row in
    /// outbox_relays) only while it listens, can claim and has no backlog. Commits may have
    /// gone unheard when it starts asking again, or when its listener reconnected.
    fn listen(&mut self, can_claim: bool, backlog: bool, _reads_log: bool) -> bool {
        let wanted = self.commits.is_some() && can_claim && !backlog;
        let asked_again = wanted && !self.wants_notifications.swap(wanted, Ordering::Relaxed);
        self.unheard.swap(false, Ordering::Relaxed) || asked_again
    }

    /// A notification does not say what the commit wrote: a claim and a read are both due.
    fn wait(&mut self, doorbell: RawFd, timeout: Duration) -> Commits {
        let commits = self.commits.as_ref().map_or(-1, |bell| bell.fd());
        let mut fds = [doorbell, commits, self.signalled.as_raw_fd(), self.log_streamed.fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let millis = wait_millis(self.log_streamed.until_retry().map_or(timeout, |retry| retry.min(timeout)));
        // SAFETY: four pollfd structs the call may write; a negative fd is ignored.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        if fds[2].revents != 0 {
            let mut drained = [0u8; 64];
            while matches!((&self.signalled).read(&mut drained), Ok(n) if n > 0) {}
        }
        let committed = fds[1].revents != 0;
        if let Some(bell) = self.commits.as_ref().filter(|_| committed) {
            // What rings the bell until then is heard with this one.
            std::thread::sleep(NOTIFIED_AT_MOST_EVERY.saturating_sub(self.last_notified.elapsed()));
            self.last_notified = Instant::now();
            bell.clear();
        }
        Commits { table: committed, log: committed || self.log_streamed.take(fds[3].revents != 0) }
    }

    fn asked(&mut self) -> Asked {
        if self.stop.load(Ordering::Relaxed) {
            return Asked::Stop;
        }
        if self.hangup.swap(false, Ordering::Relaxed) {
            say(Level::Log, "SIGHUP: the relay reads its configuration when it starts; restart it to apply a change");
        }
        Asked::Nothing
    }
}

/// A thread that LISTENs on its own connection and rings `bell` at each notification; when the
/// connection is lost it connects again (every second at most) and says so through
/// `unheard`, since commits made meanwhile were not heard.
fn start_listener(url: String, bell: Arc<Doorbell>, unheard: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new().name("outbox-listen".into()).spawn(move || {
        let mut said = String::new();
        loop {
            let error = match connect(&url, "outbox relay listener") {
                Ok(mut client) => match client.batch_execute(&format!("LISTEN {CHANNEL}")) {
                    Ok(()) => {
                        if !said.is_empty() {
                            say(Level::Log, "listening for commits again");
                            said.clear();
                        }
                        unheard.store(true, Ordering::Relaxed);
                        bell.ring();
                        let mut notifications = client.notifications();
                        let mut heard = notifications.blocking_iter();
                        loop {
                            match heard.next() {
                                Ok(Some(_)) => bell.ring(),
                                Ok(None) => break "the connection closed".to_string(),
                                Err(e) => break e.to_string(),
                            }
                        }
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            if error != said {
                say(Level::Warning, &format!("cannot listen for commits (polling meanwhile): {error}"));
                said = error;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })?;
    Ok(())
}
