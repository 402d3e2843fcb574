//! The operator's connections to a running broker, both with the operator's
//! certificate: the admin endpoint over HTTPS ([`AdminEndpoint`]: status,
//! queues, metrics, reload) and the broker port over `ciphermq/1`
//! ([`BrokerPort`]: the commands that change things, such as
//! `close_connection`). One connection per request: an operator's tool
//! asks a few questions, not thousands.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How long one request may take, connection and handshake included,
/// unless its caller allows more ([`BrokerPort::command_within`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read (a `/metrics` text of many queues stays far below).
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Longest reply line read from the broker port.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Why the operator's identity or the broker's address cannot be used;
/// each names the file or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// A certificate or key file could not be read or holds no usable PEM.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not make a client identity (a key that
    /// does not match its certificate, an unsupported key type).
    #[error("client certificate {cert} with key {key}: {reason}")]
    Identity {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
        /// What rustls said.
        reason: String,
    },
    /// The name the broker's certificate must carry is not a DNS name or IP.
    #[error("server name {0:?}: not a DNS name or IP address")]
    ServerName(String),
}

/// Why a request to the broker got no answer. Each names the address
/// asked, so a tool can print it as it is, and tells a connection that
/// nothing accepted ([`RemoteError::is_refused`]: nothing listens there)
/// from the failures past it, for the hints only the tool can give.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The TCP connection failed (refused, unreachable, a bad address).
    #[error("{side} {address}: cannot connect: {source}")]
    Connect {
        /// `admin endpoint` or `broker`.
        side: &'static str,
        /// The address connected to.
        address: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Connected, but no answer came: the TLS handshake, the request or the
    /// reply failed, or the broker refused the connection with its one line.
    #[error("{side} {address}: {reason}")]
    Exchange {
        /// `admin endpoint` or `broker`.
        side: &'static str,
        /// The address connected to.
        address: String,
        /// What failed.
        reason: String,
    },
    /// No answer within the time allowed ([`REQUEST_TIMEOUT`] unless the
    /// caller allowed more).
    #[error("{side} {address}: no answer within {} s", after.as_secs())]
    Timeout {
        /// `admin endpoint` or `broker`.
        side: &'static str,
        /// The address connected to.
        address: String,
        /// How long it waited.
        after: Duration,
    },
}

impl RemoteError {
    /// Whether the connection was refused: nothing listens at the address
    /// (a broker not running, or not serving that port).
    pub fn is_refused(&self) -> bool {
        matches!(self, RemoteError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// Whether no answer came in time: the request may still have been
    /// carried out (a `move` that ends after the tool stopped waiting).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RemoteError::Timeout { .. })
    }
}

/// Why one exchange failed, before it is told which side it was on.
enum Failure {
    /// The TCP connection failed.
    Connect(std::io::Error),
    /// Anything after it.
    Exchange(String),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Exchange(reason)
    }
}

/// Runs `exchange` for at most `within`; errors name `side` and `address`.
async fn timed<T>(
    side: &'static str,
    address: &str,
    within: Duration,
    exchange: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, RemoteError> {
    match tokio::time::timeout(within, exchange).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(Failure::Connect(source))) => Err(RemoteError::Connect {
            side,
            address: address.to_owned(),
            source,
        }),
        Ok(Err(Failure::Exchange(reason))) => Err(RemoteError::Exchange {
            side,
            address: address.to_owned(),
            reason,
        }),
        Err(_) => Err(RemoteError::Timeout {
            side,
            address: address.to_owned(),
            after: within,
        }),
    }
}

/// The operator's TLS identity and the CA the broker's certificate must
/// chain to.
#[derive(Debug, Clone)]
pub struct Credentials {
    tls: Arc<rustls::ClientConfig>,
}

impl Credentials {
    /// The client certificate `cert` with its `key`, trusting the CA in `ca`.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Credentials, CredentialsError> {
        let mut roots = rustls::RootCertStore::empty();
        for ca_cert in read_certs(ca)? {
            roots.add(ca_cert).map_err(|e| CredentialsError::Pem {
                path: ca.display().to_string(),
                reason: format!("not a usable CA certificate: {e}"),
            })?;
        }
        let chain = read_certs(cert)?;
        let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| CredentialsError::Pem {
            path: key.display().to_string(),
            reason: format!("no private key read: {e}"),
        })?;
        let tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private_key)
            .map_err(|e| CredentialsError::Identity {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Credentials { tls: Arc::new(tls) })
    }

    /// A TLS connection to `address` whose certificate names `server_name`.
    async fn connect(
        &self,
        address: &str,
        server_name: &ServerName<'static>,
    ) -> Result<TlsStream<TcpStream>, Failure> {
        let tcp = TcpStream::connect(address)
            .await
            .map_err(Failure::Connect)?;
        TlsConnector::from(self.tls.clone())
            .connect(server_name.clone(), tcp)
            .await
            .map_err(|e| Failure::Exchange(format!("TLS handshake failed: {e}")))
    }
}

