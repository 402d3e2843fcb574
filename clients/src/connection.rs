//! The client side of a `ciphermq/1` connection: mutual TLS over TCP, the `HELLO`
//! greeting, and line I/O built for pipelining.
//!
//! Writes are explicit: [`Connection::queue_line`] only appends to a buffer, and
//! [`Connection::flush`] sends everything queued in as few TLS records as possible, so
//! a client can queue thousands of commands and pay for one write. Replies are read
//! with [`Connection::read_line`] from a 64 KiB read buffer; a long line is assembled
//! in one reusable buffer in linear time. [`Connection::into_split`] gives a reader
//! and a writer for two tasks, which is how a pipelining client keeps the broker busy
//! while it consumes replies.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ciphermq_trust::ChainOnly;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Longest wait for the TCP connection, the TLS handshake and the broker's
/// greeting together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Protocol name and version the broker announces in its greeting.
pub const PROTOCOL: &str = "ciphermq/1";

/// Size of a connection's read buffer: large enough that a burst of pipelined
/// replies is drained with few reads, small enough for thousands of connections.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Longest reply line accepted (64 MiB). The broker's lines are bounded by its
/// `max_line_bytes` (1 MiB + 4 KiB by default); this cap only stops a broken or
/// hostile peer that never sends `\n` from exhausting memory.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// The TLS client stream under a [`Connection`], as returned by
/// [`Connection::connect_raw`] for tests that speak raw bytes.
pub type RawTls = tokio_rustls::client::TlsStream<TcpStream>;

/// Why connecting, reading or writing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A PEM file (CA, certificate or key) could not be read or holds no usable item.
    #[error("cannot load the {what} from {}: {error}", path.display())]
    Pem {
        /// Which file it was meant to be: "CA certificate", "certificate", "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error (`no items found` for a file without that PEM section).
        error: rustls::pki_types::pem::Error,
    },
    /// The CA certificate could not be used to verify the broker.
    #[error("cannot trust the CA certificate {}: {reason}", path.display())]
    BadCa {
        /// The CA file.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// The certificate and key do not form a usable client identity, or another
    /// configuration error from rustls.
    #[error("invalid TLS client configuration: {0}")]
    Config(rustls::Error),
    /// `server_name` is neither a DNS name nor an IP address.
    #[error("invalid TLS server name {0:?}")]
    InvalidServerName(String),
    /// The TCP connection could not be made.
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        /// The address as given.
        addr: String,
        /// The underlying error.
        error: io::Error,
    },
    /// The TLS layer failed: handshake (for example the broker rejected our
    /// certificate, or its certificate did not verify) or a later alert.
    #[error("TLS error: {0}")]
    Tls(rustls::Error),
    /// Reading or writing the socket failed.
    #[error("I/O error: {0}")]
    Io(io::Error),
    /// The broker's first line was not a `HELLO`: the line is its reason (for
    /// example `Access denied: unknown client (role=unknown)`).
    #[error("the broker refused the connection: {0}")]
    Refused(String),
    /// The broker closed the connection where a line was expected.
    #[error("the broker closed the connection")]
    Closed,
    /// A reply line exceeded [`MAX_LINE_BYTES`].
    #[error("reply line longer than {limit} bytes")]
    LineTooLong {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// A reply line was not UTF-8, which the protocol requires.
    #[error("reply line is not valid UTF-8")]
    NotUtf8,
}

impl From<io::Error> for ClientError {
    /// tokio-rustls reports TLS failures as `io::Error`s wrapping a `rustls::Error`;
    /// unwrap those so callers can match on [`ClientError::Tls`].
    fn from(e: io::Error) -> Self {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(tls) => ClientError::Tls(tls.clone()),
            None => ClientError::Io(e),
        }
    }
}

/// Where a client's TLS identity and trust come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsClientOptions {
    /// The CA that signed the broker's certificate (`ca.crt` from `ciphermq-pki`).
    pub ca_cert: PathBuf,
    /// This client's certificate chain; its CN is the identity the broker sees.
    pub cert: PathBuf,
    /// This client's private key (PKCS#8, SEC1 or PKCS#1 PEM).
    pub key: PathBuf,
    /// Name sent in SNI and, when `check_hostname` is set, matched against the
    /// broker certificate's SANs (default `localhost`).
    pub server_name: String,
    /// Check that the broker's certificate is valid for `server_name`. When false the
    /// chain is still verified against the CA; only the name check is skipped, for
    /// brokers reached by an address their certificate does not list.
    pub check_hostname: bool,
}

