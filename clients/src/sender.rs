//! The reference sender as a library: [`run_sender`] encrypts every message for
//! every configured receiver and publishes it through a [`Publisher`], retrying
//! and reconnecting until each copy is acknowledged or has failed.
//!
//! Three parts:
//! - a source thread renders or reads plaintexts (`message_source`);
//! - the encryption stage encrypts them in parallel on blocking threads, in
//!   chunks, keeping their order, and hands prepared publishes
//!   ([`PreparedPublish`]) to the pump through a bounded channel (so encryption
//!   never runs far ahead of the network);
//! - the pump keeps at most `max_inflight` publishes going (the publishers
//!   pipeline them, match replies and retry retryable NACKs), and when a
//!   connection is lost or stuck (no reply within `ack_timeout_secs`)
//!   connects again and re-publishes what was in flight (safe: the broker
//!   deduplicates per sender and message id).
//!
//! In a cluster the sender publishes each receiver's copies on the node
//! holding that receiver, with one connection per node ([`routes`]), and
//! follows `NACK <id> moved …` (at most [`MAX_REDIRECTS`] times per message,
//! with the same id) when a receiver moves while it runs.
//!
//! Receivers' public keys are pinned on first use in `known_receivers`
//! (`public_keys`): a key that changed stops the sender before anything is
//! encrypted for it.
//!
//! Message ids are `{sender_id}-{correlation_id}-{receiver_id}` with correlation
//! id `{run_id}.{seq}`: unique across runs unless a run id is reused on purpose
//! (to resume a run, whose already-delivered messages the broker and the receiver
//! then drop as duplicates).
//!
//! Every body names its sender (`sender_client_id`, the CN of the broker's
//! `HELLO`), which the broker verifies: a receiver deduplicates by sender and
//! id, so another sender using the same id cannot get our message dropped.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt as _};
use tokio::sync::mpsc;

use crate::client::cluster::MAX_REDIRECTS;
use crate::client::{
    Ack, ClientConfig, ConnectError, Disconnected, FilePins, PinStoreError, PreparedPublish,
    PublishError, Publisher, RequestError, RetryPolicy,
};
use crate::client_config::ConfigError;
use crate::connection::ClientError;
use crate::crypto::{self, CryptoError, PublicKey};
use crate::message_source::{correlation_id, Contents};
use crate::public_keys;
use crate::reconnect::{dial_first, DialedClient, FirstConnectError, QUIT_WAIT};
use crate::sender_config::SenderConfig;
use crate::shutdown::Shutdown;
use crate::task_guard::AbortOnDrop;

mod routes;
use routes::{Routes, Unconnected};

/// Plaintexts per encryption job: large enough to amortise a thread hand-off,
/// small enough to keep several workers busy on a short run.
const CHUNK: usize = 64;

/// Why the sender stopped before settling every message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SenderError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS files could not be loaded.
    #[error("cannot load the TLS configuration: {0}")]
    Tls(ClientError),
    /// The first connection could not be made (nothing was sent).
    #[error(transparent)]
    FirstConnect(#[from] FirstConnectError),
    /// Reconnecting failed in a way retrying cannot fix, or too many times in a row.
    #[error("cannot connect to the broker: {0}")]
    Connect(ConnectError),
    /// The pin file of receivers' keys could not be read or written.
    #[error(transparent)]
    Pins(#[from] PinStoreError),
    /// A receiver's public key at the broker differs from the one pinned.
    #[error(
        "the public key of receiver {receiver} changed: pinned {pinned}, the broker offers {offered}. \
         Nothing was sent. If {receiver} rotated its key on purpose, delete its line in {} and run again; \
         otherwise someone (the broker included) may be substituting keys",
        pin_file.display()
    )]
    KeyChanged {
        /// The receiver.
        receiver: String,
        /// The pinned key (base64).
        pinned: String,
        /// The key the broker offers (base64).
        offered: String,
        /// The pin file.
        pin_file: PathBuf,
    },
    /// A receiver's key could not be obtained or pinned.
    #[error("public key of {receiver}: {error}")]
    Keys {
        /// The receiver.
        receiver: String,
        /// What failed.
        error: PublishError,
    },
    /// The broker refused a command the sender needs (for example
    /// `get_public_key` for a CN without the sender role).
    #[error("the broker refused: {0}")]
    Refused(String),
    /// Our certificate's CN is not a sender (or admin) in the broker's ACL.
    #[error("connected as {client_id} with role {role}; publishing needs the sender role (add the CN to acl.sender_cns)")]
    NotSender {
        /// Our CN as the broker sees it.
        client_id: String,
        /// The role the broker gave it.
        role: String,
    },
    /// No key for a receiver: neither registered at the broker nor cached.
    #[error("no public key for receiver {receiver}: the broker has none (start the receiver first, it registers its key) and the cache is unusable: {cache}")]
    NoPublicKey {
        /// The receiver.
        receiver: String,
        /// Why the cached key file could not be used.
        cache: String,
    },
    /// The broker answered something the protocol does not allow here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Reading the messages (`--file`, stdin) failed.
    #[error("cannot read the messages: {0}")]
    Input(std::io::Error),
    /// Encryption failed.
    #[error("cannot encrypt: {0}")]
    Crypto(CryptoError),
    /// Message ids would break the 255-byte name rule.
    #[error("message ids would be longer than 255 bytes (sender {sender_id}, run id {run_id}); use shorter names or --run-id")]
    IdTooLong {
        /// Our CN.
        sender_id: String,
        /// The run id.
        run_id: String,
    },
}

