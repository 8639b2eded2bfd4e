//! A logical replication connection: what `outbox relay` streams the log's slot over.
//! tokio-postgres speaks no replication protocol, so this speaks just enough of it
//! (<https://www.postgresql.org/docs/15/protocol-replication.html>): the startup, with TLS and
//! password authentication as the relay's other connections make them, START_REPLICATION, and
//! the copy stream's messages both ways.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use postgres::config::{Host, SslMode};
use postgres::fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use crate::connection::{target, ConnectError, Target};
use crate::tls::client_config;

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Io(#[from] io::Error),
    /// What the server said, with its SQLSTATE and its detail, if any (from 16 on, the
    /// detail is where a refused WAL sender says which attribute it lacks).
    #[error("{code}: {message}{}", detail.as_ref().map(|detail| format!(" ({detail})")).unwrap_or_default())]
    Server { code: String, message: String, detail: Option<String> },
    #[error("{0}")]
    Protocol(String),
}

/// What the server streams after START_REPLICATION.
#[derive(Debug, PartialEq, Eq)]
pub enum Streamed {
    /// One message of the output plugin.
    Data(Vec<u8>),
    /// The server's position: everything before it was sent. `reply`: it asks for a status.
    Keepalive { wal_end: u64, reply: bool },
    /// The server ended the stream.
    Ended,
}

pub struct ReplicationConnection {
    socket: Socket,
    received: BytesMut,
}

impl ReplicationConnection {
    /// Connects to the database of `url` (made whole as every connection is: crate::connection)
    /// for logical replication, as its user (who needs the REPLICATION attribute), with the TLS
    /// the URL asks for and the session's `settings`.
    pub fn connect(
        url: &str,
        application_name: &str,
        settings: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<ReplicationConnection, ReplicationError> {
        let Target { config, tls, .. } = target(url)?;
        let user = config.get_user().unwrap_or_default().to_string();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = match (config.get_hosts().first(), config.get_hostaddrs().first()) {
            (Some(Host::Unix(directory)), _) => Err(directory.join(format!(".s.PGSQL.{port}"))),
            (Some(Host::Tcp(host)), _) => Ok(host.clone()),
            (None, address) => Ok(address.map(ToString::to_string).unwrap_or_default()),
        };
        let socket = match host {
            Err(path) => Socket::Unix(UnixStream::connect(path)?),
            Ok(host) => {
                let tcp = connect_tcp(&host, port, timeout)?;
                // A server that accepts the connection and says nothing holds no one up for long.
                tcp.set_read_timeout(Some(timeout))?;
                tcp.set_write_timeout(Some(timeout))?;
                if tls.mode == SslMode::Disable {
                    Socket::Tcp(tcp)
                } else {
                    start_tls(tcp, &host, &tls)?
                }
            }
        };
        let mut connection = ReplicationConnection { socket, received: BytesMut::new() };
        connection.socket.set_read_timeout(Some(timeout))?;
        let database = config.get_dbname().unwrap_or_default().to_string();
        let name = config.get_application_name().unwrap_or(application_name).to_string();
        let mut parameters =
            vec![("user", user.as_str()), ("database", &database), ("replication", "database"), ("application_name", &name)];
        parameters.extend_from_slice(settings);
        connection.send(|buffer| frontend::startup_message(parameters, buffer))?;
        connection.authenticate(config.get_password().unwrap_or_default(), &user)?;
        Ok(connection)
    }

    /// Starts streaming `slot` with pgoutput's `options` (each name and value is quoted here),
    /// from `from` or the slot's confirmed position, whichever is later: the transactions that
    /// committed before it are skipped.
    pub fn start_logical(&mut self, slot: &str, from: u64, options: &[(&str, &str)]) -> Result<(), ReplicationError> {
        let options: Vec<String> = options.iter().map(|(name, value)| format!("{} {}", quote_ident(name), quote_literal(value))).collect();
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {:X}/{:X} ({})",
            quote_ident(slot),
            from >> 32,
            from & 0xFFFF_FFFF,
            options.join(", ")
        );
        self.send(|buffer| frontend::query(&command, buffer))?;
        loop {
            let (tag, body) = self.frame()?;
            match tag {
                b'W' => return Ok(()),
                b'N' => {}
                b'E' => return Err(server_error(tag, body)),
                _ => return Err(ReplicationError::Protocol(format!("START_REPLICATION answered with message {:?}", tag as char))),
            }
        }
    }

