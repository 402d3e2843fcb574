//! The operator's connections to a running broker, both with the operator's
//! certificate: the admin endpoint over HTTPS ([`AdminEndpoint`]: status,
//! queues, metrics, reload) and the broker port over `ciphermq/1`
//! ([`BrokerPort`]: the commands that change things, such as
//! `close_connection`). One connection per request: an operator's tool
//! asks a few questions, not thousands.
//!
//! Either side may be given several addresses ([`Addresses`]: the nodes of
//! a cluster, any of which answers). A request goes to the first that
//! accepts the connection (TCP and the TLS handshake); one that cannot be
//! reached is skipped. Once a request was sent its outcome is final, an
//! error included: it is never sent to a second address, so a `move` or a
//! `purge` cannot run twice.

use std::fmt;
use std::future::Future;
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
use tokio::time::Instant;
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
    /// Several addresses were given and none could be reached, so nothing
    /// was sent; each failure in the order tried. (With one address, its
    /// failure is returned as it is.)
    #[error("{side}: none of the {} addresses could be reached:{}", failures.len(), each(failures))]
    Unreached {
        /// `admin endpoint` or `broker`.
        side: &'static str,
        /// Why each address failed, each naming its address.
        failures: Vec<RemoteError>,
    },
}

/// The failures of [`RemoteError::Unreached`], one indented line each.
fn each(failures: &[RemoteError]) -> String {
    failures.iter().map(|e| format!("\n  {e}")).collect()
}

impl RemoteError {
    /// Whether the connection was refused: nothing listens at the address
    /// (a broker not running, or not serving that port); with several
    /// addresses, at none of them.
    pub fn is_refused(&self) -> bool {
        match self {
            RemoteError::Connect { source, .. } => {
                source.kind() == std::io::ErrorKind::ConnectionRefused
            }
            RemoteError::Unreached { failures, .. } => {
                !failures.is_empty() && failures.iter().all(RemoteError::is_refused)
            }
            _ => false,
        }
    }

    /// Whether no answer came in time: the request may still have been
    /// carried out (a `move` that ends after the tool stopped waiting).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RemoteError::Timeout { .. })
    }

    /// Whether several addresses were tried and none reached: nothing was
    /// sent, and the next request would most likely fare no better.
    pub fn is_unreached(&self) -> bool {
        matches!(self, RemoteError::Unreached { .. })
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

/// Runs `exchange` until `deadline`, the end of the `within` one request
/// is allowed (`None`: too far away to count); errors name `side` and
/// `address`.
async fn timed<T>(
    side: &'static str,
    address: &str,
    deadline: Option<Instant>,
    within: Duration,
    exchange: impl Future<Output = Result<T, Failure>>,
) -> Result<T, RemoteError> {
    let outcome = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, exchange).await,
        None => Ok(exchange.await),
    };
    match outcome {
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

    /// A TLS connection to `seed`, whose certificate must name its server
    /// name.
    async fn connect(&self, seed: &Seed) -> Result<TlsStream<TcpStream>, Failure> {
        let tcp = TcpStream::connect(&seed.address)
            .await
            .map_err(Failure::Connect)?;
        TlsConnector::from(self.tls.clone())
            .connect(seed.server_name.clone(), tcp)
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

/// Why a list of addresses (`--endpoint`, `--broker`) is refused; it is
/// checked before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressesError {
    /// Nothing at all, or only spaces.
    #[error("no address given: expected host:port, or several separated by commas")]
    Missing,
    /// An item of the list is empty or only spaces.
    #[error(
        "address {position} of {count} is empty: separate host:port addresses with one comma \
         each, none at either end"
    )]
    EmptyItem {
        /// Its place in the list, from 1.
        position: usize,
        /// How many items the list has.
        count: usize,
    },
    /// An address holds whitespace inside it: most likely two addresses
    /// separated by a space instead of a comma.
    #[error("address {0:?} holds whitespace: separate host:port addresses with commas")]
    Whitespace(String),
}

/// The addresses one side may be reached at, in the order they are tried:
/// one `host:port`, or several separated by commas
/// (`127.0.0.1:5700,127.0.0.1:5701`, spaces around each ignored), such as
/// the nodes of a cluster, any of which answers. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses(Vec<String>);

