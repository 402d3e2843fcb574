//! The numbers the admin endpoint reports, published by the
//! shards without ever waiting for the admin thread.
//!
//! Every shard owns one [`ShardStats`]. Its counters and histograms are
//! written only by that shard's thread, so an update is a relaxed load and
//! store (no locked instruction, no cache line shared with another shard);
//! any thread may read them, and the admin thread sums them on a scrape.
//! Queue statistics are a snapshot the shard swaps in about once a second
//! from its sweep task (a pointer swap under a lock it only try-locks), and
//! storage failures are recorded by the committer when a commit round fails
//! and cleared by the next round that succeeds.
//!
//! Code that has no shard context at hand (the broker's reply
//! renderer) reaches its shard's stats through a thread-local set by
//! [`enter`] when the shard starts; on other threads those hooks do nothing.
//!
//! Its own crate because the shards write these figures on every publish
//! and the admin endpoint only reads them: the writing side (the broker's
//! shards, connections and committer) depends on this crate, which needs
//! only `ciphermq-proto` and `ciphermq-shard` and no HTTP stack, and
//! `ciphermq-admin` depends on it to read.

#![warn(missing_docs, unreachable_pub)]

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use ciphermq_proto::NackReason;
use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::{QueueStats, Shard};

/// Upper bounds (µs) of the fsync latency buckets: an `fdatasync` takes tens
/// of microseconds on NVMe and up to seconds on a struggling disk.
pub const FSYNC_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];

/// Upper bounds (µs) of the publish-to-ACK latency buckets. On a healthy
/// broker the median is about half a millisecond, so the ladder starts at
/// 50 µs and steps 1, 2.5, 5 per decade; it ends at 10 s, where a stalled
/// disk or shard shows. 17 bounds plus `+Inf`: 18 counters per shard.
/// The latency runs from the monotonic instant the broker began handling
/// the publish's line to the rendering of its `ACK`.
pub const PUBLISH_ACK_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Upper bounds (µs) of the shard loop lag buckets (`stall_watch.rs`): how
/// late a turn asked for comes; tens of microseconds when all is well.
pub const LOOP_LAG_BOUNDS_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 20_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Upper bounds (µs) of the commit round buckets: from taking a round's
/// appends to releasing their answers (write, fdatasync, directory syncs).
pub const COMMIT_ROUND_BOUNDS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000,
];

/// A monotonically increasing count with one writer thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning shard's thread calls this, so a relaxed
    /// load and store cannot lose an update and costs no locked instruction.
    #[inline]
    pub fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    /// The current value, from any thread.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A level with one writer thread, which moves it by deltas.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Moves it from `from` to `to` (the writer's own last and new share of
    /// it), without a locked instruction: only the owning shard writes.
    #[inline]
    pub fn shift(&self, from: u64, to: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0
            .store(v.wrapping_add(to).wrapping_sub(from), Ordering::Relaxed);
    }

    /// The current value, from any thread.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a connection is refused after its handshake: its CN is in no ACL
/// list ([`REFUSED_UNKNOWN_CLIENT`]), or a per-IP or per-CN connection cap
/// is reached ([`REFUSED_CONNECTION_LIMIT`]).
pub const CONNECTION_REFUSALS: &[&str] = &["unknown_client", "connection_limit"];
/// Index of `unknown_client` in [`CONNECTION_REFUSALS`].
pub const REFUSED_UNKNOWN_CLIENT: usize = 0;
/// Index of `connection_limit` in [`CONNECTION_REFUSALS`].
pub const REFUSED_CONNECTION_LIMIT: usize = 1;

/// Counters for a fixed, small set of reasons: one `reason` label each in
/// `/metrics`, so the series stay bounded whatever clients send.
#[derive(Debug)]
pub struct ReasonCounters {
    reasons: Box<[&'static str]>,
    counts: Box<[Counter]>,
}

impl ReasonCounters {
    /// Zeroed counters for `reasons`.
    pub fn new(reasons: Vec<&'static str>) -> ReasonCounters {
        let counts = reasons.iter().map(|_| Counter::default()).collect();
        ReasonCounters {
            reasons: reasons.into_boxed_slice(),
            counts,
        }
    }

