//! One HTTP/1.x request read under bounds, and its answer written: the request line and headers
//! in at most `HEADER_BYTES`, a body of at most the listener's limit, all of it before a
//! deadline. One request per connection: every answer closes it, so nothing is kept between
//! requests and no idle connection is waited on.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// The request line and the headers together: a browser's, with basic authentication, take a
/// few hundred bytes.
pub const HEADER_BYTES: usize = 16 * 1024;

/// What is read and dropped, at most, after refusing a request whose rest was not read, so that
/// closing does not reset the connection before the client has read the refusal.
const LINGER_BYTES: usize = 1024 * 1024;
const LINGER_TIME: Duration = Duration::from_secs(1);

/// Headers a request may carry once: two of them would leave which one counts to whoever reads.
const ONCE: [&str; 6] = ["host", "origin", "sec-fetch-site", "content-length", "transfer-encoding", "authorization"];

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request line and headers exceed {HEADER_BYTES} bytes")]
    HeaderTooLarge,
    #[error("the request's body exceeds {0} bytes")]
    BodyTooLarge(usize),
    #[error("a body must come with content-length, not transfer-encoding")]
    LengthRequired,
    #[error("not an HTTP/1.1 request: {0}")]
    Malformed(&'static str),
    #[error("the request did not arrive in time")]
    TimedOut,
    #[error("the client went away: {0}")]
    Gone(io::Error),
}

impl ReadError {
    /// The status that refuses the request; `None` when no one is left to tell.
    pub fn status(&self) -> Option<u16> {
        match self {
            ReadError::HeaderTooLarge => Some(431),
            ReadError::BodyTooLarge(_) => Some(413),
            ReadError::LengthRequired => Some(411),
            ReadError::Malformed(_) => Some(400),
            ReadError::TimedOut => Some(408),
            ReadError::Gone(_) => None,
        }
    }
}

/// A request as the listener hands it on: its line, headers and whole body.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path and query as sent (always starting with `/`).
    pub target: String,
    /// Names in lower case, in the order sent.
    headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(field, _)| field == name).map(|(_, value)| value.as_str())
    }

    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(path, _)| path)
    }

    /// The query, empty without one.
    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, query)| query)
    }

    /// How long the body is, by content-length; a body of another framing is refused.
    pub fn body_length(&self) -> Result<usize, ReadError> {
        if self.header("transfer-encoding").is_some() {
            return Err(ReadError::LengthRequired);
        }
        match self.header("content-length") {
            None => Ok(0),
            Some(value) if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // Too many digits for a usize is only more than any limit.
                Ok(value.parse().unwrap_or(usize::MAX))
            }
            Some(_) => Err(ReadError::Malformed("content-length is not a number")),
        }
    }
}

/// An answer: status, headers and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: vec![("content-type", content_type.to_string())], body: body.into() }
    }

    /// `{"error": message}`, the form the console's page reads an error in.
    pub fn error(status: u16, message: &str) -> Response {
        Response::new(status, "application/json", serde_json::json!({ "error": message }).to_string())
    }

    /// Adds a header; `value` is ours, never a client's.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// A client's connection, with the deadline its request must arrive by.
pub struct Connection {
    stream: TcpStream,
    deadline: Instant,
    /// How long the client has to take its whole answer.
    time: Duration,
    /// Bytes read past the headers: the body's start.
    pending: Vec<u8>,
}

impl Connection {
    /// `time` is how long the client has to send its request, and to take the whole answer.
    pub fn new(stream: TcpStream, time: Duration) -> io::Result<Connection> {
        stream.set_write_timeout(Some(time))?;
        Ok(Connection { stream, deadline: Instant::now() + time, time, pending: Vec::new() })
    }

    /// The request line and headers; the body is left for `read_body`.
    pub fn read_head(&mut self) -> Result<Request, ReadError> {
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        loop {
            let searched_from = head.len().saturating_sub(3);
            let read = self.read_some(&mut chunk)?;
            head.extend_from_slice(&chunk[..read]);
            if let Some(at) = head[searched_from..].windows(4).position(|w| w == b"\r\n\r\n") {
                let end = searched_from + at;
                if end > HEADER_BYTES {
                    return Err(ReadError::HeaderTooLarge);
                }
                self.pending = head.split_off(end + 4);
                head.truncate(end);
                return parse_head(&head);
            }
            if head.len() > HEADER_BYTES {
                return Err(ReadError::HeaderTooLarge);
            }
        }
    }

    /// Tells a client that waits before sending its body (`expect: 100-continue`) to send it,
    /// within the time it has to send its request.
    pub fn invite_body(&mut self) -> io::Result<()> {
        self.write_by(b"HTTP/1.1 100 Continue\r\n\r\n", self.deadline)
    }

    /// Reads the body of `length` bytes (which the caller has checked against its limit).
    pub fn read_body(&mut self, request: &mut Request, length: usize) -> Result<(), ReadError> {
        let mut body = std::mem::take(&mut self.pending);
        body.truncate(length);
        body.reserve_exact(length - body.len());
        let mut chunk = [0u8; 4096];
        while body.len() < length {
            let wanted = chunk.len().min(length - body.len());
            let read = self.read_some(&mut chunk[..wanted])?;
            body.extend_from_slice(&chunk[..read]);
        }
        request.body = body;
        Ok(())
    }

