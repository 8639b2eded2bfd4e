//! Log mode with the slot streamed (docs/log-mode.md#streaming): a thread holds a replication
//! connection, puts the slot's messages together into whole transactions and hands them over
//! as they commit; the relay reads them as it would read the slot. A read of the slot decodes
//! again from the slot's restart position each time, and throws away the session's caches,
//! where the stream decodes each change once. A transaction read stays until it is confirmed:
//! a read the relay drops unconfirmed (a change of endpoints, a failed route) is read again,
//! as from the slot. The relay's role needs the REPLICATION attribute; without it, or through
//! a pooler that does not pass replication connections on, the relay reads the slot with
//! `outbox_log_read` instead.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use outbox_core::delivery::Doorbell;
use outbox_core::log::stream::{Transaction, Transactions};

use crate::replication::{ReplicationConnection, ReplicationError, Streamed};

/// How long the thread waits for the server before it looks whether a confirmation is to send
/// or it is asked to stop.
const RECEIVE_TIMEOUT: Duration = Duration::from_millis(100);
/// A status goes to the server this often at least (its wal_sender_timeout is a minute by
/// default).
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// The most changes the relay holds unconfirmed before the thread stops reading (a backlog of
/// millions would otherwise all be held in memory), and how long it waits then before it looks
/// again: four reads of 6,000 changes are on their way at most.
const HELD_AT_MOST: usize = 100_000;
const PAUSE: Duration = Duration::from_millis(10);
/// Streaming failed to start: tried again after this long, doubled up to a minute.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(60);

/// How the stream wakes the relay: its bell rings at each transaction handed over, and once a
/// stream that ended or could not start is due to be tried again (crate::wake waits for both).
pub struct StreamSignal {
    bell: Doorbell,
    retry_at: Mutex<Option<Instant>>,
}

impl StreamSignal {
    pub fn new() -> std::io::Result<StreamSignal> {
        Ok(StreamSignal { bell: Doorbell::new()?, retry_at: Mutex::new(None) })
    }

    pub fn fd(&self) -> RawFd {
        self.bell.fd()
    }

    /// How long until a retry is due, if one is to come.
    pub fn until_retry(&self) -> Option<Duration> {
        self.retry_at.lock().expect("not poisoned").map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Whether the bell rang (`rang`: the wait found `fd` ready) or a retry came due since the
    /// last call; clears both.
    pub fn take(&self, rang: bool) -> bool {
        let mut retry_at = self.retry_at.lock().expect("not poisoned");
        let due = retry_at.is_some_and(|at| Instant::now() >= at);
        if due {
            *retry_at = None;
        }
        if rang {
            self.bell.clear();
        }
        due || rang
    }

    fn ring(&self) {
        self.bell.ring();
    }

    fn retry_at(&self, at: Instant) {
        *self.retry_at.lock().expect("not poisoned") = Some(at);
    }
}

/// What the thread hands over, in the stream's order.
enum Received {
    Transaction(Transaction),
    /// The server's position with no transaction open: everything before it was handed over.
    Idle(u64),
    Ended(String),
}

/// One stream of the slot, for one lease (`fence`).
struct LogStream {
    fence: i64,
    /// Where it started: the server's first positions may be the slot's older one.
    from: u64,
    received: Receiver<Received>,
    /// Transactions handed over and not yet confirmed, in commit order.
    pending: VecDeque<Transaction>,
    /// The server's last position with no transaction open, if none was handed over since.
    idle_at: Option<u64>,
    /// Why the stream ended, once the thread said so.
    ended: Option<String>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the relay and the thread share: the position the relay confirmed last, the changes it
/// holds unconfirmed, and whether the thread is to stop.
#[derive(Default)]
struct Shared {
    confirm: AtomicU64,
    held: AtomicUsize,
    stop: AtomicBool,
}

/// The slot to stream, the position to stream from (0: the slot's confirmed position), and
/// the time zone the relay's other statements run in, in which the stream writes timestamps.
pub struct SlotToStream {
    pub name: String,
    pub publication: String,
    pub from: u64,
    pub timezone: String,
}

/// What a read of the stream got: whole transactions' messages, from the first not confirmed,
/// and the position to confirm when there are none.
pub struct StreamRead {
    pub messages: Vec<Vec<u8>>,
    pub idle_at: Option<u64>,
}

/// The stream of the log's slot, started when the relay reads it and started again after it
/// ends; while it cannot be started (said once per reason) the relay reads the slot.
pub struct StreamedLog {
    url: String,
    signal: Arc<StreamSignal>,
    stream: Option<LogStream>,
    retry_at: Instant,
    retry_after: Duration,
    said: String,
}

impl StreamedLog {
    pub fn new(url: &str, signal: Arc<StreamSignal>) -> StreamedLog {
        StreamedLog { url: url.to_string(), signal, stream: None, retry_at: Instant::now(), retry_after: FIRST_RETRY, said: String::new() }
    }

