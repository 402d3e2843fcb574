//! The reference sender as a library: [`run_sender`] encrypts every message for
//! every configured receiver and publishes it through one pipelined connection,
//! retrying and reconnecting until each copy is acknowledged or has failed.
//!
//! Three parts:
//! - a source thread renders or reads plaintexts (`message_source`);
//! - the encryption stage encrypts them in parallel on blocking threads, in
//!   chunks, keeping their order, and hands `publish` lines to the pump through a
//!   bounded channel (so encryption never runs far ahead of the network);
//! - the pump keeps at most `max_inflight` publishes unanswered on the
//!   connection, matches replies to publishes by order (`outbox`), and on a lost
//!   or stuck connection reconnects and re-publishes what was in flight (safe: the
//!   broker deduplicates per sender and message id).
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
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::client_config::ConfigError;
use crate::connection::{ClientError, Connection, ConnectionReader};
use crate::crypto::{self, CryptoError, PublicKey};
use crate::line_writer::{self, AbortOnDrop, LineSender};
use crate::message_source::{correlation_id, Contents};
use crate::outbox::{Outbox, Outgoing, Settled};
use crate::public_keys;
use crate::reconnect::{Dialed, Dialer, QUIT_WAIT};
use crate::sender_config::SenderConfig;
use crate::shutdown::Shutdown;

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
    /// Connecting failed in a way retrying cannot fix, or too many times in a row.
    #[error("cannot connect to the broker: {0}")]
    Connect(#[from] ClientError),
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
    Input(#[source] std::io::Error),
    /// Encryption failed.
    #[error("cannot encrypt: {0}")]
    Crypto(#[from] CryptoError),
    /// Message ids would break the 255-byte name rule.
    #[error("message ids would be longer than 255 bytes (sender {sender_id}, run id {run_id}); use shorter names or --run-id")]
    IdTooLong {
        /// Our CN.
        sender_id: String,
        /// The run id.
        run_id: String,
    },
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
        )
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
/// (in-flight publishes are then awaited, nothing new is sent), or a failure that
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
    let dialer = Dialer {
        addr: config.server_address.clone(),
        connector: tls.connector()?,
        server_name: tls.server_name()?,
        backoff: p.backoff(),
        max_attempts: p.reconnect_attempts,
    };
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
        elapsed: Duration::ZERO,
    };

    let mut conn = match dialer.connect(&mut shutdown).await? {
        Dialed::Connected(conn) => *conn,
        Dialed::Stopped => return Ok(report),
    };
    let hello = conn.hello().clone();
    if hello.role != "sender" && hello.role != "admin" {
        return Err(SenderError::NotSender {
            client_id: hello.client_id,
            role: hello.role,
        });
    }
    let sender_id = hello.client_id.clone();
    report.sender_id = sender_id.clone();
    let longest = config.receivers.iter().map(String::len).max().unwrap_or(0);
    if sender_id.len() + run_id.len() + longest + 23 > 255 {
        return Err(SenderError::IdTooLong { sender_id, run_id });
    }
    tracing::info!(sender_id = %sender_id, run_id = %run_id, receivers = ?config.receivers, "connected");
    let keys = tokio::select! {
        r = public_keys::fetch(&mut conn, &config.receivers, &config.keys_dir, Duration::from_secs(p.key_wait_secs)) => r?,
        () = shutdown.wait() => return Ok(report),
    };

    if let Some(n) = job.contents.len_hint() {
        stats
            .total
            .store(n.saturating_mul(config.receivers.len() as u64), Relaxed);
    }
    let stage_ctx = Arc::new(StageContext {
        sender_id: sender_id.clone(),
        run_id: run_id.clone(),
        exchange: config.exchange_name.clone(),
        targets: config
            .receivers
            .iter()
            .filter_map(|r| {
                keys.get(r).map(|key| Target {
                    receiver_id: r.clone(),
                    routing_key: config.routing_key_for(r),
                    key: key.clone(),
                })
            })
            .collect(),
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
        outbox: Outbox::new(p.max_retries, p.backoff()),
        rx,
        input_done: false,
        max_inflight: p.max_inflight,
        ack_timeout: p.ack_timeout(),
        stats: &stats,
    };
    loop {
        let end = pump.run(conn, &mut shutdown).await;
        let lost = match end {
            PumpEnd::Finished => break,
            PumpEnd::Lost(reason) => reason,
        };
        for settled in pump
            .outbox
            .connection_lost(Instant::now(), pump.ack_timeout)
        {
            pump.count(&settled);
        }
        if shutdown.fired() {
            tracing::warn!(reason = %lost, "connection lost while stopping; not reconnecting");
            break;
        }
        if pump.input_done && pump.outbox.is_empty() {
            break;
        }
        stats.reconnects.fetch_add(1, Relaxed);
        tracing::warn!(reason = %lost, "connection lost; reconnecting");
        conn = match dialer.connect(&mut shutdown).await? {
            Dialed::Connected(c) => *c,
            Dialed::Stopped => break,
        };
        if conn.hello().client_id != sender_id {
            return Err(SenderError::Protocol(format!(
                "reconnected as {} instead of {sender_id}",
                conn.hello().client_id
            )));
        }
    }
    report.elapsed = started.elapsed();

    // Whatever was not settled now never will be: stop the stage and count.
    let mut unsent = pump.outbox.abandon_queued() as u64 + pump.outbox.inflight() as u64;
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
    // With a known total, what was never produced counts too.
    let total = stats.total.load(Relaxed);
    report.unsent = if total > 0 {
        total.saturating_sub(report.acked + report.failed)
    } else {
        unsent
    };
    Ok(report)
}

/// How a connection's pump ended.
enum PumpEnd {
    /// Everything settled, or the shutdown signal fired and in-flight publishes
    /// were answered.
    Finished,
    /// The connection failed or stalled; the reason is for the log.
    Lost(String),
}

/// The publish loop's state, kept across connections.
struct Pump<'a> {
    /// Ready, waiting and in-flight publishes.
    outbox: Outbox,
    /// Encrypted messages from the stage.
    rx: mpsc::Receiver<Outgoing>,
    /// The stage has delivered everything.
    input_done: bool,
    /// Most publishes in flight.
    max_inflight: usize,
    /// Longest wait for a reply.
    ack_timeout: Duration,
    /// Live counters.
    stats: &'a SenderStats,
}