// The causes are part of each variant's message, not its `source()`: a
// report that prints the chain (`{:#}`) would print them twice.
impl From<ClientError> for SenderError {
    fn from(e: ClientError) -> Self {
        SenderError::Tls(e)
    }
}

impl From<ConnectError> for SenderError {
    fn from(e: ConnectError) -> Self {
        SenderError::Connect(e)
    }
}

impl From<CryptoError> for SenderError {
    fn from(e: CryptoError) -> Self {
        SenderError::Crypto(e)
    }
}

/// Live counters, shared with whoever shows progress. Every message counts once
/// per receiver.
#[derive(Debug, Default)]
pub struct SenderStats {
    /// Messages expected in all, when known in advance (0: unknown).
    pub total: AtomicU64,
    /// Messages published at least once.
    pub sent: AtomicU64,
    /// Messages acknowledged by the broker (durable there).
    pub acked: AtomicU64,
    /// Messages given up on.
    pub failed: AtomicU64,
    /// Publishes repeated after a retriable NACK or an ACK timeout.
    pub retries: AtomicU64,
    /// Connections replaced after a failure.
    pub reconnects: AtomicU64,
    /// Publishes sent again to another node after `NACK <id> moved …`.
    pub redirects: AtomicU64,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct SenderReport {
    /// Our CN.
    pub sender_id: String,
    /// The run id in every message id.
    pub run_id: String,
    /// Messages published at least once.
    pub sent: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Messages given up on (refused, or retries exhausted).
    pub failed: u64,
    /// Messages never settled because the run was interrupted.
    pub unsent: u64,
    /// Publishes repeated after a retriable NACK or an ACK timeout.
    pub retries: u64,
    /// Connections replaced.
    pub reconnects: u64,
    /// Publishes sent again to another node after `NACK <id> moved …`.
    pub redirects: u64,
    /// From the first publish to the last reply.
    pub elapsed: Duration,
}

impl SenderReport {
    /// Acknowledged messages per second over [`SenderReport::elapsed`].
    pub fn msgs_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.acked as f64 / secs
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for SenderReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {}, acked {}, failed {}, unsent {}, retries {}, reconnects {} in {:.2} s: {:.0} msg/s",
            self.sent,
            self.acked,
            self.failed,
            self.unsent,
            self.retries,
            self.reconnects,
            self.elapsed.as_secs_f64(),
            self.msgs_per_sec()
        )?;
        if self.redirects > 0 {
            write!(f, " ({} redirected to another node)", self.redirects)?;
        }
        Ok(())
    }
}

/// What to send in one run.
#[derive(Debug)]
pub struct SendJob {
    /// The plaintexts; each goes to every receiver of the config.
    pub contents: Contents,
    /// The run id in message ids; a random one when `None`.
    pub run_id: Option<String>,
}

