//! The reference receiver as a library: [`run_receiver`] registers the receiver's
//! public key, declares and binds its queue, consumes, decrypts, writes each new
//! message once to its output file, and acknowledges only what is on disk.
//!
//! Per connection:
//! 1. `declare_exchange`, `declare_queue`, `bind`, `register_public_key`, then
//!    `consume <queue> <prefetch>`, pipelined: the key is registered last, after the route
//!    exists, so a sender that finds the key can publish without `no_route`;
//! 2. each delivery is checked (`message_id` and `receiver_client_id` are ours to
//!    match), decrypted and staged in the [`Journal`]; a batch is committed (one
//!    write, one fsync) when full or after `batch_delay_ms`, and only then are its
//!    messages acknowledged, a batch a line (`ack_batch <queue> <id> …`);
//! 3. a message already in the journal is acknowledged without being written
//!    again (a redelivery after a crash or a lost ack): exactly-once processing on
//!    top of at-least-once delivery. A message is known by its sender
//!    (`sender_client_id`, which the broker verified) and its id, so a sender
//!    that uses another's id first cannot get the other's message dropped as a
//!    duplicate. Since an ack of `<id>` from `<queue>` settles every delivery of that id on
//!    the connection, whoever sent it, an ack waits while another sender's
//!    message with the same id is still being decrypted;
//! 4. a message that cannot be decrypted is logged and `nack`ed, never written: the
//!    broker redelivers it and, after `max_deliveries`, moves it to the dead-letter
//!    queue;
//! 5. a heartbeat after `heartbeat_secs` without a command.
//!
//! It runs on the client library: a [`Client`] per connection, the queue's
//! [`Consumer`] stream, a [`Settler`] for the `ack_batch` and `nack` lines
//! (written at once; their replies are awaited beside the stream).
//!
//! A lost connection (or the queue deleted under it) commits what is staged
//! and reconnects with backoff ([`Client::connect_with_retry`]); the
//! deliveries it held come back and are deduplicated. On stop (shutdown signal,
//! `max_messages`, `until_total`, idle) the receiver stops taking deliveries,
//! commits, acknowledges, waits for the broker's confirmations, and says `quit`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ciphermq_proto::message::inspect_message;
use ciphermq_proto::ExchangeKind;
use futures_util::stream::{FuturesUnordered, StreamExt as _};

use crate::client::{
    Client, ClientConfig, ConnectError, Consumer, ConsumerError, Delivery, RequestError,
    Settlement, Settler,
};
use crate::client_config::ConfigError;
use crate::connection::ClientError;
use crate::crypto::SecretKey;
use crate::journal::{Journal, JournalError};
use crate::key_file::{self, KeyFileError};
use crate::opener::{Opened, Opener, Received};
use crate::receiver_config::ReceiverConfig;
use crate::reconnect::{dial_client, dial_first, DialedClient, FirstConnectError, QUIT_WAIT};
use crate::shutdown::Shutdown;

/// Longest wait, when stopping, for the broker to confirm our acks.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// Why the receiver stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiverError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS files cannot be loaded.
    #[error(transparent)]
    Tls(#[from] ClientError),
    /// The first connection could not be made (nothing was consumed).
    #[error(transparent)]
    FirstConnect(#[from] FirstConnectError),
    /// Reconnecting failed in a way retrying cannot fix, or too many times in a row.
    #[error("cannot connect to the broker: {0}")]
    Connect(ConnectError),
    /// Our certificate's CN is not a receiver (or admin) in the broker's ACL.
    #[error("connected as {client_id} with role {role}; consuming needs the receiver role (add the CN to acl.receiver_cns)")]
    NotReceiver {
        /// Our CN as the broker sees it.
        client_id: String,
        /// The role the broker gave it.
        role: String,
    },
    /// The broker refused part of the setup (ACL, exchange type, bad key …).
    #[error("the broker refused `{command}`: {reply}")]
    Refused {
        /// The command.
        command: String,
        /// The broker's reply.
        reply: String,
    },
    /// The private key file is missing or malformed.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The output file cannot be written: nothing more can be acknowledged.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The broker answered something the protocol does not allow here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The broker's greeting named a client id that breaks the name rule.
    /// The id goes into file paths (`{cn}` in `private_key_path`, the queue
    /// and output file names), so nothing was read or written for it.
    #[error(
        "the broker's greeting names the client id {0}, which is not a valid name \
         (1 to 255 of A-Z a-z 0-9 _ . : -, not . or ..); it would go into file paths, \
         so nothing was read or written"
    )]
    InvalidClientId(String),
}

