//! Connecting for the tools: the first connection of a run fails fast
//! ([`dial_first`]: a mistyped address is reported at once, naming it, unless
//! the user asked to wait for a broker that is starting), later ones retry with
//! exponential backoff ([`Client::connect_with_retry`]) until the tools'
//! shutdown signal fires, so a run survives a broker restart or a dropped
//! connection.
//!
//! Failures that waiting cannot fix (unreadable certificate files, a broker that
//! rejects our certificate or does not know our CN) end the attempts at once;
//! the others (connection refused, reset, the broker's connection limit) are
//! retried.

use std::fmt;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::client::{Client, ClientConfig, ConnectError};
use crate::connection::ClientError;
use crate::shutdown::Shutdown;

/// How [`dial_client`] or [`dial_first`] ended.
pub(crate) enum DialedClient {
    /// Connected and greeted.
    Connected(Client),
    /// The shutdown signal fired first.
    Stopped,
}

/// The first connection of a run could not be made: no broker at that address
/// (yet), a TLS failure, or a refusal. One message names the address and the
/// cause, so a mistyped port is obvious at once.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot connect to the broker at {addr}{}: {}{}",
    Waited(*.waited),
    Cause(.error),
    Hint(.error, *.waited)
)]
pub struct FirstConnectError {
    /// The address as configured (`server_address`, `--address`).
    pub addr: String,
    /// How long the first connection was retried (zero unless asked to wait).
    pub waited: Duration,
    /// The last failure (in the message, not `source()`, so a chain is
    /// printed once).
    pub error: ConnectError,
}

/// ` after waiting N s`, when there was a wait.
struct Waited(Duration);

impl fmt::Display for Waited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            Ok(())
        } else {
            write!(f, " after waiting {:.0} s", self.0.as_secs_f64())
        }
    }
}

/// The failure without the address again (a TCP failure's own text names it).
struct Cause<'a>(&'a ConnectError);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            ConnectError::Transport(ClientError::Connect { error, .. }) => error.fmt(f),
            other => other.fmt(f),
        }
    }
}

/// What to try next, for a failure that waiting could fix, when there was no wait.
struct Hint<'a>(&'a ConnectError, Duration);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_transient() && self.1.is_zero() {
            f.write_str(
                " (is a broker listening there? --wait-for-broker SECS waits for one that is starting)",
            )
        } else {
            Ok(())
        }
    }
}

/// The first connection of a run: one attempt, and when it fails in a way that
/// waiting could fix (refused, unreachable, no greeting), more with `backoff`
/// until `wait` has passed (zero: fail at once). Gives up when the shutdown
/// signal fires.
pub(crate) async fn dial_first(
    config: &ClientConfig,
    backoff: Backoff,
    wait: Duration,
    shutdown: &mut Shutdown<'_>,
) -> Result<DialedClient, FirstConnectError> {
    let started = Instant::now();
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
            Err(error) => error,
        };
        let waited = started.elapsed();
        if !error.is_transient() || waited >= wait {
            return Err(FirstConnectError {
                addr: config.address().to_owned(),
                waited: if wait.is_zero() {
                    Duration::ZERO
                } else {
                    waited
                },
                error,
            });
        }
        failures = failures.saturating_add(1);
        let delay = backoff.delay(failures).min(wait - waited);
        tracing::warn!(
            addr = %config.address(),
            %error,
            retry_in_ms = delay.as_millis() as u64,
            wait_left_secs = (wait - waited).as_secs(),
            "no broker yet; waiting for it"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.wait() => return Ok(DialedClient::Stopped),
        }
    }
}

/// [`Client::connect_with_retry`], given up when the shutdown signal fires:
/// connects with `config`, retrying transient failures with `backoff` up to
/// `max_attempts` in a row (0 = never give up). For reconnects, after a first
/// connection succeeded.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(waited: Duration) -> FirstConnectError {
        FirstConnectError {
            addr: "127.0.0.1:1".to_owned(),
            waited,
            error: ConnectError::Transport(ClientError::Connect {
                addr: "127.0.0.1:1".to_owned(),
                error: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            }),
        }
    }

    #[test]
    fn the_message_names_the_address_once_and_says_how_to_wait() {
        let text = refused(Duration::ZERO).to_string();
        assert_eq!(text.matches("127.0.0.1:1").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot connect to the broker at 127.0.0.1:1: "),
            "{text}"
        );
        assert!(text.contains("--wait-for-broker"), "{text}");
        // Printed as a chain, nothing repeats.
        let chain = format!("{:#}", anyhow::Error::from(refused(Duration::ZERO)));
        assert_eq!(chain, text);
    }

    #[test]
    fn after_a_wait_it_says_how_long() {
        let text = refused(Duration::from_secs(30)).to_string();
        assert!(
            text.starts_with("cannot connect to the broker at 127.0.0.1:1 after waiting 30 s: "),
            "{text}"
        );
        assert!(!text.contains("--wait-for-broker"), "{text}");
    }

    #[test]
    fn a_tls_failure_is_named_and_not_offered_a_wait() {
        let e = FirstConnectError {
            addr: "broker:5700".to_owned(),
            waited: Duration::ZERO,
            error: ConnectError::Transport(ClientError::Tls(rustls::Error::General(
                "bad certificate".to_owned(),
            ))),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cannot connect to the broker at broker:5700: TLS error: "),
            "{text}"
        );
        assert!(!text.contains("--wait-for-broker"), "{text}");
    }
}