/// Every certificate in the PEM file at `path`, at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CredentialsError> {
    let err = |reason: String| CredentialsError::Pem {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(format!("cannot read: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(err("holds no certificate".to_owned()));
    }
    Ok(certs)
}

/// `name` as the name a certificate must carry, checked.
fn checked_name(name: &str) -> Result<ServerName<'static>, CredentialsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| CredentialsError::ServerName(name.to_owned()))
}

/// The host part of `host:port` (without an IPv6 address's brackets): the
/// name a broker's certificate is checked against by default.
pub fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The admin endpoint (`admin.address`).
#[derive(Debug, Clone)]
pub struct AdminEndpoint {
    address: String,
    server_name: ServerName<'static>,
    credentials: Credentials,
}

impl AdminEndpoint {
    /// The endpoint at `address` (`host:port`) whose certificate names
    /// `server_name`.
    pub fn new(
        address: &str,
        server_name: &str,
        credentials: Credentials,
    ) -> Result<AdminEndpoint, CredentialsError> {
        Ok(AdminEndpoint {
            address: address.to_owned(),
            server_name: checked_name(server_name)?,
            credentials,
        })
    }

    /// Where it is.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `method path`, with the whole answer; `Err` says why there is none
    /// (connection, handshake, timeout), not an HTTP error status.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
    ) -> Result<Response<Full<Bytes>>, RemoteError> {
        timed(
            "admin endpoint",
            &self.address,
            REQUEST_TIMEOUT,
            self.exchange(method, path),
        )
        .await
    }

    async fn exchange(&self, method: Method, path: &str) -> Result<Response<Full<Bytes>>, Failure> {
        let tls = self
            .credentials
            .connect(&self.address, &self.server_name)
            .await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake failed: {e}"))?;
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, &self.address);
        if !method.is_safe() {
            // What the endpoint asks of a request that changes the broker,
            // so that no other web site can make a browser send one.
            request = request.header(crate::CHANGE_HEADER, crate::CHANGE_HEADER_VALUE);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status();
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("answer not read: {e}"))?
            .to_bytes();
        let mut answer = Response::new(Full::new(body));
        *answer.status_mut() = status;
        if let Some(content_type) = content_type {
            answer.headers_mut().insert(CONTENT_TYPE, content_type);
        }
        answer
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(answer)
    }
}

/// The broker's client port (`server.address`), spoken to in `ciphermq/1`.
#[derive(Debug, Clone)]
pub struct BrokerPort {
    address: String,
    server_name: ServerName<'static>,
    credentials: Credentials,
}

impl BrokerPort {
    /// The broker at `address` (`host:port`) whose certificate names
    /// `server_name`.
    pub fn new(
        address: &str,
        server_name: &str,
        credentials: Credentials,
    ) -> Result<BrokerPort, CredentialsError> {
        Ok(BrokerPort {
            address: address.to_owned(),
            server_name: checked_name(server_name)?,
            credentials,
        })
    }

    /// Sends one command line and returns its one reply line; the
    /// connection says `quit` after it. `Err` when there is no reply (or the
    /// broker refused the connection: its one line says why), and, without
    /// connecting, when `line` holds a line break: that would be two
    /// commands. [`crate::command_line::CommandLine`] builds lines whose
    /// arguments are checked. The reply must come within
    /// [`REQUEST_TIMEOUT`].
    pub async fn command(&self, line: &str) -> Result<String, RemoteError> {
        self.command_within(line, REQUEST_TIMEOUT).await
    }

    /// [`BrokerPort::command`] for a command the broker answers only once
    /// its work is done (`move`, up to about 35 s), allowed `within`
    /// instead of [`REQUEST_TIMEOUT`]
    /// ([`crate::command_line::CommandLine::reply_within`]).
    pub async fn command_within(
        &self,
        line: &str,
        within: Duration,
    ) -> Result<String, RemoteError> {
        if line.contains(['\n', '\r']) {
            return Err(RemoteError::Exchange {
                side: "broker",
                address: self.address.clone(),
                reason: format!(
                    "not sent: {:?} holds a line break, which would make it two commands",
                    line
                ),
            });
        }
        timed("broker", &self.address, within, self.exchange(line)).await
    }

    async fn exchange(&self, line: &str) -> Result<String, Failure> {
        let tls = self
            .credentials
            .connect(&self.address, &self.server_name)
            .await?;
        let mut io = BufReader::new(tls);
        let hello = read_line(&mut io).await?;
        if !hello.starts_with("HELLO ") {
            return Err(Failure::Exchange(format!("refused: {hello}")));
        }
        io.get_mut()
            .write_all(format!("{line}\nquit\n").as_bytes())
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        io.get_mut()
            .flush()
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        Ok(read_line(&mut io).await?)
    }
}

/// One line (without its newline), bounded.
async fn read_line(io: &mut BufReader<TlsStream<TcpStream>>) -> Result<String, String> {
    let mut line = Vec::new();
    let mut limited = (&mut *io).take(MAX_LINE_BYTES as u64);
    let n = limited
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("cannot read: {e}"))?;
    if n == 0 {
        return Err("closed the connection".to_owned());
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| "answered a line that is not UTF-8".to_owned())
}