impl Addresses {
    /// Reads a comma-separated list; `Err` for an empty list, an empty
    /// item or whitespace inside an address.
    pub fn parse(text: &str) -> Result<Addresses, AddressesError> {
        if text.trim().is_empty() {
            return Err(AddressesError::Missing);
        }
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        let count = items.len();
        let mut list = Vec::with_capacity(count);
        for (i, item) in items.into_iter().enumerate() {
            if item.is_empty() {
                return Err(AddressesError::EmptyItem {
                    position: i + 1,
                    count,
                });
            }
            if item.contains(char::is_whitespace) {
                return Err(AddressesError::Whitespace(item.to_owned()));
            }
            list.push(item.to_owned());
        }
        Ok(Addresses(list))
    }

    /// One address, as given (a config file's, or a default).
    pub fn one(address: &str) -> Addresses {
        Addresses(vec![address.to_owned()])
    }

    /// The addresses, in the order tried.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl std::str::FromStr for Addresses {
    type Err = AddressesError;

    fn from_str(text: &str) -> Result<Addresses, AddressesError> {
        Addresses::parse(text)
    }
}

impl fmt::Display for Addresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// One address to try, with the name its certificate must carry.
#[derive(Debug, Clone)]
struct Seed {
    address: String,
    server_name: ServerName<'static>,
}

/// The addresses of one side, in the order tried.
#[derive(Debug, Clone)]
struct Seeds {
    /// `admin endpoint` or `broker`, for errors.
    side: &'static str,
    /// At least one.
    list: Vec<Seed>,
    /// The addresses as one would give them, for messages.
    shown: String,
}

impl Seeds {
    /// `addresses`, each checked against `server_name`, or against its own
    /// host when none is given.
    fn new(
        side: &'static str,
        addresses: &Addresses,
        server_name: Option<&str>,
    ) -> Result<Seeds, CredentialsError> {
        let list = addresses
            .as_slice()
            .iter()
            .map(|address| {
                Ok(Seed {
                    address: address.clone(),
                    server_name: checked_name(server_name.unwrap_or_else(|| host_of(address)))?,
                })
            })
            .collect::<Result<Vec<_>, CredentialsError>>()?;
        Ok(Seeds {
            side,
            list,
            shown: addresses.to_string(),
        })
    }

    /// Just `seed`.
    fn only(side: &'static str, seed: &Seed) -> Seeds {
        Seeds {
            side,
            list: vec![seed.clone()],
            shown: seed.address.clone(),
        }
    }

    /// Runs `exchange` once, on a TLS connection to the first seed that
    /// can be reached; each attempt is allowed `within` from its start,
    /// connecting included, as a lone address always was.
    async fn request<'a, T, F>(
        &'a self,
        credentials: &'a Credentials,
        within: Duration,
        exchange: impl FnOnce(&'a Seed, TlsStream<TcpStream>) -> F,
    ) -> Result<T, RemoteError>
    where
        F: Future<Output = Result<T, Failure>>,
    {
        let side = self.side;
        first_reached(
            side,
            &self.list,
            |seed| async move {
                // `None`: a time too far away to count, so no limit.
                let deadline = Instant::now().checked_add(within);
                let tls = timed(
                    side,
                    &seed.address,
                    deadline,
                    within,
                    credentials.connect(seed),
                )
                .await?;
                Ok((seed, tls, deadline))
            },
            |(seed, tls, deadline)| async move {
                timed(side, &seed.address, deadline, within, exchange(seed, tls)).await
            },
        )
        .await
    }
}

/// Connects to the first of `seeds` that `connect` reaches, in order, and
/// runs `exchange` on that connection. A seed `connect` fails on (refused,
/// timed out, TLS handshake failed) is skipped: nothing was sent to it.
/// `exchange` runs at most once, whatever it returns: a request that was
/// sent is never sent again elsewhere, so a command cannot run twice.
/// `Err`: what `exchange` returned; or, when no seed was reached, a lone
/// seed's failure as it is, else [`RemoteError::Unreached`] with each.
async fn first_reached<'a, S, C, T, CF, XF>(
    side: &'static str,
    seeds: &'a [S],
    mut connect: impl FnMut(&'a S) -> CF,
    exchange: impl FnOnce(C) -> XF,
) -> Result<T, RemoteError>
where
    CF: Future<Output = Result<C, RemoteError>>,
    XF: Future<Output = Result<T, RemoteError>>,
{
    let mut failures = Vec::new();
    for seed in seeds {
        match connect(seed).await {
            Ok(connection) => return exchange(connection).await,
            Err(e) => failures.push(e),
        }
    }
    if failures.len() == 1 {
        if let Some(only) = failures.pop() {
            return Err(only);
        }
    }
    Err(RemoteError::Unreached { side, failures })
}