    /// Whether a read under `fence` may stream (it is, or it is due to be tried again).
    pub fn may_stream(&self, fence: i64) -> bool {
        self.stream.as_ref().is_some_and(|stream| stream.fence == fence) || Instant::now() >= self.retry_at
    }

    /// Reads the transactions received from the stream of `slot` under `fence` that end past
    /// `after` (where the reads on their way end), the stream started first if it is not;
    /// `None` if it cannot be started now (the reason is said), and an error when it ended (it
    /// is tried again after a while).
    pub fn read(
        &mut self,
        fence: i64,
        slot: &SlotToStream,
        max_changes: usize,
        after: u64,
        say: impl FnOnce(&str),
    ) -> Option<Result<StreamRead, String>> {
        if self.stream.as_ref().is_some_and(|stream| stream.fence != fence) {
            self.stop();
        }
        if self.stream.is_none() {
            if Instant::now() < self.retry_at {
                return None;
            }
            match LogStream::start(&self.url, slot, fence, self.signal.clone()) {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.retry_after = FIRST_RETRY;
                    self.said.clear();
                }
                Err(e) => {
                    let reason = e.to_string();
                    if reason != self.said {
                        say(&format!("cannot stream the log's slot (reading it instead, trying again meanwhile): {reason}"));
                        self.said = reason;
                    }
                    self.back_off();
                    return None;
                }
            }
        }
        let stream = self.stream.as_mut().expect("started above");
        let read = stream.read(max_changes, after);
        if read.is_err() {
            // Read again at once, from the slot until the stream is started again: a server
            // session ended by an administrator, or a failover, leaves the slot to be read (or
            // found lost by the lease) now, not at the poll.
            self.stop();
            self.back_off();
            self.signal.ring();
        }
        Some(read)
    }

    /// Streaming is tried again later, and the relay woken then to read.
    fn back_off(&mut self) {
        self.retry_at = Instant::now() + self.retry_after;
        self.retry_after = (self.retry_after * 2).min(LAST_RETRY);
        self.signal.retry_at(self.retry_at);
    }

    /// Takes what the stream handed over so far: a read then reads it, once the endpoints'
    /// version is looked at (every event it holds committed before that look, so an endpoint
    /// subscribed before the event is in that version).
    pub fn receive(&mut self) {
        if let Some(stream) = self.stream.as_mut() {
            stream.receive();
        }
    }

    /// Whether the stream under `fence` is what the relay reads.
    pub fn streams(&self, fence: i64) -> bool {
        self.stream.as_ref().is_some_and(|stream| stream.fence == fence)
    }

    /// Everything up to `end` is delivered and recorded: the stream lets the slot go of it.
    pub fn confirmed(&mut self, end: u64) {
        if let Some(stream) = self.stream.as_mut() {
            while let Some(transaction) = stream.pending.pop_front_if(|transaction| transaction.end <= end) {
                stream.shared.held.fetch_sub(transaction.messages.len(), Ordering::Relaxed);
            }
            stream.shared.confirm.fetch_max(end, Ordering::Relaxed);
        }
    }

    /// Ends the stream (the slot is read, made again or dropped without it).
    pub fn stop(&mut self) {
        self.stream = None;
    }
}

impl LogStream {
    fn start(url: &str, slot: &SlotToStream, fence: i64, signal: Arc<StreamSignal>) -> Result<LogStream, ReplicationError> {
        // Text in UTF-8 and timestamps as a read of the slot writes them (sql/log.sql,
        // outbox_log_read), which the bodies are built from.
        let settings = [("client_encoding", "UTF8"), ("DateStyle", "ISO"), ("TimeZone", slot.timezone.as_str())];
        let mut connection = ReplicationConnection::connect(url, "outbox relay log stream", &settings, Duration::from_secs(10))?;
        let options = [("proto_version", "1"), ("publication_names", slot.publication.as_str())];
        connection.start_logical(&slot.name, slot.from, &options)?;
        connection.set_read_timeout(RECEIVE_TIMEOUT)?;
        let (sender, received) = channel();
        // What the relay confirmed last, which the slot may not have heard yet.
        let shared = Arc::new(Shared { confirm: AtomicU64::new(slot.from), ..Shared::default() });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("outbox-log-stream".into())
            .spawn(move || receive(connection, &sender, &signal, &thread_shared))?;
        Ok(LogStream {
            fence,
            from: slot.from,
            received,
            pending: VecDeque::new(),
            idle_at: None,
            ended: None,
            shared,
            thread: Some(thread),
        })
    }