// The cause is part of the message, not its `source()`: a report that prints
// the chain (`{:#}`) would print it twice.
impl From<ConnectError> for ReceiverError {
    fn from(e: ConnectError) -> Self {
        ReceiverError::Connect(e)
    }
}

/// When to stop besides the shutdown signal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverLimits {
    /// Stop once this many new messages were written in this run (`--count`).
    /// Deliveries beyond it are left unacknowledged for the next run.
    pub max_messages: Option<u64>,
    /// Stop once the output file holds this many records (`--until-total`).
    pub until_total: Option<u64>,
    /// Stop after this long without a delivery (`--idle-exit`).
    pub idle_exit: Option<Duration>,
}

/// Live counters, shared with whoever shows progress.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    /// Deliveries read (redeliveries included).
    pub received: AtomicU64,
    /// New messages written to the output file and made durable.
    pub written: AtomicU64,
    /// Deliveries of messages already written, acknowledged without writing.
    pub duplicates: AtomicU64,
    /// Deliveries that could not be decrypted or were not for us (nacked).
    pub rejected: AtomicU64,
    /// Acks the broker confirmed (`ACK_CONFIRMED`).
    pub acked: AtomicU64,
    /// Connections replaced after a failure.
    pub reconnects: AtomicU64,
    /// When the first delivery arrived: the start of the span rates are
    /// measured over, so the wait for a first message does not count.
    pub first_delivery: OnceLock<Instant>,
    /// Microseconds from the first delivery to the last write that made new
    /// records durable: the end of that span, so a wait after the last
    /// message (`--idle-exit`) does not count either.
    pub active_micros: AtomicU64,
}

impl ReceiverStats {
    /// Counts a delivery read at `now`; the first one starts the measured span.
    pub fn delivery_at(&self, now: Instant) {
        self.received.fetch_add(1, Relaxed);
        self.first_delivery.get_or_init(|| now);
    }

    /// Counts `n` new records made durable at `now`, which ends the measured
    /// span so far.
    pub fn written_at(&self, n: u64, now: Instant) {
        if n == 0 {
            return;
        }
        self.written.fetch_add(n, Relaxed);
        if let Some(first) = self.first_delivery.get() {
            let micros = now.saturating_duration_since(*first).as_micros();
            self.active_micros
                .fetch_max(u64::try_from(micros).unwrap_or(u64::MAX), Relaxed);
        }
    }

    /// From the first delivery to the last write of new records: the time
    /// messages flowed (zero before anything was written).
    pub fn active(&self) -> Duration {
        Duration::from_micros(self.active_micros.load(Relaxed))
    }

    /// New messages written per second over [`ReceiverStats::active`].
    pub fn msgs_per_sec(&self) -> f64 {
        per_second(self.written.load(Relaxed), self.active())
    }
}

/// `count` per second over `span`; 0 for an empty span.
pub fn per_second(count: u64, span: Duration) -> f64 {
    let secs = span.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// Why a run ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The shutdown signal fired.
    Shutdown,
    /// `max_messages` new messages were written.
    Count,
    /// The output file reached `until_total` records.
    Total,
    /// No delivery for `idle_exit`.
    Idle,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiverReport {
    /// Our CN (empty if we never connected).
    pub client_id: String,
    /// The queue consumed.
    pub queue: String,
    /// The output file.
    pub output: PathBuf,
    /// Deliveries read.
    pub received: u64,
    /// New messages written.
    pub written: u64,
    /// Duplicates acknowledged without writing.
    pub duplicates: u64,
    /// Deliveries rejected (nacked).
    pub rejected: u64,
    /// Acks confirmed by the broker.
    pub acked: u64,
    /// Connections replaced.
    pub reconnects: u64,
    /// Records in the output file at the end.
    pub total_records: u64,
    /// Why it stopped.
    pub stop: StopReason,
    /// How long it ran.
    pub elapsed: Duration,
    /// From the first delivery to the last write of new records
    /// ([`ReceiverStats::active`]): what the rate is measured over.
    pub active: Duration,
}

impl ReceiverReport {
    /// New messages written per second while messages flowed (over
    /// [`ReceiverReport::active`], not the whole run: waiting for a first
    /// message, or `--idle-exit` after the last, does not dilute it).
    pub fn msgs_per_sec(&self) -> f64 {
        per_second(self.written, self.active)
    }
}

impl std::fmt::Display for ReceiverReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "received {}, written {}, duplicates {}, rejected {}, acked {}, reconnects {} in {:.2} s ({:.0} msg/s over the {:.2} s from the first message to the last write); {} holds {} records; stopped: {:?}",
            self.received,
            self.written,
            self.duplicates,
            self.rejected,
            self.acked,
            self.reconnects,
            self.elapsed.as_secs_f64(),
            self.msgs_per_sec(),
            self.active.as_secs_f64(),
            self.output.display(),
            self.total_records,
            self.stop
        )
    }
}

