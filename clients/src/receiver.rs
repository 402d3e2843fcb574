//! The reference receiver as a library: [`run_receiver`] registers the receiver's
//! public key, declares and binds its queue, consumes, decrypts, writes each new
//! message once to its output file, and acknowledges only what is on disk.
//!
//! Per connection:
//! 1. `declare_exchange`, `declare_queue`, `bind`, `register_public_key`, then
//!    `consume <queue> <prefetch>`: the key is registered last, after the route
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
//! 5. a heartbeat every `heartbeat_secs`.
//!
//! A lost connection commits what is staged and reconnects with backoff; the
//! deliveries it held come back and are deduplicated. On stop (shutdown signal,
//! `max_messages`, `until_total`, idle) the receiver stops taking deliveries,
//! commits, acknowledges, waits for the broker's confirmations, and says `quit`.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ciphermq_proto::message::inspect_message;
use ciphermq_proto::{Delivery, Reply};
use tokio::time::MissedTickBehavior;

use crate::client_config::ConfigError;
use crate::connection::{ClientError, Connection, ConnectionReader};
use crate::crypto::{self, SecretKey};
use crate::journal::{Journal, JournalError};
use crate::key_file::{self, KeyFileError};
use crate::line_writer::{self, LineSender, WriterTask};
use crate::opener::{Opened, Opener, Received};
use crate::receiver_config::ReceiverConfig;
use crate::reconnect::{Dialed, Dialer, QUIT_WAIT};
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
    /// Connecting failed in a way retrying cannot fix, or too many times in a row.
    #[error("cannot connect to the broker: {0}")]
    Connect(#[from] ClientError),
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
}

impl std::fmt::Display for ReceiverReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            self.written as f64 / secs
        } else {
            0.0
        };
        write!(
            f,
            "received {}, written {}, duplicates {}, rejected {}, acked {}, reconnects {} in {secs:.2} s ({rate:.0} msg/s); {} holds {} records; stopped: {:?}",
            self.received,
            self.written,
            self.duplicates,
            self.rejected,
            self.acked,
            self.reconnects,
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
    let dialer = Dialer {
        addr: config.server_address.clone(),
        connector: tls.connector()?,
        server_name: tls.server_name()?,
        backoff: config.backoff(),
        max_attempts: config.reconnect_attempts,
    };
    let mut session: Option<Session> = None;
    let mut failures = 0u32;
    let stop = loop {
        let mut conn = match dialer.connect(&mut shutdown).await? {
            Dialed::Connected(conn) => *conn,
            Dialed::Stopped => break StopReason::Shutdown,
        };
        let s = match &mut session {
            Some(s) if s.cn == conn.hello().client_id => s,
            Some(s) => {
                return Err(ReceiverError::Protocol(format!(
                    "reconnected as {} instead of {}",
                    conn.hello().client_id,
                    s.cn
                )))
            }
            None => session.insert(Session::start(config, &conn, limits, stats.clone())?),
        };
        let lost = match s.setup(&mut conn, config).await {
            Ok(()) => {
                failures = 0;
                match s.consume(conn, &mut shutdown).await? {
                    End::Stopped(reason) => break reason,
                    End::Lost(reason) => reason,
                }
            }
            Err(SetupError::Fatal(e)) => return Err(e),
            Err(SetupError::Lost(e)) => e.to_string(),
        };
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
    Lost(ClientError),
}

/// A command whose reply is still owed, for matching replies by order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// An `ack_batch` line: its reply counts the deliveries it settled.
    AckBatch,
    Nack,
    Heartbeat,
}