    /// Takes what the thread handed over since the last call.
    fn receive(&mut self) {
        while self.ended.is_none() {
            match self.received.try_recv() {
                Ok(Received::Transaction(transaction)) => {
                    self.pending.push_back(transaction);
                    self.idle_at = None;
                }
                Ok(Received::Idle(position)) => self.idle_at = Some(position).filter(|&position| position >= self.from),
                Ok(Received::Ended(reason)) => self.ended = Some(reason),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.ended = Some("the log's stream ended".into()),
            }
        }
    }

    /// What was received by the last `receive`, not what came since.
    fn read(&mut self, max_changes: usize, after: u64) -> Result<StreamRead, String> {
        if let Some(reason) = &self.ended {
            return Err(reason.clone());
        }
        let mut messages = Vec::new();
        for transaction in self.pending.iter().filter(|transaction| transaction.end > after) {
            // As a read of the slot: the transaction in which max_changes is reached is the last.
            if messages.len() >= max_changes {
                break;
            }
            messages.extend(transaction.messages.iter().cloned());
        }
        let idle_at = if self.pending.is_empty() { self.idle_at } else { None };
        Ok(StreamRead { messages, idle_at })
    }
}

impl Drop for LogStream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // It looks at stop at least every RECEIVE_TIMEOUT; once it is gone, so is the
            // server's session holding the slot.
            let _ = thread.join();
        }
    }
}

/// The thread: receives until asked to stop or the stream ends (pausing while the relay holds
/// `HELD_AT_MOST` changes it has not confirmed), and sends the server a status whenever the
/// position confirmed moved, when asked, and every STATUS_EVERY.
fn receive(mut connection: ReplicationConnection, sender: &Sender<Received>, bell: &StreamSignal, shared: &Shared) {
    let mut transactions = Transactions::default();
    let (mut received_to, mut idle_at) = (0, 0);
    let (mut sent, mut sent_at) = (0, Instant::now());
    let ended = loop {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let mut reply = false;
        let next = if shared.held.load(Ordering::Relaxed) >= HELD_AT_MOST {
            // The server waits meanwhile, its socket full: the relay is that far behind.
            std::thread::sleep(PAUSE);
            Ok(None)
        } else {
            connection.next()
        };
        match next {
            Ok(Some(Streamed::Data(data))) => match transactions.push(data) {
                Ok(Some(transaction)) => {
                    received_to = received_to.max(transaction.end);
                    shared.held.fetch_add(transaction.messages.len(), Ordering::Relaxed);
                    if sender.send(Received::Transaction(transaction)).is_err() {
                        return;
                    }
                    bell.ring();
                }
                Ok(None) => {}
                Err(e) => break e.to_string(),
            },
            Ok(Some(Streamed::Keepalive { wal_end, reply: asked })) => {
                received_to = received_to.max(wal_end);
                if !transactions.in_transaction() {
                    idle_at = wal_end;
                    if sender.send(Received::Idle(wal_end)).is_err() {
                        return;
                    }
                }
                reply = asked;
            }
            Ok(Some(Streamed::Ended)) => break "the server ended the log's stream".to_string(),
            Ok(None) => {}
            Err(e) => break format!("the log's stream: {e}"),
        }
        // With every transaction handed over confirmed, nothing before the server's last idle
        // position is left to deliver: the slot may go up to it (a server shutting down waits
        // for its sender to be told so).
        let confirmed = shared.confirm.load(Ordering::Relaxed);
        let done = shared.held.load(Ordering::Relaxed) == 0 && !transactions.in_transaction();
        let flushed = if done { confirmed.max(idle_at) } else { confirmed };
        if flushed != sent || reply || sent_at.elapsed() >= STATUS_EVERY {
            if let Err(e) = connection.confirm(received_to.max(flushed), flushed) {
                break format!("the log's stream: {e}");
            }
            (sent, sent_at) = (flushed, Instant::now());
        }
    };
    let _ = sender.send(Received::Ended(ended));
    bell.ring();
}