/// Runs the receiver until a limit is reached, the shutdown future fires, or an
/// error that reconnecting cannot fix. In-flight work is drained before it returns.
pub async fn run_receiver<F>(
    config: &ReceiverConfig,
    limits: ReceiverLimits,
    stats: Arc<ReceiverStats>,
    shutdown: F,
) -> Result<ReceiverReport, ReceiverError>
where
    F: Future<Output = ()> + Send,
{
    config.validate()?;
    let started = Instant::now();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut shutdown = Shutdown::new(shutdown.as_mut());
    let tls = config.tls.options();
    // Acks and nacks are this client's only commands besides the setup; the
    // connection task sends a heartbeat after `heartbeat_secs` without one.
    let seeds = crate::client_config::seed_addresses(&config.server_address)?;
    let mut client_config =
        ClientConfig::with_connector(seeds[0].clone(), tls.connector()?, tls.server_name()?)
            .heartbeat_interval(Some(Duration::from_secs(config.heartbeat_secs)));
    let mut session: Option<Session> = None;
    let mut failures = 0u32;
    let stop = loop {
        // A first connection that fails is a wrong address or a broker not
        // started: said at once, unless asked to wait. Reconnects back off.
        let dialed = if session.is_none() {
            dial_first(
                &mut client_config,
                &seeds,
                config.backoff(),
                Duration::from_secs(config.wait_for_broker_secs),
                &mut shutdown,
            )
            .await?
        } else {
            dial_client(
                &client_config,
                config.backoff(),
                config.reconnect_attempts,
                &mut shutdown,
            )
            .await?
        };
        let client = match dialed {
            DialedClient::Connected(client) => home_node(client, &mut client_config).await,
            DialedClient::Stopped => break StopReason::Shutdown,
        };
        let s = match &mut session {
            Some(s) if s.cn == client.client_id() => s,
            Some(s) => {
                return Err(ReceiverError::Protocol(format!(
                    "reconnected as {} instead of {}",
                    client.client_id(),
                    s.cn
                )))
            }
            None => session.insert(Session::start(config, &client, limits, stats.clone())?),
        };
        let lost = match s.setup(&client, config).await {
            Ok(consumer) => {
                failures = 0;
                match s.consume(&client, consumer, &mut shutdown).await? {
                    End::Stopped(reason) => break reason,
                    End::Lost(reason) => reason,
                }
            }
            Err(SetupError::Fatal(e)) => return Err(e),
            Err(SetupError::Lost(e)) => e.to_string(),
        };
        drop(client);
        s.journal.commit()?;
        stats.reconnects.fetch_add(1, Relaxed);
        failures += 1;
        let delay = config.backoff().delay(failures);
        tracing::warn!(reason = %lost, retry_in_ms = delay.as_millis() as u64, "connection lost; reconnecting");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.wait() => break StopReason::Shutdown,
        }
    };
    let mut report = ReceiverReport {
        client_id: String::new(),
        queue: String::new(),
        output: PathBuf::new(),
        received: stats.received.load(Relaxed),
        written: stats.written.load(Relaxed),
        duplicates: stats.duplicates.load(Relaxed),
        rejected: stats.rejected.load(Relaxed),
        acked: stats.acked.load(Relaxed),
        reconnects: stats.reconnects.load(Relaxed),
        total_records: 0,
        stop,
        elapsed: started.elapsed(),
        active: stats.active(),
    };
    if let Some(s) = session {
        report.client_id = s.cn;
        report.queue = s.queue;
        report.output = s.journal.path().to_owned();
        report.total_records = s.journal.committed();
    }
    Ok(report)
}

/// How a connection's consume loop ended.
enum End {
    /// A stop condition; everything was drained.
    Stopped(StopReason),
    /// The connection failed; the reason is for the log.
    Lost(String),
}