    /// Counts one of reason `index` (an index past the set is ignored).
    #[inline]
    pub fn add(&self, index: usize) {
        if let Some(c) = self.counts.get(index) {
            c.add(1);
        }
    }

    /// Every reason with its count, in order.
    pub fn by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.reasons
            .iter()
            .copied()
            .zip(self.counts.iter().map(Counter::get))
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(Counter::get).sum()
    }
}

/// A latency histogram with fixed buckets and one writer thread.
#[derive(Debug)]
pub struct Histogram {
    /// Inclusive upper bounds in microseconds, ascending.
    bounds_us: &'static [u64],
    /// One count per bound plus the `+Inf` bucket (not cumulative).
    buckets: Box<[Counter]>,
    /// Sum of the observations in microseconds.
    sum_us: Counter,
}

impl Histogram {
    /// An empty histogram over `bounds_us` (ascending microseconds).
    pub fn new(bounds_us: &'static [u64]) -> Histogram {
        Histogram {
            bounds_us,
            buckets: (0..=bounds_us.len()).map(|_| Counter::default()).collect(),
            sum_us: Counter::default(),
        }
    }

    /// Records one observation of `us` microseconds (owning thread only).
    #[inline]
    pub fn observe_us(&self, us: u64) {
        let index = self.bounds_us.partition_point(|&bound| bound < us);
        if let Some(bucket) = self.buckets.get(index) {
            bucket.add(1);
        }
        self.sum_us.add(us);
    }

    /// Records one observation of `elapsed` (owning thread only).
    #[inline]
    pub fn observe(&self, elapsed: Duration) {
        self.observe_us(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// A copy of the counts, from any thread.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds_us: self.bounds_us,
            counts: self.buckets.iter().map(Counter::get).collect(),
            sum_us: self.sum_us.get(),
        }
    }
}

/// A histogram's counts at one moment, mergeable across shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Inclusive upper bounds in microseconds, ascending.
    pub bounds_us: &'static [u64],
    /// Per-bucket counts (not cumulative), the last one for `+Inf`.
    pub counts: Vec<u64>,
    /// Sum of the observations in microseconds.
    pub sum_us: u64,
}