/// What lives across connections: identity, key, names, journal, counters.
struct Session {
    /// Our CN.
    cn: String,
    /// Our X25519 private key, shared with the decryption threads.
    secret: Arc<SecretKey>,
    /// Its public half, base64, for `register_public_key`.
    public_b64: String,
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
    /// Heartbeat period.
    heartbeat: Duration,
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
        conn: &Connection,
        limits: ReceiverLimits,
        stats: Arc<ReceiverStats>,
    ) -> Result<Session, ReceiverError> {
        let hello = conn.hello();
        if hello.role != "receiver" && hello.role != "admin" {
            return Err(ReceiverError::NotReceiver {
                client_id: hello.client_id.clone(),
                role: hello.role.clone(),
            });
        }
        let cn = hello.client_id.clone();
        let (queue, routing_key) = config.names(&cn)?;
        let secret = key_file::read_secret_key(&config.private_key_for(&cn))?;
        let public_b64 = crypto::public_key_to_base64(&secret.public_key());
        let journal = Journal::open(&config.output_file(&queue))?;
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
            public_b64,
            queue,
            routing_key,
            journal,
            limits,
            stats,
            batch_size: config.batch_size,
            batch_delay: Duration::from_millis(config.batch_delay_ms),
            heartbeat: Duration::from_secs(config.heartbeat_secs),
            prefetch: config.prefetch,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            last_delivery: Instant::now(),
        })
    }

    /// Declares, binds, registers the key and starts consuming, pipelined: five
    /// commands, five replies in order (deliveries only follow `OK consume`).
    async fn setup(
        &self,
        conn: &mut Connection,
        config: &ReceiverConfig,
    ) -> Result<(), SetupError> {
        let (ex, q, key) = (&config.exchange_name, &self.queue, &self.routing_key);
        let steps = [
            (
                format!("declare_exchange {ex} {}", config.exchange_type),
                format!("OK declare_exchange {ex}"),
            ),
            (
                format!("declare_queue {q}"),
                format!("OK declare_queue {q}"),
            ),
            (
                format!("bind {q} {ex} {key}"),
                format!("OK bind {q} {ex} {key}"),
            ),
            (
                format!("register_public_key {}", self.public_b64),
                "Public key registered".to_owned(),
            ),
            (
                format!("consume {q} {}", self.prefetch),
                format!("OK consume {q}"),
            ),
        ];
        for (command, _) in &steps {
            conn.queue_line(command);
        }
        conn.flush().await.map_err(SetupError::Lost)?;
        for (command, expected) in &steps {
            let reply = conn
                .read_line()
                .await
                .map_err(SetupError::Lost)?
                .ok_or(SetupError::Lost(ClientError::Closed))?;
            if &reply != expected {
                // Never echo the key itself into an error.
                let command = command
                    .split(' ')
                    .take(if command.starts_with("register_public_key") {
                        1
                    } else {
                        4
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                return Err(SetupError::Fatal(ReceiverError::Refused { command, reply }));
            }
        }
        tracing::info!(queue = %self.queue, prefetch = self.prefetch, "public key registered; consuming");
        Ok(())
    }

    /// The consume loop of one connection.
    async fn consume(
        &mut self,
        conn: Connection,
        shutdown: &mut Shutdown<'_>,
    ) -> Result<End, ReceiverError> {
        let (mut reader, writer) = conn.into_split();
        let (lines, mut writer_task) = line_writer::spawn(writer);
        let mut link = Link {
            lines,
            owed: VecDeque::new(),
            acks_after_commit: Vec::new(),
        };
        let mut opener = Opener::new(self.secret.clone(), &self.cn, self.workers);
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + self.heartbeat, self.heartbeat);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
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
                    for o in opened.unwrap_or_default() {
                        self.on_opened(o, &mut link);
                    }
                    // Nothing more to decrypt right now: make the batch durable.
                    if opener.is_idle() && !self.commit(&mut link, &opener)? {
                        break End::Lost("the connection's writer stopped".to_owned());
                    }
                }
                line = reader.read_line() => match line {
                    Ok(Some(line)) => {
                        if self.on_line(&line, &mut link, &mut opener) {
                            batch_deadline.get_or_insert_with(|| Instant::now() + self.batch_delay);
                        }
                    }
                    Ok(None) => break End::Lost("the broker closed the connection".to_owned()),
                    Err(e) => break End::Lost(e.to_string()),
                },
                result = writer_task.handle() => {
                    break End::Lost(match result {
                        Ok(Err(e)) => e.to_string(),
                        _ => "the connection's writer stopped".to_owned(),
                    });
                }
                () = tokio::time::sleep_until(batch_deadline.unwrap_or(far).into()), if batch_deadline.is_some() => {
                    batch_deadline = None;
                    opener.flush();
                    if opener.is_idle() && !self.commit(&mut link, &opener)? {
                        break End::Lost("the connection's writer stopped".to_owned());
                    }
                }
                _ = heartbeat.tick() => {
                    link.owed.push_back(Owed::Heartbeat);
                    if !link.lines.send("heartbeat\n".to_owned()) {
                        break End::Lost("the connection's writer stopped".to_owned());
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
            if self.journal.staged() >= self.batch_size && !self.commit(&mut link, &opener)? {
                break End::Lost("the connection's writer stopped".to_owned());
            }
        };
        // Whatever ended the loop, finish what is being decrypted and make it
        // durable: on a lost connection its acks are lost too, and the messages
        // come back and are deduplicated.
        for o in opener.finish().await {
            self.on_opened(o, &mut link);
        }
        let sent = self.commit(&mut link, &opener)?;
        if let End::Stopped(reason) = &end {
            tracing::info!(?reason, "stopping: acknowledging what is written");
            if sent {
                self.drain(&mut reader, &mut link, writer_task).await;
            }
        }
        Ok(end)
    }

    /// Handles one line; true when work was queued that a commit must follow
    /// (a delivery to open, or an ack waiting for the next commit).
    fn on_line(&mut self, line: &str, link: &mut Link, opener: &mut Opener) -> bool {
        match Reply::parse(line) {
            Reply::Message(delivery) => self.on_delivery(&delivery, link, opener),
            other => {
                self.on_reply(&other, line, link);
                false
            }
        }
    }

    /// A delivery: deduplicate, or hand it to the decryption stage.
    fn on_delivery(&mut self, d: &Delivery<'_>, link: &mut Link, opener: &mut Opener) -> bool {
        self.stats.received.fetch_add(1, Relaxed);
        self.last_delivery = Instant::now();
        // A body this cannot read is refused by the decryption stage; until
        // then it counts as naming no sender.
        let sender = inspect_message(d.body)
            .ok()
            .and_then(|info| info.sender_client_id.map(|s| s.into_owned()));
        if self.journal.contains(sender.as_deref(), d.message_id) {
            // Written (or staged): acknowledge once the file holds it.
            self.stats.duplicates.fetch_add(1, Relaxed);
            tracing::debug!(
                message_id = d.message_id,
                count = d.delivery_count,
                "duplicate; acknowledging without writing"
            );
            link.queue_ack(d.message_id, d.queue);
            return true;
        }
        if opener.contains(sender.as_deref(), d.message_id) {
            // Another copy is being opened; its `ack <id> <queue>` settles both.
            self.stats.duplicates.fetch_add(1, Relaxed);
            return false;
        }
        if self.staging_full() {
            // A limit is reached: leave it unacknowledged for the next run.
            return false;
        }
        opener.push(Received {
            message_id: d.message_id.to_owned(),
            sender_client_id: sender,
            queue: d.queue.to_owned(),
            delivery_count: d.delivery_count,
            body: d.body.to_owned(),
        });
        true
    }

    /// A decrypted delivery: stage it (acked after the commit), or nack it.
    fn on_opened(&mut self, o: Opened, link: &mut Link) {
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
                link.queue_ack(&d.message_id, &d.queue);
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
                link.owed.push_back(Owed::Nack);
                link.lines
                    .send(format!("nack {} {}\n", d.message_id, d.queue));
            }
        }
    }

    /// A reply to one of our commands, matched by order.
    fn on_reply(&mut self, reply: &Reply<'_>, line: &str, link: &mut Link) {
        let Some(owed) = link.owed.pop_front() else {
            tracing::warn!(line, "reply to no command; ignored");
            return;
        };
        match (owed, reply) {
            // Ids the broker no longer holds for us (after a reconnect the old
            // connection's deliveries come back and are deduplicated) are not
            // counted in the reply.
            (Owed::AckBatch, Reply::Ok(text)) if text.starts_with("ack_batch ") => {
                let settled = text.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok());
                match settled {
                    Some(n) => {
                        self.stats.acked.fetch_add(n, Relaxed);
                    }
                    None => tracing::warn!(line, "unexpected ack_batch reply"),
                }
            }
            (Owed::Nack, Reply::NackConfirmed(_)) => {}
            (Owed::Heartbeat, Reply::Ok(text)) if *text == "heartbeat" => {}
            (owed, _) => tracing::warn!(?owed, line, "unexpected reply"),
        }
    }

    /// Commits staged records, then sends the acks that waited for it; false if
    /// the writer task is gone (the acks are then lost with the connection, and the
    /// messages come back and are deduplicated).
    ///
    /// An ack whose id `opener` is still decrypting (another sender's message
    /// with the same id) waits for a later commit: it would settle that
    /// delivery too, before it is on disk.
    fn commit(&mut self, link: &mut Link, opener: &Opener) -> Result<bool, ReceiverError> {
        let written = self.journal.commit()?;
        self.stats.written.fetch_add(written as u64, Relaxed);
        if link.acks_after_commit.is_empty() {
            return Ok(true);
        }
        let (held, acks): (Vec<PendingAck>, Vec<PendingAck>) =
            std::mem::take(&mut link.acks_after_commit)
                .into_iter()
                .partition(|ack| opener.holds_id(&ack.message_id));
        link.acks_after_commit = held;
        if acks.is_empty() {
            return Ok(true);
        }
        let lines = ack_batch_lines(&acks);
        link.owed.extend(std::iter::repeat_n(
            Owed::AckBatch,
            lines.matches('\n').count(),
        ));
        Ok(link.lines.send(lines))
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

    /// Waits (bounded) for the replies still owed, ignoring new deliveries (they
    /// stay unacknowledged and are redelivered), then says `quit`.
    async fn drain(
        &mut self,
        reader: &mut ConnectionReader,
        link: &mut Link,
        writer_task: WriterTask,
    ) {
        let _ = tokio::time::timeout(DRAIN_WAIT, async {
            while !link.owed.is_empty() {
                match reader.read_line().await {
                    Ok(Some(line)) => match Reply::parse(&line) {
                        Reply::Message(_) => {}
                        reply => self.on_reply(&reply, &line, link),
                    },
                    _ => return,
                }
            }
        })
        .await;
        if link.lines.send("quit\n".to_owned()) {
            let _ = tokio::time::timeout(QUIT_WAIT, async {
                while let Ok(Some(line)) = reader.read_line().await {
                    if line == "OK bye" {
                        break;
                    }
                }
            })
            .await;
        }
        drop(writer_task);
    }
}

