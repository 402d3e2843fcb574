//! One connection to PostgreSQL that comes back by itself: exponential
//! backoff between attempts (100 ms doubling to 5 s), the driver's
//! `Connection` future running as its own task, and its end noticed at once.
//!
//! [`Link::event`] is cancel-safe (all progress lives in the `Link`), so an
//! owner can `select!` on it next to its own work.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tokio_postgres::Client;

use super::config::PgConfig;
use super::status::{LinkKind, StatusCell};
use super::tls::{explain, OpenError, PgTls};

/// First delay after a failure.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest delay between attempts: an outage ends at most this long before
/// the bridge notices.
const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Longest one attempt may take (a black-holed host).
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Exponential backoff, reset by a success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// Starts at [`BACKOFF_START`].
    pub(crate) fn new() -> Backoff {
        Backoff {
            next: BACKOFF_START,
        }
    }

    /// The delay before the next attempt; doubles up to [`BACKOFF_CAP`].
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_CAP);
        delay
    }

    /// After a success.
    pub(crate) fn reset(&mut self) {
        self.next = BACKOFF_START;
    }
}

/// An error and its causes on one line (the driver's `Display` alone says
/// only "db error" or "error connecting to server"): what every PostgreSQL
/// link of the broker (this bridge, the cluster coordinator) reports.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

/// An open connection: the client and the task driving its socket.
pub(crate) struct Conn {
    /// For queries.
    pub(crate) client: Client,
    /// The driver's `Connection` future; it ends when the connection does.
    task: JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl Conn {
    /// One connection attempt of at most `timeout`, TLS as `config.sslmode`
    /// says.
    pub(crate) async fn open(
        config: PgConfig,
        tls: PgTls,
        timeout: Duration,
    ) -> Result<Conn, OpenError> {
        let driver = config.driver(timeout);
        match tokio::time::timeout(timeout, driver.connect(tls.connector())).await {
            Ok(Ok((client, connection))) => Ok(Conn {
                client,
                task: tokio::spawn(connection),
            }),
            Ok(Err(e)) => Err(explain(&e, &config)),
            Err(_) => Err(OpenError::transient(format!(
                "no answer within {timeout:?}"
            ))),
        }
    }

    /// Resolves when the connection has ended, with why. Call at most once
    /// to completion (the owner drops the `Conn` then).
    async fn closed(&mut self) -> String {
        match (&mut self.task).await {
            Ok(Ok(())) => "connection closed".to_owned(),
            Ok(Err(e)) => describe(&e),
            Err(e) => format!("connection task ended: {e}"),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Dropping the client ends the connection gracefully; abort covers a
        // connection stuck on a dead socket.
        self.task.abort();
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<Conn, OpenError>> + Send>>;

/// A connection that reconnects with backoff and reports to the status.
pub(crate) struct Link {
    config: PgConfig,
    tls: PgTls,
    kind: LinkKind,
    status: Arc<StatusCell>,
    conn: Option<Conn>,
    /// An attempt in progress (kept across cancelled `event` calls).
    connecting: Option<Connecting>,
    retry_at: Instant,
    backoff: Backoff,
    /// A connection was up before: the next one is a reconnect.
    was_up: bool,
    /// Bumped per new connection, so owners know to re-prepare statements.
    generation: u64,
    /// The last refusal logged, so a certificate refused on every attempt
    /// is logged once, not every few seconds.
    last_refusal: Option<String>,
}

impl Link {
    /// A link starting from `conn` (made during start-up), or connecting at
    /// once when `None`.
    pub(crate) fn new(
        config: PgConfig,
        tls: PgTls,
        kind: LinkKind,
        status: Arc<StatusCell>,
        conn: Option<Conn>,
    ) -> Link {
        let mut link = Link {
            config,
            tls,
            kind,
            status,
            conn: None,
            connecting: None,
            retry_at: Instant::now(),
            backoff: Backoff::new(),
            was_up: false,
            generation: 0,
            last_refusal: None,
        };
        if let Some(conn) = conn {
            link.adopt(conn);
        }
        link
    }

    fn adopt(&mut self, conn: Conn) {
        self.conn = Some(conn);
        self.generation += 1;
        self.backoff.reset();
        self.last_refusal = None;
        self.status.link_up(self.kind, self.was_up);
        if self.was_up {
            tracing::info!(link = self.kind.name(), target = %self.config.target(), "reconnected to PostgreSQL");
        }
        self.was_up = true;
    }

    /// The open connection, if any.
    pub(crate) fn conn(&mut self) -> Option<&mut Conn> {
        self.conn.as_mut()
    }

    /// Which connection `conn` currently is (changes on every reconnect).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// An operation on the connection failed: drop it and retry after the
    /// backoff.
    pub(crate) fn fail(&mut self, why: String) {
        if self.conn.take().is_some() {
            tracing::warn!(link = self.kind.name(), target = %self.config.target(), error = %why, "lost the PostgreSQL connection; reconnecting");
        }
        self.status.link_down(self.kind, why);
        self.retry_at = Instant::now() + self.backoff.next_delay();
    }

    /// Tries to connect right now, skipping the backoff, for at most `limit`
    /// (for a registration waiting on the link).
    pub(crate) async fn try_now(&mut self, limit: Duration) {
        if self.conn.is_some() {
            return;
        }
        self.connecting = None;
        match Conn::open(self.config.clone(), self.tls.clone(), limit).await {
            Ok(conn) => self.adopt(conn),
            Err(e) => self.attempt_failed(e),
        }
    }

    /// Waits for the next change: the connection ending, or (while down) the
    /// next attempt finishing, successfully or not.
    pub(crate) async fn event(&mut self) {
        if let Some(conn) = &mut self.conn {
            let why = conn.closed().await;
            self.fail(why);
            return;
        }
        if self.connecting.is_none() {
            sleep_until(self.retry_at).await;
            self.connecting = Some(Box::pin(Conn::open(
                self.config.clone(),
                self.tls.clone(),
                ATTEMPT_TIMEOUT,
            )));
        }
        let Some(attempt) = self.connecting.as_mut() else {
            return;
        };
        let result = attempt.await;
        self.connecting = None;
        match result {
            Ok(conn) => self.adopt(conn),
            Err(e) => {
                self.attempt_failed(e);
                self.retry_at = Instant::now() + self.backoff.next_delay();
            }
        }
    }

    /// Reports a failed attempt: a refusal (a certificate, TLS refused) at
    /// error level, once until it changes or a connection succeeds; the
    /// rest, expected during an outage, at debug.
    fn attempt_failed(&mut self, e: OpenError) {
        if e.permanent {
            if self.last_refusal.as_deref() != Some(e.why.as_str()) {
                tracing::error!(link = self.kind.name(), target = %self.config.target(), error = %e.why, "cannot connect to PostgreSQL over TLS; retrying, in vain until the server's certificate or the [database] TLS settings change");
                self.last_refusal = Some(e.why.clone());
            }
        } else {
            tracing::debug!(link = self.kind.name(), target = %self.config.target(), error = %e.why, "PostgreSQL connection attempt failed");
        }
        self.status.link_down(self.kind, e.why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn describe_includes_the_causes() {
        let inner = std::io::Error::other("connection refused");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error connecting to server")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(
            describe(&Outer(inner)),
            "error connecting to server: connection refused"
        );
    }
}