impl HistogramSnapshot {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other` (same bounds) into `self`.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }
}

/// The threads of a shard whose time the metrics report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardThread {
    /// The executor: connections, queues, the committer's bookkeeping.
    Executor = 0,
    /// Its blocking-I/O thread: log writes and `fdatasync`s.
    BlockingIo = 1,
}

impl ShardThread {
    /// Both, in label order.
    pub const ALL: [ShardThread; 2] = [ShardThread::Executor, ShardThread::BlockingIo];

    /// The `thread` label of its series.
    pub fn label(self) -> &'static str {
        match self {
            ShardThread::Executor => "executor",
            ShardThread::BlockingIo => "blocking_io",
        }
    }
}

/// One shard's published numbers. Aligned so that two shards' counters never
/// share a cache line.
#[derive(Debug)]
#[repr(align(128))]
pub struct ShardStats {
    /// Which shard.
    pub shard: usize,
    /// Publishes answered `ACK` (durable in every target queue).
    pub publishes: Counter,
    /// Publishes answered `NACK`, by reason (`NackReason as usize`).
    pub publish_nacks: ReasonCounters,
    /// Deliveries settled by `ack`.
    pub acks: Counter,
    /// Deliveries requeued by `nack`.
    pub nacks: Counter,
    /// `Message:` lines written (push and fetch, redeliveries included).
    pub deliveries: Counter,
    /// Connections that passed the handshake and the ACL on this shard.
    pub connections_accepted: Counter,
    /// Connections refused after the handshake, by reason
    /// ([`CONNECTION_REFUSALS`]).
    pub connections_refused: ReasonCounters,
    /// TLS handshakes that failed or timed out.
    pub handshake_failures: Counter,
    /// Connections closed before their handshake: too many in progress.
    pub handshakes_refused: Counter,
    /// `fdatasync` calls on queue logs.
    pub fsyncs: Counter,
    /// Group-commit rounds.
    pub commit_rounds: Counter,
    /// Commit rounds with at least one failed log write.
    pub commit_failures: Counter,
    /// Time from a publish's acceptance to its `ACK` leaving for the client.
    pub publish_ack_latency: Histogram,
    /// Duration of each `fdatasync`.
    pub fsync_latency: Histogram,
    /// From taking a commit round to releasing its answers.
    pub commit_round_latency: Histogram,
    /// From an `fdatasync` returning on the blocking-I/O thread to the
    /// committer running again on its shard: the part of a round that is
    /// the shard noticing, not the disk.
    pub commit_wake_latency: Histogram,
    /// From the shard handing a log write to its blocking-I/O thread to that
    /// thread starting it: the other crossing of a round, which
    /// `commit_wake_latency` does not see. The thread's wake-up, plus, in a
    /// round with several dirty logs, the writes queued ahead on that one
    /// thread.
    pub commit_handoff_latency: Histogram,
    /// How late each turn the stall watch asked for came.
    pub loop_lag: Histogram,
    /// Turns that came the broker's stall threshold late or more while the
    /// shard's thread held on to its CPU (a long step, a blocking call).
    pub stalls: Counter,
    /// Turns as late that the thread spent mostly ready to run but waiting
    /// for a CPU: the host was busy, not the broker.
    pub cpu_starved: Counter,
    /// Times a connection stopped being read because its pending replies
    /// held `performance.max_pending_reply_bytes` (a client that does not
    /// read what it asked for).
    pub reply_holdbacks: Counter,
    /// Bytes the shard's connections hold in replies their clients have not
    /// read yet (see `performance.max_pending_reply_bytes`).
    pub pending_reply_bytes: Gauge,
    /// Times the shard's loop went silent with its thread asleep, and was
    /// woken from another thread (the broker's nudge thread, this counter's
    /// one writer): its executor can fall asleep with work runnable.
    pub nudges: Counter,
    /// TLS bytes read from client connections once they are served (after
    /// the handshake).
    pub bytes_received: Counter,
    /// TLS bytes written to client connections once they are served.
    pub bytes_sent: Counter,
    /// Commands answered `Rate limited` (publishes limited are counted as
    /// `NACK rate_limited` in `publish_nacks`).
    pub rate_limited: Counter,
    /// The shard's executor thread and its blocking-I/O thread (writes and
    /// `fdatasync`s), as the kernel numbers them; 0 until known. The
    /// metrics read their scheduler figures (`ciphermq_shard_thread_*`).
    threads: [AtomicI32; 2],
    /// Messages moved to dead-letter queues, as of the last refresh.
    dead_lettered: AtomicU64,
    /// Open connections served by this shard, as of the last refresh.
    open_connections: AtomicU64,
    /// This shard's queues as of the last refresh.
    queues: Mutex<Arc<Vec<QueueStats>>>,
    /// How reading backlogs back from disk went, as of the last refresh.
    backlog: Mutex<ciphermq_shard::shard::BacklogReads>,
    /// Set while the last commit round failed; read on every round, so the
    /// lock below is taken only when the state changes.
    storage_failed: AtomicBool,
    /// What failed, for `/ready` and `/api/status`.
    storage_error: Mutex<Option<String>>,
}

impl ShardStats {
    /// Zeroed numbers for `shard`.
    pub fn new(shard: usize) -> ShardStats {
        ShardStats {
            shard,
            publishes: Counter::default(),
            publish_nacks: ReasonCounters::new(NackReason::ALL.map(NackReason::as_str).to_vec()),
            acks: Counter::default(),
            nacks: Counter::default(),
            deliveries: Counter::default(),
            connections_accepted: Counter::default(),
            connections_refused: ReasonCounters::new(CONNECTION_REFUSALS.to_vec()),
            handshake_failures: Counter::default(),
            handshakes_refused: Counter::default(),
            fsyncs: Counter::default(),
            commit_rounds: Counter::default(),
            commit_failures: Counter::default(),
            publish_ack_latency: Histogram::new(PUBLISH_ACK_BOUNDS_US),
            fsync_latency: Histogram::new(FSYNC_BOUNDS_US),
            commit_round_latency: Histogram::new(COMMIT_ROUND_BOUNDS_US),
            // Like loop lag, a wait for the shard's turn: the same ladder.
            commit_wake_latency: Histogram::new(LOOP_LAG_BOUNDS_US),
            commit_handoff_latency: Histogram::new(LOOP_LAG_BOUNDS_US),
            loop_lag: Histogram::new(LOOP_LAG_BOUNDS_US),
            stalls: Counter::default(),
            cpu_starved: Counter::default(),
            reply_holdbacks: Counter::default(),
            pending_reply_bytes: Gauge::default(),
            nudges: Counter::default(),
            bytes_received: Counter::default(),
            bytes_sent: Counter::default(),
            rate_limited: Counter::default(),
            threads: [AtomicI32::new(0), AtomicI32::new(0)],
            dead_lettered: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            queues: Mutex::new(Arc::new(Vec::new())),
            backlog: Mutex::new(Default::default()),
            storage_failed: AtomicBool::new(false),
            storage_error: Mutex::new(None),
        }
    }

    /// Notes `tid` as the shard's `thread`, whose scheduler figures the
    /// metrics then export.
    pub fn set_thread(&self, thread: ShardThread, tid: i32) {
        self.threads[thread as usize].store(tid, Ordering::Relaxed);
    }

    /// The kernel's number for the shard's `thread`, once known.
    pub fn thread(&self, thread: ShardThread) -> Option<i32> {
        Some(self.threads[thread as usize].load(Ordering::Relaxed)).filter(|t| *t != 0)
    }

    /// Publishes the shard's queue statistics and connection count. Called
    /// from the shard's periodic sweep; if the admin thread happens to hold
    /// the lock this refresh is skipped (the next one is a second away).
    pub fn refresh(&self, shard: &Shard) {
        self.open_connections
            .store(shard.mailboxes().count() as u64, Ordering::Relaxed);
        self.dead_lettered
            .store(shard.dead_lettered(), Ordering::Relaxed);
        if let Ok(mut b) = self.backlog.try_lock() {
            *b = shard.backlog_reads();
        }
        let fresh = Arc::new(shard.queue_stats());
        let stale = match self.queues.try_lock() {
            Ok(mut guard) => std::mem::replace(&mut *guard, fresh),
            Err(TryLockError::Poisoned(p)) => std::mem::replace(&mut *p.into_inner(), fresh),
            Err(TryLockError::WouldBlock) => return,
        };
        // The old snapshot is freed outside the lock.
        drop(stale);
    }

    /// `n` deliveries were settled by `ack` (`ack`) or requeued by `nack`.
    #[inline]
    pub fn settled(&self, ack: bool, n: usize) {
        if ack { &self.acks } else { &self.nacks }.add(n as u64);
    }

    /// Messages moved to dead-letter queues, as of the last refresh.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Backlog reads as of the last refresh.
    pub fn backlog_reads(&self) -> ciphermq_shard::shard::BacklogReads {
        *self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last published queue statistics.
    pub fn queues(&self) -> Arc<Vec<QueueStats>> {
        self.queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Open connections as of the last refresh, for the per-shard gauge
    /// of `/metrics`. `/api/status` counts from the broker's live
    /// connection snapshot instead, so its figures add up at one moment.
    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }

    /// Records a commit round: `error` is the first failed write's
    /// description and whether it says the device fails (full, read-only,
    /// failing I/O: what makes `/ready` fail), `None` when every write
    /// succeeded. A round without a device failure clears an earlier one:
    /// a queue's own failure is reported with that queue instead.
    pub fn commit_round(&self, error: Option<(String, bool)>) {
        self.commit_rounds.add(1);
        if error.is_some() {
            self.commit_failures.add(1);
        }
        match error.and_then(|(e, device)| device.then_some(e)) {
            Some(e) => {
                *self
                    .storage_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(e);
                self.storage_failed.store(true, Ordering::Release);
            }
            None if self.storage_failed.load(Ordering::Acquire) => {
                self.storage_failed.store(false, Ordering::Release);
                *self
                    .storage_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                tracing::info!(
                    shard = self.shard,
                    "log writes succeed again; storage healthy"
                );
            }
            None => {}
        }
    }

    /// Why this shard's storage is failing, or `None` when its last commit
    /// round succeeded.
    pub fn storage_error(&self) -> Option<String> {
        if !self.storage_failed.load(Ordering::Acquire) {
            return None;
        }
        self.storage_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Where the broker is in its life, for `/ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Listeners not all bound yet.
    Starting,
    /// Serving.
    Serving,
    /// Shutting down: no new connections.
    Stopping,
}