/// Why the setup commands failed.
enum SetupError {
    /// The broker refused: reconnecting will not help.
    Fatal(ReceiverError),
    /// The connection failed.
    Lost(RequestError),
}

/// Longest piece of a refused client id quoted in an error: the broker
/// chose it, and it may be a megabyte.
const QUOTE_MAX: usize = 80;

/// What the receiver reads and writes for the client id the broker's
/// greeting announced: the names it declares and the files it opens.
#[derive(Debug, PartialEq, Eq)]
struct SessionFiles {
    /// The client id, checked.
    cn: String,
    /// The queue consumed.
    queue: String,
    /// The binding key.
    routing_key: String,
    /// The private key file.
    key: PathBuf,
    /// The output file.
    output: PathBuf,
}

impl SessionFiles {
    /// Checks the announced `cn` against the name rule before it goes into
    /// any name or path: a greeting such as `HELLO ciphermq/1 ../../etc/x
    /// receiver` would otherwise have the receiver read
    /// `keys/../../etc/x_private.key`.
    fn for_client(config: &ReceiverConfig, cn: &str) -> Result<SessionFiles, ReceiverError> {
        if !ciphermq_proto::is_valid_name(cn) {
            let quoted = match cn.char_indices().nth(QUOTE_MAX) {
                Some((at, _)) => format!("{:?}… ({} bytes)", &cn[..at], cn.len()),
                None => format!("{cn:?}"),
            };
            return Err(ReceiverError::InvalidClientId(quoted));
        }
        let (queue, routing_key) = config.names(cn)?;
        Ok(SessionFiles {
            cn: cn.to_owned(),
            key: config.private_key_for(cn),
            output: config.output_file(&queue),
            queue,
            routing_key,
        })
    }
}

/// What lives across connections: identity, key, names, journal, counters.
struct Session {
    /// Our CN.
    cn: String,
    /// Our X25519 private key, shared with the decryption threads.
    secret: Arc<SecretKey>,
    /// The queue consumed.
    queue: String,
    /// The binding key.
    routing_key: String,
    /// The output file and its ids.
    journal: Journal,
    /// Stop conditions.
    limits: ReceiverLimits,
    /// Live counters.
    stats: Arc<ReceiverStats>,
    /// Records staged at a time, at most.
    batch_size: usize,
    /// Longest wait of a staged record.
    batch_delay: Duration,
    /// Deliveries granted before acks.
    prefetch: u32,
    /// Threads decrypting at once.
    workers: usize,
    /// Last delivery (or start), for `idle_exit`.
    last_delivery: Instant,
}

impl Session {
    /// Identity from the greeting; key, names and journal from the config.
    fn start(
        config: &ReceiverConfig,
        client: &Client,
        limits: ReceiverLimits,
        stats: Arc<ReceiverStats>,
    ) -> Result<Session, ReceiverError> {
        if !client.role().can_consume() {
            return Err(ReceiverError::NotReceiver {
                client_id: client.client_id().to_owned(),
                role: client.role().to_string(),
            });
        }
        let SessionFiles {
            cn,
            queue,
            routing_key,
            key,
            output,
        } = SessionFiles::for_client(config, client.client_id())?;
        let secret = key_file::read_secret_key(&key)?;
        let journal = Journal::open(&output)?;
        tracing::info!(
            client_id = %cn,
            queue = %queue,
            output = %journal.path().display(),
            records = journal.committed(),
            "connected"
        );
        Ok(Session {
            cn,
            secret: Arc::new(secret),
            queue,
            routing_key,
            journal,
            limits,
            stats,
            batch_size: config.batch_size,
            batch_delay: Duration::from_millis(config.batch_delay_ms),
            prefetch: config.prefetch,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            last_delivery: Instant::now(),
        })
    }

