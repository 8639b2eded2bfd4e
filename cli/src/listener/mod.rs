//! The HTTP listener of the console and of the relay's `/metrics`, and the one place their
//! requests are bounded and checked. Each connection is read on a thread of its own, under
//! bounds: its request line and headers (`http::HEADER_BYTES`), its body (the listener's
//! limit) and the time it has to send them (`READ_TIME`); then whom it comes from is checked
//! (`hosts`). Only a whole request that passed is handed to the serving threads, so a slow or
//! stalled client holds its own connection's thread, never a serving one. At most
//! `CONNECTIONS` are open at once; when all are taken, a new connection closes the one that
//! has been reading its request the longest, so that stalled clients cannot lock out a
//! scraper or an operator whose requests arrive whole at once.
//!
//! - `http`: reading one request within its bounds, and writing its answer.
//! - `hosts`: the `Host`, `Origin` and `Sec-Fetch-Site` checks.

mod hosts;
mod http;

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

pub use hosts::{allowed_host, HostName};
pub use http::{Request, Response};

use hosts::Hosts;
use http::{Connection, ReadError};

/// How long a client has to send its whole request (line, headers and body), and to take its
/// whole answer.
const READ_TIME: Duration = Duration::from_secs(10);

/// Connections open at once. One more closes the oldest still reading its request; with none
/// reading, it is closed itself.
const CONNECTIONS: usize = 128;

/// A connection's thread only reads, checks and writes.
const CONNECTION_STACK: usize = 256 * 1024;

/// How long to wait before accepting again after accept failed (out of file descriptors, say),
/// rather than spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// A listening socket, and the requests it read, waiting for a serving thread.
pub struct Listener {
    address: SocketAddr,
    shared: Arc<Shared>,
}

/// What the accepting thread, the connections' threads and the serving threads share.
struct Shared {
    hosts: Hosts,
    body_bytes: usize,
    waiting: Mutex<Waiting>,
    arrived: Condvar,
    open: AtomicUsize,
    /// The connections still reading their requests, oldest first, by their number.
    reading: Mutex<BTreeMap<u64, TcpStream>>,
    numbered: AtomicU64,
}

#[derive(Default)]
struct Waiting {
    requests: VecDeque<Exchange>,
    stopped: bool,
}

/// A request taken by a serving thread, and where its answer goes.
pub struct Exchange {
    pub request: Request,
    reply: mpsc::SyncSender<Response>,
}

impl Exchange {
    pub fn answer(self, response: Response) {
        // The connection's thread is gone only if its client went: no one is left to tell.
        let _ = self.reply.send(response);
    }
}

impl Listener {
    /// Listens on the first of `addresses` that can be bound, answering the hosts `hosts` admits
    /// (with `allowed`, the names of `--allowed-host`) and reading bodies of at most
    /// `body_bytes`; `name` names its threads.
    pub fn start(addresses: &[SocketAddr], allowed: &[HostName], body_bytes: usize, name: &str) -> io::Result<Listener> {
        let socket = TcpListener::bind(addresses)?;
        let address = socket.local_addr()?;
        let shared = Arc::new(Shared {
            hosts: Hosts::new(address.ip(), allowed),
            body_bytes,
            waiting: Mutex::new(Waiting::default()),
            arrived: Condvar::new(),
            open: AtomicUsize::new(0),
            reading: Mutex::new(BTreeMap::new()),
            numbered: AtomicU64::new(0),
        });
        let accepting = Arc::clone(&shared);
        std::thread::Builder::new().name(format!("{name}-accept")).spawn(move || accept(&socket, &accepting))?;
        Ok(Listener { address, shared })
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The next request for a serving thread, waiting for one; `None` once stopped.
    pub fn next(&self) -> Option<Exchange> {
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if waiting.stopped {
                return None;
            }
            if let Some(exchange) = waiting.requests.pop_front() {
                return Some(exchange);
            }
            waiting = self.shared.arrived.wait(waiting).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Ends `next` for every serving thread; requests not taken yet are closed unanswered.
    pub fn stop(&self) {
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.stopped = true;
        waiting.requests.clear();
        self.shared.arrived.notify_all();
    }
}

impl Shared {
    /// Queues `exchange` for a serving thread; false once stopped.
    fn hand_on(&self, exchange: Exchange) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.stopped {
            return false;
        }
        waiting.requests.push_back(exchange);
        self.arrived.notify_one();
        true
    }

    /// Closes the connection that has been reading its request the longest; false if none is.
    /// Its thread's next read fails, which ends it and gives its place back.
    fn close_oldest_reading(&self) -> bool {
        let oldest = self.reading.lock().unwrap_or_else(PoisonError::into_inner).pop_first();
        // Shut down, it can only fail if the client is gone already: either way it is closed.
        oldest.map(|(_, stream)| stream.shutdown(Shutdown::Both)).is_some()
    }
}

/// A connection's place among those reading their requests, in the order they were accepted;
/// left when dropped.
struct Reading {
    shared: Arc<Shared>,
    number: u64,
}

impl Reading {
    /// Records `stream` as reading; `None` if it cannot be cloned (then nothing could close it).
    fn enter(shared: &Arc<Shared>, stream: &TcpStream) -> Option<Reading> {
        let number = shared.numbered.fetch_add(1, Ordering::Relaxed);
        shared.reading.lock().unwrap_or_else(PoisonError::into_inner).insert(number, stream.try_clone().ok()?);
        Some(Reading { shared: Arc::clone(shared), number })
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.shared.reading.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.number);
    }
}

