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
/// cause, so a mistyped port is obvious at once; with several seeds, it names
/// each seed and why it failed.
#[derive(Debug)]
pub struct FirstConnectError {
    /// The address as configured (`server_address`, `--address`): one
    /// `host:port` or several, separated by commas.
    pub addr: String,
    /// How long the first connection was retried (zero unless asked to wait).
    pub waited: Duration,
    /// The last failure of each seed, in the order they were tried (one entry
    /// for a single address). In the message, not `source()`, so a chain is
    /// printed once.
    pub failures: Vec<SeedFailure>,
}

/// Why one seed of [`FirstConnectError`] could not be connected to.
#[derive(Debug)]
pub struct SeedFailure {
    /// The seed, `host:port`.
    pub addr: String,
    /// Its last failure.
    pub error: ConnectError,
}

impl std::error::Error for FirstConnectError {}

impl fmt::Display for FirstConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let transient = self.failures.iter().any(|s| s.error.is_transient());
        match self.failures.as_slice() {
            [one] => write!(
                f,
                "cannot connect to the broker at {}{}: {}",
                one.addr,
                Waited(self.waited),
                Cause(&one.error)
            )?,
            several => {
                write!(
                    f,
                    "cannot connect to the broker at any of {} seeds{}: ",
                    several.len(),
                    Waited(self.waited)
                )?;
                for (i, s) in several.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{}: {}", s.addr, Cause(&s.error))?;
                }
            }
        }
        write!(f, "{}", Hint(transient, self.waited))
    }
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

/// What to try next, for a failure that waiting could fix (`.0`), when there
/// was no wait.
struct Hint(bool, Duration);

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 && self.1.is_zero() {
            f.write_str(
                " (is a broker listening there? --wait-for-broker SECS waits for one that is starting)",
            )
        } else {
            Ok(())
        }
    }
}

/// Whether the first connection gives up after a round over every seed failed
/// (`round`: each seed's failure) with `waited` of `wait` gone: when no
/// failure is one that waiting could fix, or the wait is over.
fn give_up(round: &[SeedFailure], waited: Duration, wait: Duration) -> bool {
    !round.iter().any(|s| s.error.is_transient()) || waited >= wait
}