    /// Declares, binds, registers the key and starts consuming, pipelined: the
    /// five commands are written together, in this order, and their replies
    /// checked in order (deliveries only follow `OK consume`).
    async fn setup(
        &self,
        client: &Client,
        config: &ReceiverConfig,
    ) -> Result<Consumer, SetupError> {
        let (ex, q, key) = (&config.exchange_name, &self.queue, &self.routing_key);
        let kind = ExchangeKind::parse(&config.exchange_type).ok_or_else(|| {
            SetupError::Fatal(ReceiverError::Protocol(format!(
                "unknown exchange type {}",
                config.exchange_type
            )))
        })?;
        let public = self.secret.public_key();
        let (exchange, queue, bind, register, consume) = tokio::join!(
            client.declare_exchange(ex, kind),
            client.declare_queue(q),
            client.bind(q, ex, key),
            client.register_public_key(&public),
            client.consume(q, self.prefetch),
        );
        let refused = |command: String, e: RequestError| match e {
            RequestError::ConnectionLost(_) => SetupError::Lost(e),
            other => SetupError::Fatal(ReceiverError::Refused {
                command,
                reply: reply_text(&other),
            }),
        };
        exchange.map_err(|e| refused(format!("declare_exchange {ex} {kind}"), e))?;
        queue.map_err(|e| refused(format!("declare_queue {q}"), e))?;
        bind.map_err(|e| refused(format!("bind {q} {ex} {key}"), e))?;
        // Never echo the key itself into an error.
        register.map_err(|e| refused("register_public_key".to_owned(), e))?;
        let consumer = consume.map_err(|e| refused(format!("consume {q} {}", self.prefetch), e))?;
        tracing::info!(queue = %self.queue, prefetch = self.prefetch, "public key registered; consuming");
        Ok(consumer)
    }

    /// The consume loop of one connection.
    async fn consume(
        &mut self,
        client: &Client,
        mut consumer: Consumer,
        shutdown: &mut Shutdown<'_>,
    ) -> Result<End, ReceiverError> {
        let mut link = Link {
            settler: consumer.settler(),
            acks: FuturesUnordered::new(),
            nacks: FuturesUnordered::new(),
            acks_after_commit: Vec::new(),
        };
        let mut opener = Opener::new(self.secret.clone(), &self.cn, self.workers);
        // When what is collected, staged or owed an ack must move on, at the latest.
        let mut batch_deadline: Option<Instant> = None;
        self.last_delivery = Instant::now();
        let end = loop {
            if opener.is_idle() {
                if let Some(reason) = self.limit_reached() {
                    break End::Stopped(reason);
                }
            }
            let idle_deadline = self.limits.idle_exit.map(|idle| self.last_delivery + idle);
            let far = Instant::now() + Duration::from_secs(3600);
            let quiet = batch_deadline.is_none() && opener.is_idle();
            tokio::select! {
                biased;
                opened = opener.next(), if opener.has_jobs() => {
                    let mut lost = None;
                    for o in opened.unwrap_or_default() {
                        if let Err(reason) = self.on_opened(o, &mut link) {
                            lost.get_or_insert(reason);
                        }
                    }
                    if let Some(reason) = lost {
                        break End::Lost(reason);
                    }
                    // Nothing more to decrypt right now: make the batch durable.
                    if opener.is_idle() {
                        if let Err(lost) = self.commit(&mut link, &opener)? {
                            break End::Lost(lost);
                        }
                    }
                }
                item = consumer.next() => match item {
                    Some(Ok(delivery)) => {
                        if self.on_delivery(&delivery, &mut link, &mut opener) {
                            batch_deadline.get_or_insert_with(|| Instant::now() + self.batch_delay);
                        }
                    }
                    Some(Err(ConsumerError::Unsolicited(line))) => {
                        tracing::warn!(%line, "the broker pushed an unexpected line; ignored");
                    }
                    // The queue deleted: reconnecting declares it again.
                    Some(Err(e)) => break End::Lost(e.to_string()),
                    None => break End::Lost("the consumer's stream ended".to_owned()),
                },
                Some(settled) = link.acks.next(), if !link.acks.is_empty() => {
                    if let Err(lost) = self.on_settled(settled, true) {
                        break End::Lost(lost);
                    }
                }
                Some(settled) = link.nacks.next(), if !link.nacks.is_empty() => {
                    if let Err(lost) = self.on_settled(settled, false) {
                        break End::Lost(lost);
                    }
                }
                () = tokio::time::sleep_until(batch_deadline.unwrap_or(far).into()), if batch_deadline.is_some() => {
                    batch_deadline = None;
                    opener.flush();
                    if opener.is_idle() {
                        if let Err(lost) = self.commit(&mut link, &opener)? {
                            break End::Lost(lost);
                        }
                    }
                }
                // Pending work always has a deadline of its own; idle waits for it.
                () = tokio::time::sleep_until(idle_deadline.unwrap_or(far).into()), if idle_deadline.is_some() && quiet => {
                    if idle_deadline.is_some_and(|d| Instant::now() >= d) && self.journal.staged() == 0 {
                        break End::Stopped(StopReason::Idle);
                    }
                }
                () = shutdown.wait(), if !shutdown.fired() => break End::Stopped(StopReason::Shutdown),
            }
            if self.journal.staged() >= self.batch_size {
                if let Err(lost) = self.commit(&mut link, &opener)? {
                    break End::Lost(lost);
                }
            }
        };
        // Whatever ended the loop, finish what is being decrypted and make it
        // durable: on a lost connection its acks are lost too, and the messages
        // come back and are deduplicated.
        for o in opener.finish().await {
            // A lost connection shows in the commit's result below.
            let _ = self.on_opened(o, &mut link);
        }
        let sent = self.commit(&mut link, &opener)?.is_ok();
        if let End::Stopped(reason) = &end {
            tracing::info!(?reason, "stopping: acknowledging what is written");
            if sent {
                self.drain(client, &mut link).await;
            }
        }
        Ok(end)
    }