/// What the start found wrong in the data directory and worked around:
/// damaged log bytes moved to quarantine files, torn ends cut, metadata and
/// key files replaced from a good copy or moved aside. The broker serves on;
/// an operator should look.
#[derive(Debug, Default, Clone)]
pub struct StorageFindings {
    /// One line per problem, naming the file and what was done.
    pub warnings: Vec<String>,
    /// Log records lost to damage (as near as can be told), moved aside.
    pub quarantined_records: u64,
    /// Bytes moved to quarantine files.
    pub quarantined_bytes: u64,
    /// Bytes of torn log ends cut off (writes a crash cut short).
    pub torn_bytes: u64,
}

/// The disk watermark as the admin endpoint shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskState {
    /// Free bytes at the last look.
    pub free_bytes: u64,
    /// `storage.min_free_mb`, in bytes.
    pub min_free_bytes: u64,
    /// Publishes are refused (`NACK disk_full`).
    pub low: bool,
    /// Free bytes at which publishes are taken again after a low state.
    pub resume_at_bytes: u64,
}

/// Every shard's numbers plus the broker's lifecycle, shared by all threads.
#[derive(Debug)]
pub struct BrokerStats {
    /// When the broker started.
    started: Instant,
    /// One entry per shard, in shard order.
    shards: Box<[Arc<ShardStats>]>,
    /// A [`Lifecycle`] as a byte.
    lifecycle: AtomicU8,
    /// Whether anyone reads queue snapshots (the admin endpoint runs); when
    /// not, the shards skip building them.
    collect: bool,
    /// What the start found in the data directory (durable storage only).
    findings: OnceLock<StorageFindings>,
    /// The disk watermark (durable storage only): the watched space, the
    /// minimum and the level publishing resumes at, in bytes.
    disk: OnceLock<(Arc<DiskSpace>, u64, u64)>,
}