    /// The stream's next message; `None` if none came within the connection's timeout.
    pub fn next(&mut self) -> Result<Option<Streamed>, ReplicationError> {
        let (tag, mut body) = match self.frame() {
            Ok(frame) => frame,
            Err(ReplicationError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
            Err(e) => return Err(e),
        };
        match tag {
            b'd' if body.first() == Some(&b'w') && body.len() >= 25 => {
                // XLogData: the start and end of WAL it holds, the time it was sent, the message.
                body.advance(25);
                Ok(Some(Streamed::Data(body.to_vec())))
            }
            b'd' if body.first() == Some(&b'k') && body.len() >= 18 => {
                body.advance(1);
                let wal_end = body.get_u64();
                body.advance(8);
                Ok(Some(Streamed::Keepalive { wal_end, reply: body.first() == Some(&1) }))
            }
            b'c' | b'C' | b'Z' => Ok(Some(Streamed::Ended)),
            b'N' => Ok(None),
            b'E' => Err(server_error(tag, body)),
            _ => Err(ReplicationError::Protocol(format!("an unexpected message {:?} in the stream", tag as char))),
        }
    }

    pub fn set_read_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.socket.set_read_timeout(Some(timeout))
    }

    /// Tells the server what was received (`written`) and what is done with (`flushed`): the
    /// slot lets go of everything before it.
    pub fn confirm(&mut self, written: u64, flushed: u64) -> Result<(), ReplicationError> {
        // Microseconds since 2000-01-01, PostgreSQL's epoch.
        let since_2000 = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as i64 - 946_684_800_000_000;
        let mut status = vec![b'r'];
        for position in [written, flushed, flushed] {
            status.extend(position.to_be_bytes());
        }
        status.extend(since_2000.to_be_bytes());
        status.push(0);
        self.send(|buffer| {
            frontend::CopyData::new(status.as_slice())?.write(buffer);
            Ok(())
        })
    }