/// The admin endpoint (`admin.address`), at one address or at the first
/// of several that can be reached.
#[derive(Debug, Clone)]
pub struct AdminEndpoint {
    seeds: Seeds,
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
        AdminEndpoint::any_of(&Addresses::one(address), Some(server_name), credentials)
    }

    /// The endpoint at the first of `addresses` that can be reached, for
    /// each request; its certificate names `server_name`, or by default
    /// the host of the address connected to.
    pub fn any_of(
        addresses: &Addresses,
        server_name: Option<&str>,
        credentials: Credentials,
    ) -> Result<AdminEndpoint, CredentialsError> {
        Ok(AdminEndpoint {
            seeds: Seeds::new("admin endpoint", addresses, server_name)?,
            credentials,
        })
    }

    /// Where it is: its address, or its addresses separated by commas.
    pub fn address(&self) -> &str {
        &self.seeds.shown
    }

    /// `method path`, with the whole answer; `Err` says why there is none
    /// (connection, handshake, timeout), not an HTTP error status.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
    ) -> Result<Response<Full<Bytes>>, RemoteError> {
        self.request_at(method, path)
            .await
            .map(|(_, response)| response)
    }

    /// `GET path` (a route that changes nothing, such as `/health`), and
    /// this endpoint narrowed to the address that answered it, whatever
    /// the answer: so that a long-lived reader (the dashboard proxy) keeps
    /// reading one node rather than whichever answers each time.
    pub async fn reachable(&self, path: &str) -> Result<AdminEndpoint, RemoteError> {
        let (seed, _) = self.request_at(Method::GET, path).await?;
        Ok(AdminEndpoint {
            seeds: Seeds::only(self.seeds.side, seed),
            credentials: self.credentials.clone(),
        })
    }

    /// `method path` and the seed that answered it.
    async fn request_at(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(&Seed, Response<Full<Bytes>>), RemoteError> {
        self.seeds
            .request(&self.credentials, REQUEST_TIMEOUT, |seed, tls| async move {
                Ok((seed, exchange_http(tls, &seed.address, method, path).await?))
            })
            .await
    }
}

/// `method path` over `tls` to the endpoint at `address`, with the whole
/// answer.
async fn exchange_http(
    tls: TlsStream<TcpStream>,
    address: &str,
    method: Method,
    path: &str,
) -> Result<Response<Full<Bytes>>, Failure> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(HOST, address);
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

/// The broker's client port (`server.address`), spoken to in `ciphermq/1`,
/// at one address or at the first of several that can be reached.
#[derive(Debug, Clone)]
pub struct BrokerPort {
    seeds: Seeds,
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
        BrokerPort::any_of(&Addresses::one(address), Some(server_name), credentials)
    }

    /// The broker at the first of `addresses` that can be reached, for
    /// each command; its certificate names `server_name`, or by default
    /// the host of the address connected to.
    pub fn any_of(
        addresses: &Addresses,
        server_name: Option<&str>,
        credentials: Credentials,
    ) -> Result<BrokerPort, CredentialsError> {
        Ok(BrokerPort {
            seeds: Seeds::new("broker", addresses, server_name)?,
            credentials,
        })
    }

    /// Sends one command line and returns its one reply line; the
    /// connection says `quit` after it. `Err` when there is no reply (or the
    /// broker refused the connection: its one line says why), and, without
    /// connecting, when `line` holds a line break: that would be two
    /// commands. [`crate::command_line::CommandLine`] builds lines whose
    /// arguments are checked. The reply must come within
    /// [`REQUEST_TIMEOUT`]. With several addresses, the line goes to the
    /// first that can be reached, and only to it.
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
                address: self.seeds.shown.clone(),
                reason: format!(
                    "not sent: {:?} holds a line break, which would make it two commands",
                    line
                ),
            });
        }
        self.seeds
            .request(&self.credentials, within, |_, tls| exchange_line(tls, line))
            .await
    }
}

