//! Connecting with exponential backoff, for clients that must survive a broker
//! restart or a dropped connection.
//!
//! Failures that waiting cannot fix (unreadable certificate files, a broker that
//! rejects our certificate or does not know our CN) end the attempts at once;
//! the others (connection refused, reset, the broker's connection limit) are
//! retried.

use std::time::Duration;

use tokio_rustls::TlsConnector;

use crate::backoff::Backoff;
use crate::client::{Client, ClientConfig, ConnectError};
use crate::connection::{ClientError, Connection};
use crate::shutdown::Shutdown;
use rustls::pki_types::ServerName;

/// Where and how to connect, and how long to keep trying.
pub(crate) struct Dialer {
    /// `host:port`.
    pub(crate) addr: String,
    /// TLS configuration loaded once.
    pub(crate) connector: TlsConnector,
    /// SNI and the name checked in the broker's certificate.
    pub(crate) server_name: ServerName<'static>,
    /// Delay between attempts.
    pub(crate) backoff: Backoff,
    /// Failed attempts in a row before giving up; 0 = never.
    pub(crate) max_attempts: u32,
}

/// The outcome of [`Dialer::connect`].
pub(crate) enum Dialed {
    /// Connected and greeted (boxed: a connection carries its TLS state and
    /// buffers, and this enum is moved around).
    Connected(Box<Connection>),
    /// The shutdown signal fired first.
    Stopped,
}

impl Dialer {
    /// Connects, retrying with backoff. `Err` carries the last error once retrying
    /// is pointless or `max_attempts` failed in a row.
    pub(crate) async fn connect(&self, shutdown: &mut Shutdown<'_>) -> Result<Dialed, ClientError> {
        let mut failures = 0u32;
        loop {
            if shutdown.fired() {
                return Ok(Dialed::Stopped);
            }
            let attempt = tokio::select! {
                r = Connection::connect_with(&self.addr, &self.connector, self.server_name.clone()) => r,
                () = shutdown.wait() => return Ok(Dialed::Stopped),
            };
            let error = match attempt {
                Ok(conn) => return Ok(Dialed::Connected(Box::new(conn))),
                Err(e) if !is_transient(&e) => return Err(e),
                Err(e) => e,
            };
            failures += 1;
            if self.max_attempts != 0 && failures >= self.max_attempts {
                return Err(error);
            }
            let delay = self.backoff.delay(failures);
            tracing::warn!(
                addr = %self.addr,
                %error,
                retry_in_ms = delay.as_millis() as u64,
                "cannot connect to the broker"
            );
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.wait() => return Ok(Dialed::Stopped),
            }
        }
    }
}

/// How [`dial_client`] ended.
pub(crate) enum DialedClient {
    /// Connected and greeted.
    Connected(Client),
    /// The shutdown signal fired first.
    Stopped,
}

/// [`Dialer::connect`] for a [`Client`]: connects with `config`, retrying
/// transient failures with `backoff` up to `max_attempts` in a row (0 = never
/// give up).
pub(crate) async fn dial_client(
    config: &ClientConfig,
    backoff: Backoff,
    max_attempts: u32,
    shutdown: &mut Shutdown<'_>,
) -> Result<DialedClient, ConnectError> {
    let mut failures = 0u32;
    loop {
        if shutdown.fired() {
            return Ok(DialedClient::Stopped);
        }
        let attempt = tokio::select! {
            r = Client::connect(config.clone()) => r,
            () = shutdown.wait() => return Ok(DialedClient::Stopped),
        };
        let error = match attempt {
            Ok(client) => return Ok(DialedClient::Connected(client)),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => e,
        };
        failures += 1;
        if max_attempts != 0 && failures >= max_attempts {
            return Err(error);
        }
        let delay = backoff.delay(failures);
        tracing::warn!(
            addr = %config.address(),
            %error,
            retry_in_ms = delay.as_millis() as u64,
            "cannot connect to the broker"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.wait() => return Ok(DialedClient::Stopped),
        }
    }
}

/// Whether waiting may fix `e`.
fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Connect { .. } | ClientError::Io(_) | ClientError::Closed => true,
        ClientError::Refused(line) => line.contains("connection limit"),
        _ => false,
    }
}

/// How long to wait for the reply to `quit` before just closing.
pub(crate) const QUIT_WAIT: Duration = Duration::from_secs(2);