/// The writing side of one connection and what it owes.
struct Link {
    /// Commands to the writer task.
    lines: LineSender,
    /// Replies owed, in command order.
    owed: VecDeque<Owed>,
    /// `ack` lines to send once the current batch is durable.
    acks_after_commit: Vec<PendingAck>,
}

impl Link {
    /// Queues `ack <id> <queue>` for after the next commit.
    fn queue_ack(&mut self, message_id: &str, queue: &str) {
        self.acks_after_commit.push(PendingAck {
            message_id: message_id.to_owned(),
            queue: queue.to_owned(),
        });
    }
}

/// Longest `ack_batch` line the receiver writes, bytes: far below the
/// broker's default `performance.max_line_bytes` (1 MiB + 4 KiB).
const ACK_BATCH_LINE_BYTES: usize = 32 * 1024;

/// `acks` as `ack_batch <queue> <id> …` lines: one per queue in the order
/// the queues first appear, split where a line would pass
/// [`ACK_BATCH_LINE_BYTES`].
fn ack_batch_lines(acks: &[PendingAck]) -> String {
    let mut queues: Vec<&str> = Vec::new();
    for ack in acks {
        if !queues.contains(&ack.queue.as_str()) {
            queues.push(&ack.queue);
        }
    }
    let mut out = String::new();
    for queue in queues {
        let mut open = 0usize;
        for ack in acks.iter().filter(|a| a.queue == queue) {
            if open > 0 && open + 1 + ack.message_id.len() > ACK_BATCH_LINE_BYTES {
                out.push('\n');
                open = 0;
            }
            if open == 0 {
                let start = out.len();
                out.push_str("ack_batch ");
                out.push_str(queue);
                open = out.len() - start;
            }
            out.push(' ');
            out.push_str(&ack.message_id);
            open += 1 + ack.message_id.len();
        }
        if open > 0 {
            out.push('\n');
        }
    }
    out
}