impl TlsClientOptions {
    /// The files `ciphermq-pki` writes for `cn` in `certs_dir`: `ca.crt`, `{cn}.crt`,
    /// `{cn}.key`; server name `localhost`, hostname checked.
    pub fn for_cn(certs_dir: &Path, cn: &str) -> Self {
        TlsClientOptions {
            ca_cert: certs_dir.join("ca.crt"),
            cert: certs_dir.join(format!("{cn}.crt")),
            key: certs_dir.join(format!("{cn}.key")),
            server_name: "localhost".to_owned(),
            check_hostname: true,
        }
    }

    /// The rustls configuration (ring provider, TLS 1.2 and 1.3, client certificate),
    /// for callers that speak something other than `ciphermq/1` over the same mTLS
    /// (the admin endpoint).
    pub fn client_config(&self) -> Result<ClientConfig, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in load_certs(&self.ca_cert, "CA certificate")? {
            roots.add(cert).map_err(|e| ClientError::BadCa {
                path: self.ca_cert.clone(),
                reason: e.to_string(),
            })?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| ClientError::BadCa {
                path: self.ca_cert.clone(),
                reason: e.to_string(),
            })?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ClientError::Config)?;
        let builder = if self.check_hostname {
            builder.with_webpki_verifier(webpki)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly::new(webpki)))
        };
        let certs = load_certs(&self.cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|error| ClientError::Pem {
            what: "private key",
            path: self.key.clone(),
            error,
        })?;
        builder
            .with_client_auth_cert(certs, key)
            .map_err(ClientError::Config)
    }

    /// A connector to share between many connections (loading the files once).
    pub fn connector(&self) -> Result<TlsConnector, ClientError> {
        Ok(TlsConnector::from(Arc::new(self.client_config()?)))
    }

    /// `server_name` as the type the TLS handshake needs.
    pub fn server_name(&self) -> Result<ServerName<'static>, ClientError> {
        ServerName::try_from(self.server_name.clone())
            .map_err(|_| ClientError::InvalidServerName(self.server_name.clone()))
    }
}