impl BrokerStats {
    /// Zeroed numbers for `shards` shards; `collect` when the admin endpoint
    /// will read them.
    pub fn new(shards: usize, collect: bool) -> BrokerStats {
        BrokerStats {
            started: Instant::now(),
            shards: (0..shards).map(|s| Arc::new(ShardStats::new(s))).collect(),
            lifecycle: AtomicU8::new(Lifecycle::Starting as u8),
            collect,
            findings: OnceLock::new(),
            disk: OnceLock::new(),
        }
    }

    /// Records what the start found in the data directory (once).
    pub fn set_findings(&self, findings: StorageFindings) {
        let _ = self.findings.set(findings);
    }

    /// What the start found in the data directory.
    pub fn findings(&self) -> Option<&StorageFindings> {
        self.findings.get()
    }

    /// Reports on `space`, watched against `min_free_bytes` and taking
    /// publishes again at `resume_at_bytes` (once).
    pub fn watch_disk(&self, space: Arc<DiskSpace>, min_free_bytes: u64, resume_at_bytes: u64) {
        let _ = self.disk.set((space, min_free_bytes, resume_at_bytes));
    }

    /// The disk watermark now, when storage is durable.
    pub fn disk(&self) -> Option<DiskState> {
        let (space, min_free_bytes, resume_at_bytes) = self.disk.get()?;
        Some(DiskState {
            free_bytes: space.free_bytes(),
            min_free_bytes: *min_free_bytes,
            low: space.is_low(),
            resume_at_bytes: *resume_at_bytes,
        })
    }