/// One of the `CONNECTIONS` places, given back when its connection's thread ends.
struct Place(Arc<Shared>);

impl Place {
    /// A free place; or, with none, the place of the oldest connection still reading, which is
    /// closed (its thread gives it back as it ends: until then, one more may be open).
    fn take(shared: &Arc<Shared>) -> Option<Place> {
        let mut taken = shared.open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| (open < CONNECTIONS).then_some(open + 1));
        if taken.is_err() && shared.close_oldest_reading() {
            taken = shared.open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| (open < 2 * CONNECTIONS).then_some(open + 1));
        }
        taken.is_ok().then(|| Place(Arc::clone(shared)))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept(socket: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let stream = match socket.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                std::thread::sleep(ACCEPT_PAUSE);
                continue;
            }
        };
        // With no place left the connection is dropped, which closes it. Recorded as reading
        // before its thread starts, so that the oldest is the first accepted.
        let Some(place) = Place::take(shared) else { continue };
        let Some(reading) = Reading::enter(shared, &stream) else { continue };
        // A thread that cannot start drops its closure, and with it the connection and its place.
        let _ = std::thread::Builder::new().stack_size(CONNECTION_STACK).spawn(move || converse(stream, &place.0, reading));
    }
}

/// Reads the connection's request, checks it, has a serving thread answer it, and closes the
/// connection. Until its request is whole and passed, `reading` lets a newer connection close
/// it to take its place; a refused one stays closable while its refusal is written.
fn converse(stream: TcpStream, shared: &Shared, reading: Reading) {
    let Ok(mut connection) = Connection::new(stream, READ_TIME) else { return };
    match take_request(&mut connection, shared) {
        Ok(request) => {
            drop(reading);
            let (reply, replied) = mpsc::sync_channel(1);
            if shared.hand_on(Exchange { request, reply }) {
                if let Ok(response) = replied.recv() {
                    // A client that does not take its answer has only itself to blame.
                    let _ = connection.answer(&response);
                }
            }
            connection.close(false);
        }
        Err(Some(refusal)) => {
            let _ = connection.answer(&refusal);
            connection.close(true);
        }
        Err(None) => {}
    }
}

/// The whole request the connection brings if it is one to answer, or the answer that refuses
/// it (`None`: the client went away).
fn take_request(connection: &mut Connection, shared: &Shared) -> Result<Request, Option<Response>> {
    let refusal = |e: ReadError| e.status().map(|status| Response::error(status, &e.to_string()));
    let mut request = connection.read_head().map_err(refusal)?;
    if let Some((status, why)) = shared.hosts.refusal(&request) {
        return Err(Some(Response::error(status, why)));
    }
    let length = request.body_length().map_err(refusal)?;
    if length > shared.body_bytes {
        return Err(refusal(ReadError::BodyTooLarge(shared.body_bytes)));
    }
    if length > 0 && request.header("expect").is_some_and(|expect| expect.eq_ignore_ascii_case("100-continue")) {
        connection.invite_body().map_err(|_| None)?;
    }
    connection.read_body(&mut request, length).map_err(refusal)?;
    Ok(request)
}