/// Runs the sender until every message is settled, the shutdown future fires
/// (publishes in flight are then awaited, nothing new is sent), or a failure that
/// retrying cannot fix.
pub async fn run_sender<F>(
    config: &SenderConfig,
    job: SendJob,
    stats: Arc<SenderStats>,
    shutdown: F,
) -> Result<SenderReport, SenderError>
where
    F: Future<Output = ()> + Send,
{
    config.validate()?;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut shutdown = Shutdown::new(shutdown.as_mut());
    let tls = config.tls.options();
    let p = &config.sender;
    let pin_file = config.known_receivers_path();
    let seeds = crate::client_config::seed_addresses(&config.server_address)?;
    let mut client_config =
        ClientConfig::with_connector(seeds[0].clone(), tls.connector()?, tls.server_name()?)
            .publish_window(p.max_inflight)
            .retry(RetryPolicy {
                max_attempts: p.max_retries.saturating_add(1),
                backoff: p.backoff(),
            })
            .reply_timeout(p.ack_timeout())
            .key_pins(Arc::new(FilePins::open(&pin_file)?));
    let run_id = match job.run_id {
        Some(id) => {
            crate::client_config::check_name("--run-id", &id)?;
            id
        }
        None => random_run_id(),
    };
    let mut report = SenderReport {
        sender_id: String::new(),
        run_id: run_id.clone(),
        sent: 0,
        acked: 0,
        failed: 0,
        unsent: 0,
        retries: 0,
        reconnects: 0,
        redirects: 0,
        elapsed: Duration::ZERO,
    };

    // A first connection that fails is a wrong address or a broker not
    // started: said at once, unless asked to wait. Reconnects back off.
    let client = match dial_first(
        &mut client_config,
        &seeds,
        p.backoff(),
        Duration::from_secs(p.wait_for_broker_secs),
        &mut shutdown,
    )
    .await?
    {
        DialedClient::Connected(client) => client,
        DialedClient::Stopped => return Ok(report),
    };
    if !client.role().can_publish() {
        return Err(SenderError::NotSender {
            client_id: client.client_id().to_owned(),
            role: client.role().to_string(),
        });
    }
    let sender_id = client.client_id().to_owned();
    report.sender_id = sender_id.clone();
    let longest = config.receivers.iter().map(String::len).max().unwrap_or(0);
    if sender_id.len() + run_id.len() + longest + 23 > 255 {
        return Err(SenderError::IdTooLong { sender_id, run_id });
    }
    tracing::info!(sender_id = %sender_id, run_id = %run_id, receivers = ?config.receivers, "connected");
    let keys = tokio::select! {
        r = public_keys::fetch(&client, &config.receivers, &config.keys_dir, &pin_file, Duration::from_secs(p.key_wait_secs)) => r?,
        () = shutdown.wait() => return Ok(report),
    };

    if let Some(n) = job.contents.len_hint() {
        stats
            .total
            .store(n.saturating_mul(config.receivers.len() as u64), Relaxed);
    }
    let targets: Vec<Target> = config
        .receivers
        .iter()
        .filter_map(|r| {
            keys.get(r).map(|key| Target {
                receiver_id: r.clone(),
                routing_key: config.routing_key_for(r),
                key: key.clone(),
            })
        })
        .collect();

    // In a cluster, each receiver's node; one connection per node.
    let mut routes = Routes::new(client, client_config, targets.len());
    let names: Vec<&str> = targets.iter().map(|t| t.receiver_id.as_str()).collect();
    routes.locate(&names).await;
    if !routes
        .connect(&sender_id, p.backoff(), p.reconnect_attempts, &mut shutdown)
        .await?
    {
        return Ok(report);
    }

    let stage_ctx = Arc::new(StageContext {
        sender_id: sender_id.clone(),
        run_id: run_id.clone(),
        exchange: config.exchange_name.clone(),
        targets,
    });
    let (tx, rx) = mpsc::channel(p.max_inflight.max(CHUNK));
    let mut stage = AbortOnDrop(tokio::spawn(encrypt_stage(
        job.contents,
        stage_ctx,
        tx,
        p.workers(),
    )));

    let started = Instant::now();
    let mut pump = Pump {
        rx,
        input_done: false,
        requeue: VecDeque::new(),
        max_inflight: p.max_inflight,
        max_retries: p.max_retries,
        stats: &stats,
    };
    loop {
        match pump.run(&mut routes, &mut shutdown).await {
            PumpEnd::Finished => {
                let closing = routes.clients().map(|c| c.close());
                let _ =
                    tokio::time::timeout(QUIT_WAIT, futures_util::future::join_all(closing)).await;
                break;
            }
            PumpEnd::Lost(reason) => {
                if shutdown.fired() {
                    tracing::warn!(%reason, "connection lost while stopping; not reconnecting");
                    break;
                }
                if pump.input_done && pump.requeue.is_empty() {
                    break;
                }
                stats.reconnects.fetch_add(1, Relaxed);
                tracing::warn!(%reason, "connection lost; reconnecting");
            }
            PumpEnd::Unconnected(node) => {
                if shutdown.fired() {
                    break;
                }
                tracing::info!(address = %node.address, "connecting to a receiver's new node");
            }
        }
        if !routes
            .connect(&sender_id, p.backoff(), p.reconnect_attempts, &mut shutdown)
            .await?
        {
            break;
        }
    }
    report.elapsed = started.elapsed();

    // Whatever was not settled now never will be: stop the stage and count.
    let mut unsent = pump.requeue.len() as u64;
    if !pump.input_done {
        stage.0.abort();
        while let Ok(_msg) = pump.rx.try_recv() {
            unsent += 1;
        }
    } else {
        match (&mut stage.0).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => {
                return Err(SenderError::Protocol(format!(
                    "encryption stage failed: {e}"
                )))
            }
        }
    }
    report.sent = stats.sent.load(Relaxed);
    report.acked = stats.acked.load(Relaxed);
    report.failed = stats.failed.load(Relaxed);
    report.retries = stats.retries.load(Relaxed);
    report.reconnects = stats.reconnects.load(Relaxed);
    report.redirects = stats.redirects.load(Relaxed);
    // With a known total, what was never produced counts too.
    let total = stats.total.load(Relaxed);
    report.unsent = if total > 0 {
        total.saturating_sub(report.acked + report.failed)
    } else {
        unsent
    };
    Ok(report)
}