    /// A delivery: deduplicate, or hand it to the decryption stage. True when
    /// work was queued that a commit must follow (a delivery to open, or an ack
    /// waiting for the next commit).
    fn on_delivery(&mut self, d: &Delivery, link: &mut Link, opener: &mut Opener) -> bool {
        self.last_delivery = Instant::now();
        self.stats.delivery_at(self.last_delivery);
        // A body this cannot read is refused by the decryption stage; until
        // then it counts as naming no sender.
        let sender = inspect_message(d.body())
            .ok()
            .and_then(|info| info.sender_client_id.map(|s| s.into_owned()));
        if self.journal.contains(sender.as_deref(), d.id()) {
            // Written (or staged): acknowledge once the file holds it.
            self.stats.duplicates.fetch_add(1, Relaxed);
            tracing::debug!(
                message_id = d.id(),
                count = d.delivery_count(),
                "duplicate; acknowledging without writing"
            );
            link.acks_after_commit.push(d.id().to_owned());
            return true;
        }
        if opener.contains(sender.as_deref(), d.id()) {
            // Another copy is being opened; its ack settles both.
            self.stats.duplicates.fetch_add(1, Relaxed);
            return false;
        }
        if self.staging_full() {
            // A limit is reached: leave it unacknowledged for the next run.
            return false;
        }
        opener.push(Received {
            message_id: d.id().to_owned(),
            sender_client_id: sender,
            queue: d.queue().to_owned(),
            delivery_count: d.delivery_count(),
            body: d.body().to_owned(),
        });
        true
    }

    /// A decrypted delivery: stage it (acked after the commit), or nack it.
    /// `Err` with the reason when the connection is gone.
    fn on_opened(&mut self, o: Opened, link: &mut Link) -> Result<(), String> {
        let d = &o.delivery;
        match o.result {
            // Admitted while others were being opened, and the limit filled
            // meanwhile: leave it unacknowledged for the next run.
            Ok(_) if self.staging_full() => {}
            Ok(plaintext) => {
                self.journal.stage(
                    d.sender_client_id.as_deref(),
                    &d.message_id,
                    &plaintext,
                    unix_now(),
                );
                link.acks_after_commit.push(d.message_id.clone());
            }
            Err(reason) => {
                self.stats.rejected.fetch_add(1, Relaxed);
                tracing::error!(
                    message_id = %d.message_id,
                    queue = %d.queue,
                    delivery_count = d.delivery_count,
                    %reason,
                    "cannot open the message; nacking it (not written; after max_deliveries the broker dead-letters it)"
                );
                match link.settler.nack_each([&d.message_id]) {
                    Ok(settlement) => link.nacks.push(settlement),
                    Err(RequestError::ConnectionLost(reason)) => return Err(reason.to_string()),
                    Err(e) => tracing::warn!(message_id = %d.message_id, error = %e, "cannot nack"),
                }
            }
        }
        Ok(())
    }

    /// The broker's answer to acks (`ack == true`) or nacks. `Err` with the
    /// reason when the connection is gone.
    fn on_settled(&mut self, settled: Result<u64, RequestError>, ack: bool) -> Result<(), String> {
        match settled {
            // Ids the broker no longer holds for us (after a reconnect the old
            // connection's deliveries come back and are deduplicated) are not
            // counted in the reply.
            Ok(n) if ack => {
                self.stats.acked.fetch_add(n, Relaxed);
            }
            Ok(_) => {}
            Err(RequestError::ConnectionLost(reason)) => return Err(reason.to_string()),
            Err(e) => tracing::warn!(ack, error = %e, "unexpected reply"),
        }
        Ok(())
    }