    fn authenticate(&mut self, password: &[u8], user: &str) -> Result<(), ReplicationError> {
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, body) = self.frame()?;
            if tag != b'R' {
                match tag {
                    b'E' => return Err(server_error(tag, body)),
                    b'S' | b'K' | b'N' => continue,
                    b'Z' => return Ok(()),
                    _ => return Err(ReplicationError::Protocol(format!("an unexpected message {:?} at startup", tag as char))),
                }
            }
            match parse(tag, body)? {
                Message::AuthenticationOk => {}
                Message::AuthenticationCleartextPassword => self.send(|buffer| frontend::password_message(password, buffer))?,
                Message::AuthenticationMd5Password(body) => {
                    let hash = md5_hash(user.as_bytes(), password, body.salt());
                    self.send(|buffer| frontend::password_message(hash.as_bytes(), buffer))?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = false;
                    while let Some(mechanism) = mechanisms.next()? {
                        offered |= mechanism == SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(ReplicationError::Protocol("the server offers no SASL mechanism but SCRAM-SHA-256-PLUS".into()));
                    }
                    let started = ScramSha256::new(password, ChannelBinding::unsupported());
                    self.send(|buffer| frontend::sasl_initial_response(SCRAM_SHA_256, started.message(), buffer))?;
                    scram = Some(started);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let scram = scram.as_mut().ok_or_else(|| ReplicationError::Protocol("SASL went on before it began".into()))?;
                    scram.update(body.data())?;
                    let message = scram.message().to_vec();
                    self.send(|buffer| frontend::sasl_response(&message, buffer))?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let scram = scram.as_mut().ok_or_else(|| ReplicationError::Protocol("SASL ended before it began".into()))?;
                    scram.finish(body.data())?;
                }
                _ => return Err(ReplicationError::Protocol("the server asks for an authentication this relay does not make".into())),
            }
        }
    }

    fn send(&mut self, write: impl FnOnce(&mut BytesMut) -> io::Result<()>) -> Result<(), ReplicationError> {
        let mut buffer = BytesMut::new();
        write(&mut buffer)?;
        self.socket.write_all(&buffer)?;
        self.socket.flush()?;
        Ok(())
    }

    /// The next whole message: its tag and body. A read timed out leaves what was received
    /// of a message for the next call.
    fn frame(&mut self) -> Result<(u8, BytesMut), ReplicationError> {
        loop {
            if self.received.len() >= 5 {
                let length = u32::from_be_bytes(self.received[1..5].try_into().expect("four bytes")) as usize;
                if length < 4 {
                    return Err(ReplicationError::Protocol(format!("a message of length {length}")));
                }
                if self.received.len() > length {
                    let mut message = self.received.split_to(length + 1);
                    let tag = message[0];
                    message.advance(5);
                    return Ok((tag, message));
                }
            }
            let mut chunk = [0u8; 65536];
            let read = self.socket.read(&mut chunk)?;
            if read == 0 {
                return Err(ReplicationError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.received.extend_from_slice(&chunk[..read]);
        }
    }
}

impl Drop for ReplicationConnection {
    fn drop(&mut self) {
        // Best effort: the server ends the session when the socket closes anyway.
        let _ = self.send(|buffer| {
            frontend::terminate(buffer);
            Ok(())
        });
    }
}

fn connect_tcp(host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for address in std::net::ToSocketAddrs::to_socket_addrs(&(host, port))? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// TLS as libpq's `sslmode` asks: refused by the server, `prefer` goes on without it.
fn start_tls(mut tcp: TcpStream, host: &str, tls: &crate::tls::Tls) -> Result<Socket, ReplicationError> {
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    tcp.write_all(&request)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)?;
    if answer[0] != b'S' {
        if tls.mode == SslMode::Require {
            return Err(ReplicationError::Protocol("the server does not accept TLS, which sslmode requires".into()));
        }
        return Ok(Socket::Tcp(tcp));
    }
    let config = Arc::new(client_config(tls).map_err(ConnectError::from)?);
    let name = ServerName::try_from(host.to_string()).map_err(|e| ReplicationError::Protocol(format!("host {host}: {e}")))?;
    let connection = ClientConnection::new(config, name).map_err(|e| ReplicationError::Protocol(e.to_string()))?;
    Ok(Socket::Tls(Box::new(StreamOwned::new(connection, tcp))))
}

fn parse(tag: u8, body: BytesMut) -> Result<Message, ReplicationError> {
    let mut whole = BytesMut::with_capacity(body.len() + 5);
    whole.extend_from_slice(&[tag]);
    whole.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    whole.extend_from_slice(&body);
    Message::parse(&mut whole)?.ok_or_else(|| ReplicationError::Protocol("a message cut short".into()))
}

fn server_error(tag: u8, body: BytesMut) -> ReplicationError {
    let Ok(Message::ErrorResponse(error)) = parse(tag, body) else {
        return ReplicationError::Protocol("a malformed error message".into());
    };
    let (mut code, mut message, mut detail) = (String::new(), String::new(), None);
    let mut fields = error.fields();
    while let Ok(Some(field)) = fields.next() {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'D' => detail = Some(String::from_utf8_lossy(field.value_bytes()).into_owned()),
            _ => {}
        }
    }
    ReplicationError::Server { code, message, detail }
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Socket {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(tcp) => tcp.set_read_timeout(timeout),
            Socket::Unix(unix) => unix.set_read_timeout(timeout),
            Socket::Tls(tls) => tls.sock.set_read_timeout(timeout),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(tcp) => tcp.read(buffer),
            Socket::Unix(unix) => unix.read(buffer),
            Socket::Tls(tls) => tls.read(buffer),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(tcp) => tcp.write(buffer),
            Socket::Unix(unix) => unix.write(buffer),
            Socket::Tls(tls) => tls.write(buffer),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Socket::Tcp(tcp) => tcp.flush(),
            Socket::Unix(unix) => unix.flush(),
            Socket::Tls(tls) => tls.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_are_quoted() {
        assert_eq!(quote_ident("outbox_log_5"), "\"outbox_log_5\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