impl Pump<'_> {
    /// Publishes over `conn` until done, stopped, or the connection fails.
    async fn run(&mut self, conn: Connection, shutdown: &mut Shutdown<'_>) -> PumpEnd {
        let (mut reader, writer) = conn.into_split();
        let (lines, mut writer_task) = line_writer::spawn(writer);
        loop {
            let stopping = shutdown.fired();
            if !self.fill_window(&lines, stopping) {
                return PumpEnd::Lost("the connection's writer stopped".to_owned());
            }
            let drained = self.outbox.inflight() == 0
                && (stopping || (self.input_done && self.outbox.queued() == 0));
            if drained {
                quit(&lines, &mut reader).await;
                drop(lines);
                let _ = tokio::time::timeout(QUIT_WAIT, writer_task.finish()).await;
                return PumpEnd::Finished;
            }
            let deadline = self.next_deadline(stopping);
            let can_take =
                !stopping && !self.input_done && self.outbox.inflight() < self.max_inflight;
            tokio::select! {
                biased;
                line = reader.read_line() => match line {
                    Ok(Some(line)) => {
                        match self.outbox.on_reply(&line, Instant::now()) {
                            Ok(settled) => self.count(&settled),
                            Err(desync) => return PumpEnd::Lost(desync.to_string()),
                        }
                    }
                    Ok(None) => return PumpEnd::Lost("the broker closed the connection".to_owned()),
                    Err(e) => return PumpEnd::Lost(e.to_string()),
                },
                result = writer_task.handle() => {
                    let reason = match result {
                        Ok(Err(e)) => e.to_string(),
                        _ => "the connection's writer stopped".to_owned(),
                    };
                    return PumpEnd::Lost(reason);
                }
                msg = self.rx.recv(), if can_take => match msg {
                    Some(msg) => self.outbox.push(msg),
                    None => self.input_done = true,
                },
                () = tokio::time::sleep_until(deadline.into()) => {
                    if self.outbox.timed_out(Instant::now(), self.ack_timeout) {
                        return PumpEnd::Lost(format!(
                            "no reply within the ACK timeout ({} s)",
                            self.ack_timeout.as_secs()
                        ));
                    }
                }
                () = shutdown.wait(), if !stopping => {
                    tracing::info!(inflight = self.outbox.inflight(), "stopping: waiting for the replies to publishes in flight");
                }
            }
        }
    }

    /// Writes publishes until the window is full or nothing is ready; false if
    /// the writer task is gone.
    fn fill_window(&mut self, lines: &LineSender, stopping: bool) -> bool {
        if stopping {
            return true;
        }
        let now = Instant::now();
        let mut batch = String::new();
        while self.outbox.inflight() < self.max_inflight {
            let msg = match self.outbox.next_to_send(now) {
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
            batch.push_str(&msg.line);
            if msg.attempts > 0 {
                self.stats.retries.fetch_add(1, Relaxed);
            }
            if self.outbox.mark_sent(msg, now) {
                self.stats.sent.fetch_add(1, Relaxed);
            }
        }
        batch.is_empty() || lines.send(batch)
    }

    /// The next time something must be checked: a retry coming due, or the
    /// oldest publish reaching the ACK timeout; an hour away if neither.
    fn next_deadline(&self, stopping: bool) -> Instant {
        let timeout = self
            .outbox
            .oldest_inflight_at()
            .map(|at| at + self.ack_timeout);
        let retry = if stopping {
            None
        } else {
            self.outbox.next_retry_at()
        };
        match (timeout, retry) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Counts and logs a settled publish.
    fn count(&self, settled: &Settled) {
        match settled {
            Settled::Acked { .. } => {
                self.stats.acked.fetch_add(1, Relaxed);
            }
            Settled::Retrying {
                message_id,
                reason,
                attempt,
                delay,
            } => {
                tracing::debug!(%message_id, %reason, attempt, delay_ms = delay.as_millis() as u64, "will retry");
            }
            Settled::Failed { message_id, reason } => {
                self.stats.failed.fetch_add(1, Relaxed);
                tracing::error!(%message_id, %reason, "message failed");
            }
            Settled::Ignored => {}
        }
    }
}

/// Sends `quit` and waits briefly for `OK bye`, so the broker logs a clean close.
async fn quit(lines: &LineSender, reader: &mut ConnectionReader) {
    if !lines.send("quit\n".to_owned()) {
        return;
    }
    let _ = tokio::time::timeout(QUIT_WAIT, async {
        while let Ok(Some(line)) = reader.read_line().await {
            if line == "OK bye" {
                break;
            }
        }
    })
    .await;
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
        for target in &ctx.targets {
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
            let json = serde_json::to_string(&body)
                .map_err(|e| SenderError::Protocol(format!("cannot serialise a message: {e}")))?;
            let mut line = String::with_capacity(
                json.len() + ctx.exchange.len() + target.routing_key.len() + 11,
            );
            line.push_str("publish ");
            line.push_str(&ctx.exchange);
            line.push(' ');
            line.push_str(&target.routing_key);
            line.push(' ');
            line.push_str(&json);
            line.push('\n');
            out.push(Outgoing::new(message_id, line));
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
            .line
            .strip_prefix("publish ex receiver_1 ")
            .and_then(|l| l.strip_suffix('\n'))
            .unwrap();
        // What the broker reads: the sender named, as our CN.
        let info = ciphermq_proto::message::inspect_message(json).unwrap();
        assert_eq!(info.message_id, out[0].message_id);
        assert_eq!(info.sender_client_id.as_deref(), Some("sender_1"));
        let body: crypto::EncryptedInputData = serde_json::from_str(json).unwrap();
        assert_eq!(crypto::decrypt(&secret, &body).unwrap(), b"hello");
    }
}