/// The first connection of a run: tries `seeds` in order (`host:port`, at
/// least one; `config`'s other settings for each) and keeps the first that
/// connects, making it `config`'s address. When every seed fails and one of
/// them in a way that waiting could fix (refused, unreachable, no greeting),
/// tries them all again after `backoff` until `wait` has passed (zero: fail at
/// once). Gives up when the shutdown signal fires.
pub(crate) async fn dial_first(
    config: &mut ClientConfig,
    seeds: &[String],
    backoff: Backoff,
    wait: Duration,
    shutdown: &mut Shutdown<'_>,
) -> Result<DialedClient, FirstConnectError> {
    let started = Instant::now();
    let configured = seeds.join(",");
    let mut failures = 0u32;
    loop {
        let mut round = Vec::with_capacity(seeds.len());
        for seed in seeds {
            if shutdown.fired() {
                return Ok(DialedClient::Stopped);
            }
            let there = config.for_address(seed.as_str());
            let attempt = tokio::select! {
                r = Client::connect(there.clone()) => r,
                () = shutdown.wait() => return Ok(DialedClient::Stopped),
            };
            match attempt {
                Ok(client) => {
                    *config = there;
                    return Ok(DialedClient::Connected(client));
                }
                Err(error) => {
                    if seeds.len() > 1 {
                        tracing::warn!(addr = %seed, %error, "cannot connect to this seed");
                    }
                    round.push(SeedFailure {
                        addr: seed.clone(),
                        error,
                    });
                }
            }
        }
        let waited = started.elapsed();
        if round.is_empty() || give_up(&round, waited, wait) {
            return Err(FirstConnectError {
                addr: configured,
                waited: if wait.is_zero() {
                    Duration::ZERO
                } else {
                    waited
                },
                failures: round,
            });
        }
        failures = failures.saturating_add(1);
        let delay = backoff.delay(failures).min(wait - waited);
        tracing::warn!(
            addr = %configured,
            error = %round[round.len() - 1].error,
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
    use std::sync::Arc;

    use super::*;

    fn refused_at(addr: &str) -> SeedFailure {
        SeedFailure {
            addr: addr.to_owned(),
            error: ConnectError::Transport(ClientError::Connect {
                addr: addr.to_owned(),
                error: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            }),
        }
    }

    fn denied_at(addr: &str) -> SeedFailure {
        SeedFailure {
            addr: addr.to_owned(),
            error: ConnectError::Denied("unknown CN".to_owned()),
        }
    }

    fn refused(waited: Duration) -> FirstConnectError {
        FirstConnectError {
            addr: "127.0.0.1:1".to_owned(),
            waited,
            failures: vec![refused_at("127.0.0.1:1")],
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
            failures: vec![SeedFailure {
                addr: "broker:5700".to_owned(),
                error: ConnectError::Transport(ClientError::Tls(rustls::Error::General(
                    "bad certificate".to_owned(),
                ))),
            }],
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cannot connect to the broker at broker:5700: TLS error: "),
            "{text}"
        );
        assert!(!text.contains("--wait-for-broker"), "{text}");
    }

    #[test]
    fn several_seeds_are_each_named_with_their_failure() {
        let e = FirstConnectError {
            addr: "a:1,b:2".to_owned(),
            waited: Duration::ZERO,
            failures: vec![refused_at("a:1"), denied_at("b:2")],
        };
        let text = e.to_string();
        assert!(
            text.starts_with("cannot connect to the broker at any of 2 seeds: a:1: "),
            "{text}"
        );
        assert!(text.contains("; b:2: "), "{text}");
        assert!(text.contains("unknown CN"), "{text}");
        assert!(text.contains("--wait-for-broker"), "{text}");
    }

    #[test]
    fn a_round_gives_up_when_nothing_could_change_or_the_wait_is_over() {
        let wait = Duration::from_secs(10);
        let early = Duration::from_secs(1);
        // One seed that may come up keeps the wait going.
        assert!(!give_up(
            &[denied_at("a:1"), refused_at("b:2")],
            early,
            wait
        ));
        assert!(give_up(&[denied_at("a:1"), denied_at("b:2")], early, wait));
        assert!(give_up(&[refused_at("a:1")], wait, wait));
        assert!(give_up(
            &[refused_at("a:1")],
            Duration::ZERO,
            Duration::ZERO
        ));
    }

    /// A `host:port` on which nothing listens.
    fn dead_address() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    }

    /// Settings that reach the TCP connect (a TLS handshake would fail).
    fn config() -> ClientConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        ClientConfig::with_connector(
            "unused:1",
            tokio_rustls::TlsConnector::from(Arc::new(tls)),
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
        )
    }

    async fn dial(seeds: &[String], wait: Duration) -> Result<DialedClient, FirstConnectError> {
        let mut never = std::pin::pin!(std::future::pending::<()>());
        let mut shutdown = Shutdown::new(never.as_mut());
        let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(50));
        dial_first(&mut config(), seeds, backoff, wait, &mut shutdown).await
    }

    #[tokio::test]
    async fn every_dead_seed_is_tried_in_order_and_named() {
        let seeds = vec![dead_address(), dead_address()];
        let Err(e) = dial(&seeds, Duration::ZERO).await else {
            panic!("connected to a dead port");
        };
        let tried: Vec<&str> = e.failures.iter().map(|s| s.addr.as_str()).collect();
        assert_eq!(tried, [seeds[0].as_str(), seeds[1].as_str()]);
        let text = e.to_string();
        assert!(
            text.contains(&seeds[0]) && text.contains(&seeds[1]),
            "{text}"
        );
        assert!(text.contains("any of 2 seeds"), "{text}");
    }

    #[tokio::test]
    async fn one_dead_seed_fails_as_a_single_address_did() {
        let seeds = vec![dead_address()];
        let Err(e) = dial(&seeds, Duration::ZERO).await else {
            panic!("connected to a dead port");
        };
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("cannot connect to the broker at {}: ", seeds[0])),
            "{text}"
        );
        assert_eq!(e.addr, seeds[0]);
    }

    #[tokio::test]
    async fn within_the_wait_the_seeds_are_tried_again() {
        let seeds = vec![dead_address(), dead_address()];
        let Err(e) = dial(&seeds, Duration::from_millis(300)).await else {
            panic!("connected to a dead port");
        };
        assert!(e.waited >= Duration::from_millis(300), "{:?}", e.waited);
        assert_eq!(e.failures.len(), 2);
        assert!(e.to_string().contains("after waiting"), "{e}");
    }
}