    /// Shard `shard`'s numbers.
    ///
    /// # Panics
    /// If `shard` is not below the shard count (a programming error).
    pub fn shard(&self, shard: usize) -> &Arc<ShardStats> {
        &self.shards[shard]
    }

    /// Every shard's numbers, in shard order.
    pub fn shards(&self) -> &[Arc<ShardStats>] {
        &self.shards
    }

    /// The queues whose last log write failed for a reason of their own
    /// (name, why), as of the shards' last queue snapshots.
    pub fn failing_queues(&self) -> Vec<(Arc<str>, Arc<str>)> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.queues()
                    .iter()
                    .filter_map(|q| Some((q.name.clone(), q.storage_error.clone()?)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Whether shards should refresh their queue snapshots.
    pub fn collects(&self) -> bool {
        self.collect
    }

    /// Time since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The current lifecycle stage.
    pub fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Starting,
            1 => Lifecycle::Serving,
            _ => Lifecycle::Stopping,
        }
    }

    /// Moves to `stage` (never back from `Stopping`).
    pub fn set_lifecycle(&self, stage: Lifecycle) {
        let _ = self
            .lifecycle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != Lifecycle::Stopping as u8).then_some(stage as u8)
            });
    }

    /// Storage failures by shard, as `(shard, what failed)`.
    pub fn storage_errors(&self) -> Vec<(usize, String)> {
        self.shards
            .iter()
            .filter_map(|s| s.storage_error().map(|e| (s.shard, e)))
            .collect()
    }
}

thread_local! {
    /// The stats of the shard running on this thread, if any.
    static CURRENT: OnceCell<Arc<ShardStats>> = const { OnceCell::new() };
}

/// Makes `stats` the target of this thread's hooks; a shard calls it once
/// when its executor starts.
pub fn enter(stats: Arc<ShardStats>) {
    CURRENT.with(|current| {
        let _ = current.set(stats);
    });
}

#[inline]
fn with_current(f: impl FnOnce(&ShardStats)) {
    CURRENT.with(|current| {
        if let Some(stats) = current.get() {
            f(stats);
        }
    });
}

/// The monotonic clock, read at most once per rendering pass: a pass
/// writes many `ACK`s within microseconds, so they share one reading.
#[derive(Debug, Default)]
pub struct LazyClock(Option<Instant>);