/// An `ack` waiting for a commit.
struct PendingAck {
    /// The id it settles (every delivery of it from its queue).
    message_id: String,
    /// The queue it came from.
    queue: String,
}

/// Seconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod ack_line_tests {
    use super::*;

    fn ack(id: &str, queue: &str) -> PendingAck {
        PendingAck {
            message_id: id.into(),
            queue: queue.into(),
        }
    }

    #[test]
    fn acks_become_one_batch_line_per_queue_split_at_the_line_cap() {
        let acks = [ack("a", "q1"), ack("b", "q2"), ack("c", "q1")];
        assert_eq!(ack_batch_lines(&acks), "ack_batch q1 a c\nack_batch q2 b\n");
        assert_eq!(ack_batch_lines(&[]), "");
        let id = "x".repeat(200);
        let many: Vec<PendingAck> = (0..400).map(|_| ack(&id, "q")).collect();
        let lines = ack_batch_lines(&many);
        let lines: Vec<&str> = lines.lines().collect();
        assert!(lines.len() > 1);
        assert!(lines
            .iter()
            .all(|l| l.len() <= ACK_BATCH_LINE_BYTES && l.starts_with("ack_batch q ")));
        let ids: usize = lines.iter().map(|l| l.split(' ').count() - 2).sum();
        assert_eq!(ids, 400);
    }
}