/// One encrypted message on its way.
struct Outgoing {
    /// The publish, rendered once, sent as often as needed.
    prepared: PreparedPublish,
    /// Whether it was handed to a publisher before (for the `sent` count).
    sent: bool,
    /// Connections given up on for want of a reply while it was in flight.
    timeouts: u32,
    /// Its receiver's place in [`StageContext::targets`] (its route).
    target: usize,
    /// Redirects followed (`NACK <id> moved …`).
    redirects: u32,
}

impl Outgoing {
    /// A message for `target` never sent.
    fn new(prepared: PreparedPublish, target: usize) -> Outgoing {
        Outgoing {
            prepared,
            sent: false,
            timeouts: 0,
            target,
            redirects: 0,
        }
    }
}

/// How a connection's pump ended.
enum PumpEnd {
    /// Everything settled, or the shutdown signal fired and the publishes in
    /// flight were answered.
    Finished,
    /// A connection failed or stalled; the reason is for the log.
    Lost(Arc<Disconnected>),
    /// A message must go to a node not connected yet (a receiver moved).
    Unconnected(Unconnected),
}

/// The publish loop's state, kept across connections.
struct Pump<'a> {
    /// Encrypted messages from the stage.
    rx: mpsc::Receiver<Outgoing>,
    /// The stage has delivered everything.
    input_done: bool,
    /// Messages whose connection was lost before their reply, to publish again
    /// first.
    requeue: VecDeque<Outgoing>,
    /// Most publishes in flight.
    max_inflight: usize,
    /// Connections lost to an ACK timeout a message may see before it fails.
    max_retries: u32,
    /// Live counters.
    stats: &'a SenderStats,
}

/// A publish in flight: the message comes back with its outcome.
type InFlight =
    std::pin::Pin<Box<dyn Future<Output = (Outgoing, Result<Ack, PublishError>)> + Send>>;