impl LazyClock {
    /// Now, as first read by this clock.
    #[inline]
    pub fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// The reply to a publish accepted at `accepted` is being written: an `ACK`
/// (`Ok`) is counted and its latency observed, a `NACK` counted. `clock`
/// lives for one rendering pass.
#[inline]
pub fn publish_answered(
    accepted: Instant,
    outcome: &Result<(), NackReason>,
    clock: &mut LazyClock,
) {
    if let Err(reason) = outcome {
        publish_nacked(*reason);
        return;
    }
    with_current(|s| {
        s.publishes.add(1);
        s.publish_ack_latency
            .observe(clock.now().saturating_duration_since(accepted));
    });
}

/// A publish `NACK` is being written.
#[inline]
pub fn publish_nacked(reason: NackReason) {
    with_current(|s| s.publish_nacks.add(reason as usize));
}

/// `n` deliveries are being written.
#[inline]
pub fn delivered(n: usize) {
    with_current(|s| s.deliveries.add(n as u64));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let h = Histogram::new(&[10, 100]);
        h.observe_us(0);
        h.observe_us(10);
        h.observe_us(11);
        h.observe_us(100);
        h.observe_us(101);
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 2, 1]);
        assert_eq!(s.sum_us, 222);
        assert_eq!(s.count(), 5);
        let mut total = s.clone();
        total.merge(&s);
        assert_eq!(total.counts, vec![4, 4, 2]);
        assert_eq!(total.sum_us, 444);
    }

    #[test]
    fn publish_ack_buckets_start_at_50_us_and_end_at_10_s() {
        assert_eq!(PUBLISH_ACK_BOUNDS_US.first(), Some(&50));
        assert_eq!(PUBLISH_ACK_BOUNDS_US.last(), Some(&10_000_000));
        assert!(PUBLISH_ACK_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
        // Half a millisecond, the usual median, falls in a bucket of its own.
        let h = Histogram::new(PUBLISH_ACK_BOUNDS_US);
        h.observe_us(400);
        let s = h.snapshot();
        assert_eq!(s.counts.len(), PUBLISH_ACK_BOUNDS_US.len() + 1);
        assert_eq!(s.counts[..5], [0, 0, 0, 1, 0]);
    }

    #[test]
    fn a_failed_round_is_reported_until_one_succeeds() {
        let s = ShardStats::new(3);
        assert_eq!(s.storage_error(), None);
        s.commit_round(Some(("queue q: disk full".into(), true)));
        assert_eq!(s.storage_error().as_deref(), Some("queue q: disk full"));
        s.commit_round(None);
        assert_eq!(s.storage_error(), None);
        assert_eq!(s.commit_rounds.get(), 2);
        assert_eq!(s.commit_failures.get(), 1);
    }

    #[test]
    fn one_queues_own_failure_is_not_the_shards() {
        let s = ShardStats::new(3);
        s.commit_round(Some(("queue q: permission denied".into(), false)));
        assert_eq!(s.storage_error(), None);
        assert_eq!(s.commit_failures.get(), 1);
        s.commit_round(Some(("queue q: disk full".into(), true)));
        s.commit_round(Some(("queue q: permission denied".into(), false)));
        assert_eq!(s.storage_error(), None, "the device works again");
    }

    #[test]
    fn stopping_is_final() {
        let b = BrokerStats::new(2, true);
        assert_eq!(b.lifecycle(), Lifecycle::Starting);
        b.set_lifecycle(Lifecycle::Serving);
        assert_eq!(b.lifecycle(), Lifecycle::Serving);
        b.set_lifecycle(Lifecycle::Stopping);
        b.set_lifecycle(Lifecycle::Serving);
        assert_eq!(b.lifecycle(), Lifecycle::Stopping);
    }

    #[test]
    fn hooks_do_nothing_off_a_shard_thread() {
        std::thread::spawn(|| {
            publish_nacked(NackReason::QueueFull);
            delivered(3);
        })
        .join()
        .expect("no panic");
        let stats = Arc::new(ShardStats::new(0));
        let s = stats.clone();
        std::thread::spawn(move || {
            enter(s);
            publish_nacked(NackReason::QueueFull);
            publish_nacked(NackReason::Timeout);
            delivered(3);
        })
        .join()
        .expect("no panic");
        assert_eq!(stats.publish_nacks.total(), 2);
        let by_reason: Vec<_> = stats.publish_nacks.by_reason().collect();
        assert_eq!(by_reason.len(), NackReason::ALL.len());
        assert!(by_reason.contains(&("queue_full", 1)) && by_reason.contains(&("timeout", 1)));
        assert_eq!(by_reason.iter().filter(|(_, n)| *n == 0).count(), 7);
        assert_eq!(stats.deliveries.get(), 3);
    }
}
