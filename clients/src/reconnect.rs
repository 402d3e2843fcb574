//! Connecting with exponential backoff ([`Client::connect_with_retry`]) until
//! the tools' shutdown signal fires, for clients that must survive a broker
//! restart or a dropped connection.
//!
//! Failures that waiting cannot fix (unreadable certificate files, a broker that
//! rejects our certificate or does not know our CN) end the attempts at once;
//! the others (connection refused, reset, the broker's connection limit) are
//! retried.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::client::{Client, ClientConfig, ConnectError};
use crate::shutdown::Shutdown;

/// How [`dial_client`] ended.
pub(crate) enum DialedClient {
    /// Connected and greeted.
    Connected(Client),
    /// The shutdown signal fired first.
    Stopped,
}

/// [`Client::connect_with_retry`], given up when the shutdown signal fires:
/// connects with `config`, retrying transient failures with `backoff` up to
/// `max_attempts` in a row (0 = never give up).
pub(crate) async fn dial_client(
    config: &ClientConfig,
    backoff: Backoff,
    max_attempts: u32,
    shutdown: &mut Shutdown<'_>,
) -> Result<DialedClient, ConnectError> {
    if shutdown.fired() {
        return Ok(DialedClient::Stopped);
    }
    tokio::select! {
        r = Client::connect_with_retry(config.clone(), backoff, max_attempts) => r.map(DialedClient::Connected),
        () = shutdown.wait() => Ok(DialedClient::Stopped),
    }
}

/// How long to wait for the reply to `quit` before just closing.
pub(crate) const QUIT_WAIT: Duration = Duration::from_secs(2);