/// `line` over `tls` once the broker said hello, and its reply line.
async fn exchange_line(tls: TlsStream<TcpStream>, line: &str) -> Result<String, Failure> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn list(text: &str) -> Vec<String> {
        Addresses::parse(text).expect("a list").as_slice().to_vec()
    }

    #[test]
    fn one_or_several_addresses_are_read_in_order() {
        assert_eq!(list("127.0.0.1:5700"), ["127.0.0.1:5700"]);
        assert_eq!(
            list("127.0.0.1:5700,127.0.0.1:5701,[::1]:5702"),
            ["127.0.0.1:5700", "127.0.0.1:5701", "[::1]:5702"]
        );
        // Spaces around an address are the operator's layout, not part of it.
        assert_eq!(
            list(" node-a:5700 ,\tnode-b:5700 "),
            ["node-a:5700", "node-b:5700"]
        );
        let several = Addresses::parse("a:1, b:2").unwrap();
        assert_eq!(several.to_string(), "a:1,b:2");
        assert_eq!("a:1".parse::<Addresses>().unwrap(), Addresses::one("a:1"));
    }

    #[test]
    fn an_empty_list_item_or_a_space_inside_an_address_is_refused() {
        let refused = |text: &str| Addresses::parse(text).unwrap_err();
        assert_eq!(refused(""), AddressesError::Missing);
        assert_eq!(refused(" \t "), AddressesError::Missing);
        assert_eq!(
            refused("a:1,,b:2"),
            AddressesError::EmptyItem {
                position: 2,
                count: 3
            }
        );
        assert_eq!(
            refused(",a:1"),
            AddressesError::EmptyItem {
                position: 1,
                count: 2
            }
        );
        assert_eq!(
            refused("a:1,  "),
            AddressesError::EmptyItem {
                position: 2,
                count: 2
            }
        );
        assert_eq!(
            refused(","),
            AddressesError::EmptyItem {
                position: 1,
                count: 2
            }
        );
        assert_eq!(
            refused("a:1 b:2"),
            AddressesError::Whitespace("a:1 b:2".to_owned())
        );
        let message = refused("a:1,,b:2").to_string();
        assert!(
            message.contains("address 2 of 3 is empty") && message.contains("comma"),
            "{message}"
        );
        assert!(refused("").to_string().contains("no address given"));
    }

    #[test]
    fn each_address_is_checked_against_its_own_host_unless_a_name_is_given() {
        let addresses = Addresses::parse("localhost:5700,127.0.0.1:5701,[::1]:5702").unwrap();
        let names = |seeds: &Seeds| -> Vec<String> {
            seeds
                .list
                .iter()
                .map(|s| s.server_name.to_str().into_owned())
                .collect()
        };
        let own = Seeds::new("broker", &addresses, None).unwrap();
        assert_eq!(names(&own), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(own.shown, "localhost:5700,127.0.0.1:5701,[::1]:5702");
        let given = Seeds::new("broker", &addresses, Some("broker.example")).unwrap();
        assert_eq!(names(&given), ["broker.example"; 3]);
    }

    fn refused(address: &str) -> RemoteError {
        RemoteError::Connect {
            side: "broker",
            address: address.to_owned(),
            source: std::io::Error::from(ErrorKind::ConnectionRefused),
        }
    }

    fn handshake_failed(address: &str) -> RemoteError {
        RemoteError::Exchange {
            side: "broker",
            address: address.to_owned(),
            reason: "TLS handshake failed: unexpected EOF".to_owned(),
        }
    }

    fn timed_out(address: &str) -> RemoteError {
        RemoteError::Timeout {
            side: "broker",
            address: address.to_owned(),
            after: REQUEST_TIMEOUT,
        }
    }

    /// [`first_reached`] over `seeds`, where `connect` says how connecting
    /// to each ends and `answer` what the one exchange returns; with the
    /// seeds connected to, in order, and the seed the request went to.
    async fn run(
        seeds: &[&'static str],
        connect: fn(&str) -> Result<(), RemoteError>,
        answer: Result<&'static str, RemoteError>,
    ) -> (
        Result<&'static str, RemoteError>,
        Vec<&'static str>,
        Option<&'static str>,
    ) {
        let mut tried = Vec::new();
        let mut sent_to = None;
        let outcome = first_reached(
            "broker",
            seeds,
            |seed| {
                tried.push(*seed);
                std::future::ready(connect(seed).map(|()| *seed))
            },
            |seed| {
                sent_to = Some(seed);
                std::future::ready(answer)
            },
        )
        .await;
        (outcome, tried, sent_to)
    }

    #[tokio::test]
    async fn a_request_goes_to_the_first_address_that_connects() {
        let (outcome, tried, sent_to) = run(
            &["a:1", "b:2", "c:3"],
            |seed| match seed {
                "a:1" => Err(refused(seed)),
                _ => Ok(()),
            },
            Ok("OK purge_queue q 3"),
        )
        .await;
        assert_eq!(outcome.unwrap(), "OK purge_queue q 3");
        assert_eq!(tried, ["a:1", "b:2"]);
        assert_eq!(sent_to, Some("b:2"));

        // A timeout or a failed handshake is no more an answer than a
        // refusal: nothing was sent.
        let (outcome, tried, sent_to) = run(
            &["a:1", "b:2", "c:3"],
            |seed| match seed {
                "a:1" => Err(timed_out(seed)),
                "b:2" => Err(handshake_failed(seed)),
                _ => Ok(()),
            },
            Ok("OK"),
        )
        .await;
        assert_eq!(outcome.unwrap(), "OK");
        assert_eq!(tried, ["a:1", "b:2", "c:3"]);
        assert_eq!(sent_to, Some("c:3"));
    }

    #[tokio::test]
    async fn when_no_address_connects_the_error_names_each_and_why() {
        let (outcome, tried, sent_to) = run(
            &["a:1", "b:2", "c:3"],
            |seed| match seed {
                "a:1" => Err(refused(seed)),
                "b:2" => Err(handshake_failed(seed)),
                _ => Err(timed_out(seed)),
            },
            Ok("never"),
        )
        .await;
        assert_eq!(tried, ["a:1", "b:2", "c:3"]);
        assert_eq!(sent_to, None);
        let e = outcome.unwrap_err();
        assert!(e.is_unreached() && !e.is_refused() && !e.is_timeout());
        let message = e.to_string();
        assert!(
            message.starts_with("broker: none of the 3 addresses could be reached:\n"),
            "{message}"
        );
        let lines: Vec<&str> = message.lines().skip(1).collect();
        assert_eq!(lines.len(), 3, "{message}");
        assert!(
            lines[0].starts_with("  broker a:1: cannot connect: "),
            "{message}"
        );
        assert_eq!(
            lines[1],
            "  broker b:2: TLS handshake failed: unexpected EOF"
        );
        assert_eq!(lines[2], "  broker c:3: no answer within 10 s");

        // Nothing listens anywhere: refused, for the hint.
        let (outcome, _, _) = run(&["a:1", "b:2"], |seed| Err(refused(seed)), Ok("never")).await;
        let e = outcome.unwrap_err();
        assert!(e.is_refused() && e.is_unreached(), "{e}");
    }

    #[tokio::test]
    async fn a_lone_address_fails_as_it_always_did() {
        let (outcome, tried, _) = run(&["a:1"], |seed| Err(refused(seed)), Ok("never")).await;
        assert_eq!(tried, ["a:1"]);
        let e = outcome.unwrap_err();
        assert!(e.is_refused() && !e.is_unreached(), "{e}");
        assert!(
            e.to_string().starts_with("broker a:1: cannot connect: "),
            "{e}"
        );
        let (outcome, _, _) = run(&["a:1"], |seed| Err(timed_out(seed)), Ok("never")).await;
        let e = outcome.unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert_eq!(e.to_string(), "broker a:1: no answer within 10 s");
    }

    #[tokio::test]
    async fn a_request_that_reached_an_address_is_never_sent_to_another() {
        // The broker answered with an error line: that is its answer.
        let (outcome, tried, sent_to) =
            run(&["a:1", "b:2"], |_| Ok(()), Ok("Error: unknown queue q")).await;
        assert_eq!(outcome.unwrap(), "Error: unknown queue q");
        assert_eq!((tried, sent_to), (vec!["a:1"], Some("a:1")));

        // The reply was lost, or did not come in time: the command may have
        // run there, so it is not tried elsewhere.
        for lost in [
            RemoteError::Exchange {
                side: "broker",
                address: "b:2".to_owned(),
                reason: "closed the connection".to_owned(),
            },
            timed_out("b:2"),
        ] {
            let shown = lost.to_string();
            let (outcome, tried, sent_to) = run(
                &["a:1", "b:2", "c:3"],
                |seed| match seed {
                    "a:1" => Err(refused(seed)),
                    _ => Ok(()),
                },
                Err(lost),
            )
            .await;
            assert_eq!(outcome.unwrap_err().to_string(), shown);
            assert_eq!((tried, sent_to), (vec!["a:1", "b:2"], Some("b:2")));
        }
    }
}