    /// Commits staged records, then sends the acks that waited for it, in
    /// `ack_batch` lines; `Ok(Err(reason))` if the connection is gone (the
    /// acks are then lost with it, and the messages come back and are
    /// deduplicated).
    ///
    /// An ack whose id `opener` is still decrypting (another sender's message
    /// with the same id) waits for a later commit: it would settle that
    /// delivery too, before it is on disk.
    fn commit(
        &mut self,
        link: &mut Link,
        opener: &Opener,
    ) -> Result<Result<(), String>, ReceiverError> {
        let written = self.journal.commit()?;
        self.stats.written_at(written as u64, Instant::now());
        if link.acks_after_commit.is_empty() {
            return Ok(Ok(()));
        }
        let (held, acks): (Vec<String>, Vec<String>) = std::mem::take(&mut link.acks_after_commit)
            .into_iter()
            .partition(|id| opener.holds_id(id));
        link.acks_after_commit = held;
        // Ids come from the broker's delivery lines; one that breaks the name
        // rule could never be acknowledged by name, and must not hold back
        // the others.
        let (acks, bad): (Vec<String>, Vec<String>) = acks
            .into_iter()
            .partition(|id| ciphermq_proto::is_valid_name(id));
        for id in bad {
            tracing::warn!(message_id = %id, "a delivery id that breaks the name rule; not acknowledged");
        }
        if acks.is_empty() {
            return Ok(Ok(()));
        }
        match link.settler.ack_ids(&acks) {
            Ok(settlement) => link.acks.push(settlement),
            Err(RequestError::ConnectionLost(reason)) => return Ok(Err(reason.to_string())),
            Err(e) => tracing::warn!(error = %e, "cannot acknowledge"),
        }
        Ok(Ok(()))
    }

    /// Whether staging another record would pass a limit. Deliveries being
    /// decrypted do not count (some may fail); the limit is applied again when
    /// they are staged.
    fn staging_full(&self) -> bool {
        let staged = self.journal.staged() as u64;
        let count = self
            .limits
            .max_messages
            .is_some_and(|max| self.stats.written.load(Relaxed) + staged >= max);
        let total = self
            .limits
            .until_total
            .is_some_and(|t| self.journal.committed() + staged >= t);
        count || total
    }

    /// A limit reached with nothing left staged.
    fn limit_reached(&self) -> Option<StopReason> {
        if self.journal.staged() > 0 {
            return None;
        }
        if self
            .limits
            .max_messages
            .is_some_and(|max| self.stats.written.load(Relaxed) >= max)
        {
            return Some(StopReason::Count);
        }
        if self
            .limits
            .until_total
            .is_some_and(|t| self.journal.committed() >= t)
        {
            return Some(StopReason::Total);
        }
        None
    }

    /// Waits (bounded) for the broker's answers to the acks and nacks still
    /// owed (new deliveries stay unacknowledged and are redelivered), then
    /// says `quit`.
    async fn drain(&mut self, client: &Client, link: &mut Link) {
        let _ = tokio::time::timeout(DRAIN_WAIT, async {
            while let Some(settled) = link.acks.next().await {
                if self.on_settled(settled, true).is_err() {
                    return;
                }
            }
            while let Some(settled) = link.nacks.next().await {
                if self.on_settled(settled, false).is_err() {
                    return;
                }
            }
        })
        .await;
        let _ = tokio::time::timeout(QUIT_WAIT, client.close()).await;
    }
}

/// The broker's refusal as it wrote it.
fn reply_text(e: &RequestError) -> String {
    match e {
        RequestError::Denied(text) => format!("Access denied: {text}"),
        RequestError::Broker(text) => format!("Error: {text}"),
        RequestError::RateLimited => "Rate limited".to_owned(),
        RequestError::Unexpected(line) => line.clone(),
        other => other.to_string(),
    }
}

/// The settling side of one connection and what it owes.
struct Link {
    /// Writes `ack_batch` and `nack` lines.
    settler: Settler,
    /// `ack_batch` replies owed.
    acks: FuturesUnordered<Settlement>,
    /// `nack` replies owed.
    nacks: FuturesUnordered<Settlement>,
    /// Ids to acknowledge once the current batch is durable.
    acks_after_commit: Vec<String>,
}

/// Seconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// In a cluster, the connection to the node holding this receiver: asks
/// the connected node (`locate <cn>`, which places the receiver there if no
/// node holds it yet) and, when another node holds it, connects there and
/// makes it the address of later reconnects. A broker on its own (it
/// answers `locate` with an error), or a home that cannot be reached,
/// leaves the connection as it is: the setup then says what the broker
/// answered.
async fn home_node(client: Client, config: &mut ClientConfig) -> Client {
    let Ok(home) = client.locate(client.client_id()).await else {
        return client;
    };
    if home.address == config.address() {
        return client;
    }
    let there = config.for_address(home.address.clone());
    match Client::connect(there.clone()).await {
        Ok(connected) => {
            tracing::info!(node_id = %home.node_id, address = %home.address, epoch = home.epoch,
                "this receiver lives on another node of the cluster; connected there");
            *config = there;
            connected
        }
        Err(e) => {
            tracing::warn!(node_id = %home.node_id, address = %home.address, error = %e,
                "cannot reach the node holding this receiver");
            client
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Hello;

    #[test]
    fn a_hostile_greeting_never_reaches_a_file_path() {
        // A queue name without `{cn}`: the name check of the queue would not
        // catch the id; only the id's own check does.
        let config: ReceiverConfig = crate::client_config::parse_json(
            r#"{"tls":{"certificate_path":"c/ca.crt","client_cert_path":"c/r.crt",
                "client_key_path":"c/r.key"},"queue_name":"shared_queue","routing_key":"k"}"#,
            std::path::Path::new("r.json"),
        )
        .unwrap();
        let hello = Hello::parse("HELLO ciphermq/1 ../../etc/x receiver").expect("its shape");
        let refused = SessionFiles::for_client(&config, &hello.client_id).unwrap_err();
        assert!(
            matches!(&refused, ReceiverError::InvalidClientId(id) if id == "\"../../etc/x\""),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("not a valid name"),
            "{refused}"
        );
        let long = "y/".repeat(500);
        for bad in [".", "..", "a/b", "a\\b", "r\u{0}", "x%2f", long.as_str()] {
            assert!(
                matches!(
                    SessionFiles::for_client(&config, bad),
                    Err(ReceiverError::InvalidClientId(_))
                ),
                "{bad:?}"
            );
        }
        let e = SessionFiles::for_client(&config, &long)
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400 && e.contains("(1000 bytes)"), "{e}");
        let files = SessionFiles::for_client(&config, "receiver_1").unwrap();
        assert_eq!(files.key, PathBuf::from("keys/receiver_1_private.key"));
        assert_eq!(files.queue, "shared_queue");
    }

    #[test]
    fn the_rate_counts_from_the_first_delivery_to_the_last_write() {
        let stats = ReceiverStats::default();
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        // Nothing yet: no span, no rate.
        assert_eq!(
            (stats.active(), stats.msgs_per_sec()),
            (Duration::ZERO, 0.0)
        );
        // Ten idle seconds before the first message; they do not count.
        stats.delivery_at(at(10));
        stats.delivery_at(at(11));
        stats.written_at(100, at(12));
        stats.delivery_at(at(13));
        stats.written_at(100, at(14));
        // A batch of duplicates writes nothing: the span does not grow.
        stats.written_at(0, at(15));
        assert_eq!(stats.active(), Duration::from_secs(4));
        assert_eq!(stats.msgs_per_sec(), 50.0);

        // The report of a run that then idled until 60 s: the same rate.
        let report = ReceiverReport {
            client_id: "receiver_1".into(),
            queue: "receiver_1_queue".into(),
            output: PathBuf::from("out.jsonl"),
            received: 3,
            written: 200,
            duplicates: 0,
            rejected: 0,
            acked: 200,
            reconnects: 0,
            total_records: 200,
            stop: StopReason::Idle,
            elapsed: Duration::from_secs(60),
            active: stats.active(),
        };
        assert_eq!(report.msgs_per_sec(), 50.0);
        assert!(
            report.to_string().contains("(50 msg/s over the 4.00 s"),
            "{report}"
        );
    }

    #[test]
    fn a_run_without_new_records_has_no_rate() {
        assert_eq!(per_second(0, Duration::ZERO), 0.0);
        assert_eq!(per_second(5, Duration::ZERO), 0.0);
        assert_eq!(per_second(5, Duration::from_millis(500)), 10.0);
    }
}