/// Every certificate in a PEM file; at least one.
fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let pem_err = |error| ClientError::Pem {
        what,
        path: path.to_owned(),
        error,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(pem_err(rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// The broker's greeting: who it thinks we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Our identity as the broker sees it (the CN of our certificate).
    pub client_id: String,
    /// Our role, lowercase: `sender`, `receiver` or `admin`.
    pub role: String,
}

impl Hello {
    /// Parses `HELLO ciphermq/1 <client_id> <role>`; `None` for anything else.
    pub fn parse(line: &str) -> Option<Hello> {
        let mut parts = line.split(' ');
        let (Some("HELLO"), Some(PROTOCOL), Some(client_id), Some(role), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        if client_id.is_empty() || role.is_empty() {
            return None;
        }
        Some(Hello {
            client_id: client_id.to_owned(),
            role: role.to_owned(),
        })
    }
}

/// TCP connect with Nagle off (commands are small and latency matters), then the TLS
/// handshake.
async fn handshake(
    addr: &str,
    connector: &TlsConnector,
    server_name: ServerName<'static>,
) -> Result<RawTls, ClientError> {
    let connect_err = |error| ClientError::Connect {
        addr: addr.to_owned(),
        error,
    };
    let tcp = TcpStream::connect(addr).await.map_err(connect_err)?;
    tcp.set_nodelay(true).map_err(connect_err)?;
    Ok(connector.connect(server_name, tcp).await?)
}

/// An open `ciphermq/1` connection after a successful `HELLO`.
pub struct Connection {
    /// The TLS stream with its read buffer; writes go to the same stream.
    reader: LineReader<RawTls>,
    /// Bytes queued by `queue_line`/`queue_bytes` and not yet flushed.
    write_buf: Vec<u8>,
    /// The broker's greeting.
    hello: Hello,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("hello", &self.hello)
            .field("queued_bytes", &self.write_buf.len())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`), performs the TLS handshake, and reads the
    /// greeting. Any line other than `HELLO ciphermq/1 <id> <role>` is
    /// [`ClientError::Refused`]; end of stream is [`ClientError::Closed`]. A broker
    /// that rejects our certificate shows up as [`ClientError::Tls`].
    pub async fn connect(addr: &str, tls: &TlsClientOptions) -> Result<Connection, ClientError> {
        let connector = tls.connector()?;
        Self::connect_with(addr, &connector, tls.server_name()?).await
    }

    /// Like [`Connection::connect`], reusing a connector built once by
    /// [`TlsClientOptions::connector`] (a load generator opens many connections).
    pub async fn connect_with(
        addr: &str,
        connector: &TlsConnector,
        server_name: ServerName<'static>,
    ) -> Result<Connection, ClientError> {
        // A broker that accepts the TCP connection but never greets (it is
        // going down, or its accept queue is stuck) must not hang a client
        // that would otherwise retry elsewhere or later.
        let greeted = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut reader = LineReader::new(handshake(addr, connector, server_name).await?);
            let line = reader.read_line().await?.ok_or(ClientError::Closed)?;
            Ok::<_, ClientError>((reader, line))
        })
        .await;
        let (reader, line) = greeted.map_err(|_| ClientError::Connect {
            addr: addr.to_owned(),
            error: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no greeting within {} s", CONNECT_TIMEOUT.as_secs()),
            ),
        })??;
        match Hello::parse(&line) {
            Some(hello) => Ok(Connection {
                reader,
                write_buf: Vec::new(),
                hello,
            }),
            None => Err(ClientError::Refused(line)),
        }
    }

    /// Connects and completes the TLS handshake only, without reading the greeting:
    /// for tests of refusals and of raw bytes on the wire.
    pub async fn connect_raw(addr: &str, tls: &TlsClientOptions) -> Result<RawTls, ClientError> {
        handshake(addr, &tls.connector()?, tls.server_name()?).await
    }

    /// The broker's greeting: our client id and role.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The TLS stream, for inspecting the session (protocol version, certificates).
    /// Reading or writing it directly bypasses the buffers.
    pub fn tls(&self) -> &RawTls {
        &self.reader.inner
    }

    /// Queues `line` and a `\n`; nothing is sent until [`Connection::flush`].
    pub fn queue_line(&mut self, line: &str) {
        queue_line(&mut self.write_buf, line);
    }

    /// Queues raw bytes as they are (no newline added), for tests of malformed input.
    pub fn queue_bytes(&mut self, bytes: &[u8]) {
        self.write_buf.extend_from_slice(bytes);
    }

    /// Sends everything queued. Not cancel safe: if the future is dropped, part of
    /// the queued bytes may have been sent. Before flushing more commands than the
    /// socket buffers hold (thousands), split with [`Connection::into_split`] and read
    /// replies concurrently: a broker whose replies go unread stops reading too.
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        flush(&mut self.reader.inner, &mut self.write_buf).await
    }

    /// Reads one line without its `\n` or `\r\n`; `None` when the broker closed the
    /// connection at a line boundary. Cancel safe: a partial line read before the
    /// future is dropped is kept for the next call.
    pub async fn read_line(&mut self) -> Result<Option<String>, ClientError> {
        self.reader.read_line().await
    }

    /// Queues `line`, flushes, and reads one reply line; end of stream is
    /// [`ClientError::Closed`]. Replies are in command order, so any lines queued
    /// earlier must have had their replies read first.
    pub async fn request(&mut self, line: &str) -> Result<String, ClientError> {
        self.queue_line(line);
        self.flush().await?;
        self.read_line().await?.ok_or(ClientError::Closed)
    }

    /// Flushes, then closes our sending side with a TLS `close_notify`; replies
    /// already sent can still be read.
    pub async fn shutdown(&mut self) -> Result<(), ClientError> {
        self.flush().await?;
        self.reader.inner.shutdown().await?;
        Ok(())
    }

    /// Splits into a reader and a writer for two tasks (a pipelining client writes
    /// commands while another task reads replies). Buffered input and queued output
    /// carry over.
    pub fn into_split(self) -> (ConnectionReader, ConnectionWriter) {
        let (reader, read_half) = self.reader.replace_inner(());
        let (read_half, write_half) = tokio::io::split(read_half);
        let (reader, ()) = reader.replace_inner(read_half);
        (
            ConnectionReader {
                reader,
                hello: self.hello,
            },
            ConnectionWriter {
                inner: write_half,
                write_buf: self.write_buf,
                sent: 0,
                unflushed: false,
            },
        )
    }
}

/// The reading half of a split [`Connection`].
pub struct ConnectionReader {
    /// The read half with the connection's read buffer.
    reader: LineReader<ReadHalf<RawTls>>,
    /// The greeting, kept so either task can tell who it is.
    hello: Hello,
}

impl fmt::Debug for ConnectionReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionReader")
            .field("hello", &self.hello)
            .finish_non_exhaustive()
    }
}

impl ConnectionReader {
    /// Reads one line; see [`Connection::read_line`].
    pub async fn read_line(&mut self) -> Result<Option<String>, ClientError> {
        self.reader.read_line().await
    }

    /// A whole line already in the read buffer, without reading the socket:
    /// `None` when none is (the next [`ConnectionReader::read_line`] reads).
    pub(crate) fn buffered_line(&mut self) -> Option<Result<String, ClientError>> {
        self.reader.buffered_line()
    }

    /// The broker's greeting.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }
}

/// The writing half of a split [`Connection`].
pub struct ConnectionWriter {
    /// The write half of the TLS stream.
    inner: WriteHalf<RawTls>,
    /// Bytes queued and not yet flushed.
    write_buf: Vec<u8>,
    /// How much of `write_buf` [`ConnectionWriter::send_some`] has already
    /// handed to the TLS layer.
    sent: usize,
    /// Bytes were handed to the TLS layer since its last flush.
    unflushed: bool,
}

impl fmt::Debug for ConnectionWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionWriter")
            .field("queued_bytes", &self.queued_bytes())
            .finish_non_exhaustive()
    }
}

impl ConnectionWriter {
    /// Queues `line` and a `\n`; see [`Connection::queue_line`].
    pub fn queue_line(&mut self, line: &str) {
        queue_line(&mut self.write_buf, line);
    }

    /// Queues raw bytes; see [`Connection::queue_bytes`].
    pub fn queue_bytes(&mut self, bytes: &[u8]) {
        self.write_buf.extend_from_slice(bytes);
    }

    /// Sends everything queued; see [`Connection::flush`].
    pub async fn flush(&mut self) -> Result<(), ClientError> {
        if self.sent > 0 {
            self.write_buf.drain(..self.sent);
            self.sent = 0;
        }
        flush(&mut self.inner, &mut self.write_buf).await?;
        self.unflushed = false;
        Ok(())
    }

    /// Queues bytes it takes over: with nothing queued they become the
    /// write buffer as they are, without a copy. Returns a buffer it no
    /// longer needs (the empty write buffer, or `bytes` once copied), for
    /// reuse.
    pub(crate) fn queue_owned(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        if self.write_buf.is_empty() {
            std::mem::swap(&mut self.write_buf, &mut bytes);
        } else {
            self.write_buf.extend_from_slice(&bytes);
        }
        bytes
    }

    /// Bytes queued and not handed to the TLS layer yet.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.write_buf.len() - self.sent
    }

    /// Whether [`ConnectionWriter::send_some`] has work: bytes queued, or
    /// bytes in the TLS layer not flushed yet.
    pub(crate) fn has_unsent(&self) -> bool {
        self.sent < self.write_buf.len() || self.unflushed
    }

    /// One step of sending what is queued: one write of the queued bytes (as
    /// many as the TLS layer takes), or, once all are taken, one flush.
    ///
    /// Cancel safe, for a task that selects between reading and writing on
    /// one connection: a write that does not complete has taken no bytes (the
    /// next call writes them), and a flush that does not complete leaves its
    /// records in the TLS layer for the next call.
    pub(crate) async fn send_some(&mut self) -> Result<(), ClientError> {
        if self.sent < self.write_buf.len() {
            let n = self.inner.write(&self.write_buf[self.sent..]).await?;
            if n == 0 {
                return Err(ClientError::Io(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
            if self.sent == self.write_buf.len() {
                self.write_buf.clear();
                self.sent = 0;
            }
            self.unflushed = true;
        } else {
            self.inner.flush().await?;
            self.unflushed = false;
        }
        Ok(())
    }

    /// Flushes, then sends `close_notify`; see [`Connection::shutdown`].
    pub async fn shutdown(&mut self) -> Result<(), ClientError> {
        self.flush().await?;
        self.inner.shutdown().await?;
        Ok(())
    }
}

/// Appends `line` and `\n` to the write buffer.
fn queue_line(buf: &mut Vec<u8>, line: &str) {
    buf.reserve(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
}

/// Writes the whole buffer in one call (tokio-rustls packs it into full TLS records),
/// flushes, and empties the buffer keeping its capacity.
async fn flush<W: AsyncWrite + Unpin>(
    writer: &mut W,
    buf: &mut Vec<u8>,
) -> Result<(), ClientError> {
    if !buf.is_empty() {
        writer.write_all(buf).await?;
        buf.clear();
    }
    writer.flush().await?;
    Ok(())
}

/// A line reader over any byte stream: a fixed read buffer plus one growing buffer
/// for a line that spans reads. Each byte is scanned and copied at most once, so long
/// lines cost linear time.
struct LineReader<R> {
    /// The stream.
    inner: R,
    /// Bytes read from the stream; `buf[start..end]` are not consumed yet.
    buf: Box<[u8]>,
    /// First unconsumed byte of `buf`.
    start: usize,
    /// End of the valid bytes of `buf`.
    end: usize,
    /// The start of a line that did not fit in `buf` (or whose read was cancelled).
    partial: Vec<u8>,
}

impl<R> LineReader<R> {
    /// A reader with an empty [`READ_BUFFER_BYTES`] buffer.
    fn new(inner: R) -> Self {
        LineReader {
            inner,
            buf: vec![0; READ_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            partial: Vec::new(),
        }
    }

    /// A whole line already in `buf`, if there is one.
    fn buffered_line(&mut self) -> Option<Result<String, ClientError>> {
        let available = &self.buf[self.start..self.end];
        let newline = memchr::memchr(b'\n', available)?;
        let line = if self.partial.is_empty() {
            to_line(&available[..newline])
        } else {
            self.partial.extend_from_slice(&available[..newline]);
            let line = to_line(&self.partial);
            self.partial.clear();
            line
        };
        self.start += newline + 1;
        Some(line)
    }

    /// Moves the buffers onto another stream, returning the old one.
    fn replace_inner<S>(self, inner: S) -> (LineReader<S>, R) {
        let LineReader {
            inner: old,
            buf,
            start,
            end,
            partial,
        } = self;
        (
            LineReader {
                inner,
                buf,
                start,
                end,
                partial,
            },
            old,
        )
    }
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// One line without its terminator; `None` at end of stream on a line boundary.
    async fn read_line(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            let available = &self.buf[self.start..self.end];
            if let Some(newline) = memchr::memchr(b'\n', available) {
                let line = if self.partial.is_empty() {
                    to_line(&available[..newline])
                } else {
                    self.partial.extend_from_slice(&available[..newline]);
                    let line = to_line(&self.partial);
                    self.partial.clear();
                    line
                };
                self.start += newline + 1;
                return line.map(Some);
            }
            if self.partial.len() + available.len() > MAX_LINE_BYTES {
                return Err(ClientError::LineTooLong {
                    limit: MAX_LINE_BYTES,
                });
            }
            self.partial.extend_from_slice(available);
            self.start = 0;
            self.end = 0;
            let read = match self.inner.read(&mut self.buf).await {
                Ok(n) => n,
                // A peer that closes TCP without `close_notify` at a line boundary
                // has not truncated anything the protocol can see.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && self.partial.is_empty() => 0,
                Err(e) => return Err(e.into()),
            };
            if read == 0 {
                return if self.partial.is_empty() {
                    Ok(None)
                } else {
                    Err(ClientError::Closed)
                };
            }
            self.end = read;
        }
    }
}

/// The line's bytes without a trailing `\r`, as UTF-8.
fn to_line(bytes: &[u8]) -> Result<String, ClientError> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ClientError::NotUtf8)
}