impl Pump<'_> {
    /// Publishes through `routes` until done, stopped, a connection is lost,
    /// or a message needs a node not connected yet.
    async fn run(&mut self, routes: &mut Routes, shutdown: &mut Shutdown<'_>) -> PumpEnd {
        let mut inflight: FuturesUnordered<InFlight> = FuturesUnordered::new();
        let mut lost: Option<PumpEnd> = None;
        loop {
            let stopping = shutdown.fired();
            // Fill the window: messages to publish again first, then new ones.
            while lost.is_none() && !stopping && inflight.len() < self.max_inflight {
                let msg = match self.requeue.pop_front() {
                    Some(msg) => msg,
                    None if self.input_done => break,
                    None => match self.rx.try_recv() {
                        Ok(msg) => msg,
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            self.input_done = true;
                            break;
                        }
                    },
                };
                match self.start(routes, msg) {
                    Ok(publish) => inflight.push(publish),
                    Err(node) => lost = Some(PumpEnd::Unconnected(node)),
                }
            }
            if inflight.is_empty() {
                if let Some(end) = lost {
                    return end;
                }
                if stopping || (self.input_done && self.requeue.is_empty()) {
                    return PumpEnd::Finished;
                }
            }
            let can_take = lost.is_none()
                && !stopping
                && !self.input_done
                && inflight.len() < self.max_inflight;
            tokio::select! {
                biased;
                Some((msg, result)) = inflight.next(), if !inflight.is_empty() => {
                    if let Some(reason) = self.settle(routes, msg, result) {
                        lost.get_or_insert(PumpEnd::Lost(reason));
                    }
                }
                msg = self.rx.recv(), if can_take => match msg {
                    Some(msg) => match self.start(routes, msg) {
                        Ok(publish) => inflight.push(publish),
                        Err(node) => lost = Some(PumpEnd::Unconnected(node)),
                    },
                    None => self.input_done = true,
                },
                () = shutdown.wait(), if !stopping => {
                    tracing::info!(inflight = inflight.len(), "stopping: waiting for the replies to publishes in flight");
                }
            }
        }
    }

    /// Publishes `msg` on its receiver's node, counting its first publish;
    /// when that node is not connected, puts it back first in line.
    fn start(&mut self, routes: &Routes, mut msg: Outgoing) -> Result<InFlight, Unconnected> {
        let publisher = match routes.publisher(msg.target) {
            Ok(publisher) => publisher.clone(),
            Err(node) => {
                self.requeue.push_front(msg);
                return Err(node);
            }
        };
        if !msg.sent {
            msg.sent = true;
            self.stats.sent.fetch_add(1, Relaxed);
        }
        Ok(Box::pin(async move {
            let result = publisher.publish_prepared(&msg.prepared).await;
            (msg, result)
        }))
    }

    /// Counts and logs a publish's outcome; the reason when its connection was
    /// lost (the message then waits in `requeue`). A redirect teaches
    /// `routes` the receiver's new node and puts the message back in line.
    fn settle(
        &mut self,
        routes: &mut Routes,
        mut msg: Outgoing,
        result: Result<Ack, PublishError>,
    ) -> Option<Arc<Disconnected>> {
        let message_id = msg.prepared.message_id().to_owned();
        match result {
            Ok(ack) => {
                self.stats.acked.fetch_add(1, Relaxed);
                self.stats
                    .retries
                    .fetch_add(u64::from(ack.attempts.saturating_sub(1)), Relaxed);
                None
            }
            Err(PublishError::Request(RequestError::ConnectionLost(reason))) => {
                if matches!(*reason, Disconnected::ReplyTimeout(_)) {
                    msg.timeouts += 1;
                    if msg.timeouts > self.max_retries {
                        self.stats.failed.fetch_add(1, Relaxed);
                        tracing::error!(%message_id, reason = "ack timeout", retries = self.max_retries, "message failed");
                        return Some(reason);
                    }
                    self.stats.retries.fetch_add(1, Relaxed);
                }
                self.requeue.push_back(msg);
                Some(reason)
            }
            Err(PublishError::Moved(moved)) if msg.redirects < MAX_REDIRECTS => {
                msg.redirects += 1;
                self.stats.redirects.fetch_add(1, Relaxed);
                routes.learn(msg.target, &moved);
                self.requeue.push_back(msg);
                None
            }
            Err(PublishError::Nack {
                reason, attempts, ..
            }) => {
                self.stats.failed.fetch_add(1, Relaxed);
                self.stats
                    .retries
                    .fetch_add(u64::from(attempts.saturating_sub(1)), Relaxed);
                tracing::error!(%message_id, %reason, attempts, "message failed: refused by the broker");
                None
            }
            Err(error) => {
                self.stats.failed.fetch_add(1, Relaxed);
                tracing::error!(%message_id, %error, "message failed");
                None
            }
        }
    }
}

/// A receiver as the encryption stage needs it.
struct Target {
    /// Its client id (the CN its certificate carries).
    receiver_id: String,
    /// Routing key of its copies.
    routing_key: String,
    /// Its X25519 public key.
    key: PublicKey,
}

/// What every encryption job shares.
struct StageContext {
    /// Our CN.
    sender_id: String,
    /// This run's id.
    run_id: String,
    /// Exchange of every publish.
    exchange: String,
    /// Every receiver.
    targets: Vec<Target>,
}