    fn read_some(&mut self, buffer: &mut [u8]) -> Result<usize, ReadError> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadError::TimedOut);
            }
            self.stream.set_read_timeout(Some(left)).map_err(ReadError::Gone)?;
            return match self.stream.read(buffer) {
                Ok(0) => Err(ReadError::Gone(io::ErrorKind::UnexpectedEof.into())),
                Ok(read) => Ok(read),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Err(ReadError::TimedOut),
                Err(e) => Err(ReadError::Gone(e)),
            };
        }
    }

    /// Writes `response`, saying that the connection closes after it.
    pub fn answer(&mut self, response: &Response) -> io::Result<()> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", response.status, reason(response.status));
        for (name, value) in &response.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n", response.body.len()));
        let deadline = Instant::now() + self.time;
        self.write_by(head.as_bytes(), deadline)?;
        self.write_by(&response.body, deadline)
    }

    /// Writes all of `bytes` by `deadline`: a client that takes its answer a byte at a time
    /// holds its connection's thread that long at most, not a write timeout per byte.
    fn write_by(&mut self, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
        while !bytes.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.set_write_timeout(Some(left))?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => bytes = &bytes[written..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Closes the connection. `unread`: the client may still be sending what was refused; a
    /// little of it is read first, since closing with data unread resets the connection, and
    /// the client could lose the refusal it has not read yet.
    pub fn close(mut self, unread: bool) {
        // Either way the connection is dropped below.
        let _ = self.stream.shutdown(Shutdown::Write);
        if !unread {
            return;
        }
        let (until, mut drained, mut chunk) = (Instant::now() + LINGER_TIME, 0, [0u8; 8192]);
        while drained < LINGER_BYTES {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stream.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(read) => drained += read,
            }
        }
    }
}

pub(super) fn parse_head(head: &[u8]) -> Result<Request, ReadError> {
    let text = std::str::from_utf8(head).map_err(|_| ReadError::Malformed("the request line and headers are not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split(' ');
    let (method, target, version) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if parts.next().is_some() || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ReadError::Malformed("the request line is METHOD /path HTTP/1.1"));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err(ReadError::Malformed("the request's target is a path: /…"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(ReadError::Malformed("the version is HTTP/1.1 or HTTP/1.0"));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed("a header is name: value"));
        };
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(ReadError::Malformed("a header's name is a token (no folded lines)"));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(ReadError::Malformed("a header's value holds a control character"));
        }
        let name = name.to_ascii_lowercase();
        if ONCE.contains(&name.as_str()) && headers.iter().any(|(field, _)| *field == name) {
            return Err(ReadError::Malformed(
                "host, origin, sec-fetch-site, content-length, transfer-encoding or authorization given twice",
            ));
        }
        headers.push((name, value.to_string()));
    }
    Ok(Request { method: method.to_string(), target: target.to_string(), headers, body: Vec::new() })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_client_that_takes_its_answer_slowly_is_given_up_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Takes 64 kB every 50 ms: each write goes on well within its time, the whole answer
        // would take minutes.
        std::thread::spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            while client.read(&mut chunk).is_ok_and(|read| read > 0) {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let mut connection = Connection::new(stream, Duration::from_millis(300)).unwrap();
        let answer = Response::new(200, "application/octet-stream", vec![b'x'; 64 * 1024 * 1024]);
        let written = connection.answer(&answer);
        assert_eq!(written.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
    }

    #[test]
    fn a_head_parses_into_its_line_and_headers() {
        let request = parse_head(b"POST /api/action?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: 12\r\nX-A:  b \t").unwrap();
        assert_eq!((request.method.as_str(), request.path(), request.query()), ("POST", "/api/action", "x=1"));
        assert_eq!(request.header("host"), Some("127.0.0.1:8080"));
        assert_eq!(request.header("x-a"), Some("b"));
        assert_eq!(request.body_length().unwrap(), 12);
    }

    #[test]
    fn a_head_that_is_not_plain_http_1_is_refused() {
        for head in [
            "GET http://evil.example/ HTTP/1.1",
            "GET / HTTP/2",
            "get / HTTP/1.1",
            "GET /  HTTP/1.1",
            "GET / HTTP/1.1\r\n folded: value",
            "GET / HTTP/1.1\r\nno colon",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b",
            "GET / HTTP/1.1\r\nX: a\nb",
        ] {
            assert!(matches!(parse_head(head.as_bytes()), Err(ReadError::Malformed(_))), "{head:?}");
        }
    }

    #[test]
    fn a_body_is_framed_by_a_plain_content_length_only() {
        let length = |header: &str| parse_head(format!("POST / HTTP/1.1\r\n{header}").as_bytes()).unwrap().body_length();
        assert!(matches!(length("Content-Length: +5"), Err(ReadError::Malformed(_))));
        assert!(matches!(length("Content-Length: -1"), Err(ReadError::Malformed(_))));
        assert!(matches!(length("Transfer-Encoding: chunked"), Err(ReadError::LengthRequired)));
        assert_eq!(length("Content-Length: 99999999999999999999999").unwrap(), usize::MAX);
        assert_eq!(length("X: y").unwrap(), 0);
    }
}