/// Reads plaintexts on a thread of their own (stdin blocks), encrypts them in
/// chunks on up to `workers` blocking threads, and sends the publishes in order.
async fn encrypt_stage(
    contents: Contents,
    ctx: Arc<StageContext>,
    tx: mpsc::Sender<Outgoing>,
    workers: usize,
) -> Result<(), SenderError> {
    let workers = workers.max(1);
    let (chunk_tx, mut chunk_rx) =
        mpsc::channel::<std::io::Result<Vec<(u64, String)>>>(workers * 2);
    let (sender_id, run_id) = (ctx.sender_id.clone(), ctx.run_id.clone());
    std::thread::Builder::new()
        .name("ciphermq-sender-source".to_owned())
        .spawn(move || {
            let mut chunk = Vec::with_capacity(CHUNK);
            for item in contents.messages(&sender_id, &run_id) {
                match item {
                    Ok(pair) => chunk.push(pair),
                    Err(e) => {
                        let _ = chunk_tx.blocking_send(Err(e));
                        return;
                    }
                }
                if chunk.len() == CHUNK
                    && chunk_tx
                        .blocking_send(Ok(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK))))
                        .is_err()
                {
                    return;
                }
            }
            if !chunk.is_empty() {
                let _ = chunk_tx.blocking_send(Ok(chunk));
            }
        })
        .map_err(SenderError::Input)?;

    let mut jobs = VecDeque::new();
    let mut source_done = false;
    loop {
        while !source_done && jobs.len() < workers {
            let next = if jobs.is_empty() {
                chunk_rx.recv().await
            } else {
                match chunk_rx.try_recv() {
                    Ok(chunk) => Some(chunk),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            match next {
                None => source_done = true,
                Some(Err(e)) => return Err(SenderError::Input(e)),
                Some(Ok(chunk)) => {
                    let ctx = ctx.clone();
                    jobs.push_back(AbortOnDrop(tokio::task::spawn_blocking(move || {
                        encrypt_chunk(&ctx, chunk)
                    })));
                }
            }
        }
        let Some(mut job) = jobs.pop_front() else {
            return Ok(());
        };
        let encrypted = (&mut job.0)
            .await
            .map_err(|e| SenderError::Protocol(format!("encryption worker failed: {e}")))??;
        for msg in encrypted {
            if tx.send(msg).await.is_err() {
                // The pump stopped taking messages (shutdown).
                return Ok(());
            }
        }
    }
}

/// Encrypts a chunk of plaintexts for every receiver.
fn encrypt_chunk(
    ctx: &StageContext,
    chunk: Vec<(u64, String)>,
) -> Result<Vec<Outgoing>, SenderError> {
    let mut rng = rand::thread_rng();
    let mut out = Vec::with_capacity(chunk.len() * ctx.targets.len());
    for (seq, text) in chunk {
        let correlation = correlation_id(&ctx.run_id, seq);
        for (index, target) in ctx.targets.iter().enumerate() {
            let message_id = format!("{}-{correlation}-{}", ctx.sender_id, target.receiver_id);
            let mut body = crypto::encrypt_with_rng(
                &mut rng,
                &target.key,
                &message_id,
                &target.receiver_id,
                text.as_bytes(),
            )?;
            // The broker checks it is our CN; receivers deduplicate per sender.
            body.sender_client_id = Some(ctx.sender_id.clone());
            let prepared =
                Publisher::prepare(&ctx.exchange, &target.routing_key, &body).map_err(|error| {
                    SenderError::Keys {
                        receiver: target.receiver_id.clone(),
                        error,
                    }
                })?;
            out.push(Outgoing::new(prepared, index));
        }
    }
    Ok(out)
}

/// Eight random lowercase hex digits: distinct runs get distinct message ids.
pub fn random_run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_names_its_sender_and_opens_for_its_receiver() {
        let secret = crypto::generate_secret_key();
        let ctx = StageContext {
            sender_id: "sender_1".into(),
            run_id: "run".into(),
            exchange: "ex".into(),
            targets: vec![Target {
                receiver_id: "receiver_1".into(),
                routing_key: "receiver_1".into(),
                key: secret.public_key(),
            }],
        };
        let out = encrypt_chunk(&ctx, vec![(1, "hello".into())]).unwrap();
        assert_eq!(out.len(), 1);
        let json = out[0]
            .prepared
            .line()
            .strip_prefix("publish ex receiver_1 ")
            .unwrap();
        // What the broker reads: the sender named, as our CN.
        let info = ciphermq_proto::message::inspect_message(json).unwrap();
        assert_eq!(info.message_id, out[0].prepared.message_id());
        assert_eq!(info.sender_client_id.as_deref(), Some("sender_1"));
        let body: crypto::EncryptedInputData = serde_json::from_str(json).unwrap();
        assert_eq!(crypto::decrypt(&secret, &body).unwrap(), b"hello");
    }
}
