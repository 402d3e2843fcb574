//! One simulated run: shards over a simulated disk, driven by random
//! clients, a simulated clock and the seed's faults and crashes.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use ciphermq_proto::{ExchangeKind, NackReason};
use ciphermq_shard::backlog::READAHEAD_MESSAGES;
use ciphermq_shard::durability::is_deleted_dir_name;
use ciphermq_shard::log::{queue_dir, recover_queue_at};
use ciphermq_shard::message::Route;
use ciphermq_shard::pending::{pending, Pending};
use ciphermq_shard::topology::{Actor, Binding, BindingRule};
use ciphermq_shard::{
    Clock, Completion, ConnEvent, ConnRef, DedupHasher, DeliveryTracker, Mailbox, ManualClock,
    Mesh, MeshInbound, Message, Origin, Outstanding, PublishStatus, QueueInfo, QueueSettings,
    Shard, TopologyChange, TopologyStore,
};

use crate::committer::{read_backlog, Committer, Faults};
use crate::disk::SimDisk;
use crate::model::{invariant, Model, Violation};
use crate::rng::Rng;
use crate::shard_on_disk::durable_shard;

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Random client actions before the final drain.
    pub steps: u64,
    /// Storage calls fail now and then.
    pub faults: bool,
    /// The machine loses power now and then.
    pub crashes: bool,
    /// Shards (1 or 2); `None`: the seed chooses.
    pub shards: Option<usize>,
    /// A failure shows every step, not only those about its messages.
    pub full_trace: bool,
    /// Owners move away and back now and then (see [`Move`]). Off by
    /// default, so that the seeds of runs without moves replay as before.
    pub moves: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            steps: 3_000,
            faults: true,
            crashes: true,
            shards: None,
            full_trace: false,
            moves: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Shards.
    pub shards: usize,
    /// Publishes made (first ones and again).
    pub publishes: u64,
    /// Publishes ACKed.
    pub acked: u64,
    /// Publishes NACKed.
    pub nacked: u64,
    /// Deliveries seen.
    pub deliveries: u64,
    /// Consumer acks sent.
    pub consumer_acks: u64,
    /// Crashes and recoveries.
    pub crashes: u64,
    /// Commit rounds written.
    pub rounds: u64,
    /// Jobs that failed for lack of space and deleted acked segments
    /// without carrying their dedup ids.
    pub dedup_forgotten: u64,
    /// Queues purged.
    pub purges: u64,
    /// Queues deleted.
    pub deletes: u64,
    /// Owners moved away and back.
    pub moves: u64,
    /// The most the memory budget was passed by, as a share of the budget
    /// (after the consumers' unacked bytes are counted out).
    pub worst_memory: f64,
    /// A hash of the whole trace: two runs of one seed give the same.
    pub trace_digest: u64,
}

/// A run that broke an invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed: `ciphermq-sim --seed <it>` replays the run.
    pub seed: u64,
    /// The step it broke at.
    pub step: u64,
    /// What broke.
    pub violation: Violation,
    /// The last steps, oldest first.
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} broke {} at step {}: {}",
            self.seed, self.violation.invariant, self.step, self.violation.detail
        )?;
        writeln!(f, "last steps:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: ciphermq-sim --seed {}", self.seed)
    }
}

const RECEIVERS: [&str; 3] = ["r1", "r2", "r3"];
const SENDERS: [&str; 2] = ["s1", "s2"];
const SEGMENT_BYTES: u64 = 16 * 1024;
/// Each shard's part of the memory budget.
const SPILL_BYTES: u64 = 24 * 1024;
const MAX_BODY: usize = 3_000;
/// Commands a client has unanswered at most, as a connection's pending
/// replies are bounded in the broker (a publisher's window).
const WINDOW: usize = 64;
/// Trace lines a failure shows besides those about its messages.
const TRACE_LINES: usize = 60;
/// Messages one backlog read brings back at most, beyond the read-ahead
/// (a read in flight when the check runs).
const READ_BATCH_MESSAGES: u64 = 1024;

/// A queue of the simulated world: its owner and bindings.
#[derive(Debug, Clone)]
struct QueueDef {
    name: String,
    owner: &'static str,
    /// (exchange, binding key).
    binds: Vec<(&'static str, &'static str)>,
}

fn queue_defs() -> Vec<QueueDef> {
    let mut defs: Vec<QueueDef> = RECEIVERS
        .iter()
        .map(|&r| QueueDef {
            name: format!("q.{r}"),
            owner: r,
            binds: vec![("x", r), ("f", "")],
        })
        .collect();
    // A receiver binding its own queue to another's key: confinement must
    // keep the other's envelopes out of it.
    defs.push(QueueDef {
        name: "spy.r1".to_string(),
        owner: "r1",
        binds: vec![("x", "r2")],
    });
    defs
}

/// The broker's confinement rule, as its ACL states it for receiver-owned
/// queues: every bind stands, and a queue stores only its owner's envelopes.
#[derive(Debug)]
struct OwnerRule;

impl BindingRule for OwnerRule {
    fn check(&self, _binding: &Binding<'_>) -> Result<(), String> {
        Ok(())
    }

    fn confined_to(&self, queue: &QueueInfo) -> Option<Arc<str>> {
        Some(queue.owner.clone())
    }
}

/// What a step does.
#[derive(Debug, Clone, Copy)]
enum Action {
    Publish,
    PublishAgain,
    Ack,
    Nack,
    Fetch,
    Consume,
    Commit,
    Read,
    Chores,
    Purge,
    Delete,
    Redeclare,
    Reconnect,
    Crash,
    Move,
}

/// How often each action comes, drawn per seed: some runs publish far
/// faster than they consume (backlogs past the memory budget), some commit
/// rarely (long rounds), some crash often.
#[derive(Debug)]
struct Mix(Vec<(Action, u64)>);

impl Mix {
    fn draw(rng: &mut Rng, moves: bool) -> Mix {
        let mut weight = |lo, hi| rng.between(lo, hi);
        let mut mix = Mix(vec![
            (Action::Publish, weight(200, 450)),
            (Action::PublishAgain, weight(20, 80)),
            (Action::Ack, weight(40, 220)),
            (Action::Nack, weight(10, 60)),
            (Action::Fetch, weight(20, 80)),
            (Action::Consume, weight(10, 40)),
            (Action::Commit, weight(80, 200)),
            (Action::Read, weight(20, 80)),
            (Action::Chores, weight(10, 40)),
            (Action::Purge, weight(1, 12)),
            (Action::Delete, weight(1, 8)),
            (Action::Redeclare, weight(5, 12)),
            (Action::Reconnect, weight(3, 12)),
            (Action::Crash, weight(1, 5)),
        ]);
        // Drawn last, so that runs without moves draw as they always did.
        if moves {
            // A move takes several steps (freeze, settle, leave, return).
            mix.0.push((Action::Move, weight(5, 20)));
        }
        mix
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|(_, w)| w).sum()
    }

    fn pick(&self, mut roll: u64) -> Action {
        for &(action, weight) in &self.0 {
            if roll < weight {
                return action;
            }
            roll -= weight;
        }
        Action::Commit
    }
}

/// A message held by a connection, unacked.
#[derive(Debug, Clone)]
struct Held {
    queue: Arc<str>,
    q: usize,
    msg: usize,
    bytes: usize,
}

/// A command waiting for its answer.
#[derive(Debug)]
enum Cmd {
    Publish {
        msg: usize,
        outcome: Result<(), NackReason>,
        remaining: u32,
        /// Body bytes it stores, over all its queues (held in memory until
        /// its commit: what the memory check allows for).
        bytes: u64,
    },
    Purge {
        q: usize,
    },
    /// A fetch waiting for its backlog read. A connection has one at a
    /// time, as a client waiting for each reply does: replies come in
    /// command order, so a second fetch's deliveries would reach the client
    /// after the first's anyway.
    Fetch,
    Other,
}

/// A client connection.
#[derive(Debug)]
struct SimConn {
    serial: u64,
    shard: usize,
    cref: ConnRef,
    mailbox: Rc<Mailbox>,
    cn: &'static str,
    receiver: bool,
    tracker: DeliveryTracker,
    held: Vec<Held>,
    next_cmd: u64,
    pending: HashMap<u64, Cmd>,
    next_n: u64,
    consumed: bool,
    consuming: Vec<usize>,
}

impl SimConn {
    fn origin(&mut self) -> Origin {
        self.next_cmd += 1;
        Origin {
            conn: self.cref,
            seq: self.next_cmd,
        }
    }
}

/// The whole simulated world.
struct World {
    rng: Rng,
    opts: Options,
    faults: Faults,
    _root: tempfile::TempDir,
    data: PathBuf,
    disk: SimDisk,
    manual: Arc<ManualClock>,
    clock: Clock,
    settings: QueueSettings,
    store: Arc<TopologyStore>,
    shards: Vec<Shard>,
    inbounds: Vec<MeshInbound>,
    committers: Vec<Committer>,
    conns: Vec<SimConn>,
    next_serial: u64,
    defs: Vec<QueueDef>,
    /// Declared and not being deleted.
    exists: Vec<bool>,
    /// Deletions waiting for their answer.
    deleting: Vec<Option<Pending<Result<(), String>>>>,
    /// Deleted, but the deletion record stays until the next start.
    blocked: Vec<bool>,
    model: Model,
    step: u64,
    trace: VecDeque<String>,
    summary: Summary,
    /// This run's mix of actions.
    mix: Mix,
    last_sweep: Duration,
    /// The owner moving away and back, if one is.
    moving: Option<Move>,
}

/// How a leaving queue's directory move went (`Shard::detach`).
type DirMoved = Result<(), String>;

/// An owner moving to another node and back, as the cluster hands an owner
/// over and adopts it again (`Shard::freeze`, `is_quiet`, `detach`,
/// `restore_queue`): its connections close, its queues freeze and settle,
/// leave their shard with their directories (kept under `moving/`), and
/// are recovered from those directories again. The heir is the same shard
/// here; what the move must not lose or reorder is the same.
#[derive(Debug)]
struct Move {
    owner: &'static str,
    /// Per shard, the owner's queues it held.
    parts: Vec<(usize, Vec<Arc<str>>)>,
    /// Once detached (empty until then): each queue's directory move, and
    /// its outcome once known.
    detached: Vec<(Pending<DirMoved>, Option<DirMoved>)>,
}

/// Runs the simulation of `seed`.
pub fn run(seed: u64, opts: &Options) -> Result<Summary, Box<Failure>> {
    ciphermq_shard::hashers::fix_name_hashing_for_simulation();
    let mut world = World::new(seed, opts.clone()).map_err(|e| {
        Box::new(Failure {
            seed,
            step: 0,
            violation: Violation {
                invariant: "setup",
                detail: e,
            },
            trace: Vec::new(),
        })
    })?;
    match world.run() {
        Ok(()) => {
            let mut summary = world.summary.clone();
            summary.trace_digest = world.digest();
            Ok(summary)
        }
        Err(violation) => {
            let trace = world.trace_for(&violation.detail);
            Err(Box::new(Failure {
                seed,
                step: world.step,
                violation,
                trace,
            }))
        }
    }
}

fn io_violation(what: &str, e: impl std::fmt::Display) -> Violation {
    Violation {
        invariant: "storage",
        detail: format!("{what}: {e}"),
    }
}

impl World {
    fn new(seed: u64, opts: Options) -> Result<World, String> {
        let mut rng = Rng::new(seed);
        // Files in memory where the machine has a tmpfs: the simulated
        // disk decides durability itself, and a real one only slows runs.
        let shm = std::path::Path::new("/dev/shm");
        let root = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .map_err(|e| e.to_string())?;
        let data = root.path().join("data");
        std::fs::create_dir_all(data.join("queues")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(data.join("moving")).map_err(|e| e.to_string())?;
        let disk = SimDisk::new(&data).map_err(|e| e.to_string())?;
        let shards = opts.shards.unwrap_or(1 + rng.below(2) as usize);
        let (clock, manual) = Clock::manual(1_700_000_000_000 + rng.below(1 << 30));
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
        key[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
        let settings = QueueSettings {
            max_len: 3_000,
            spill_bytes: Some(SPILL_BYTES),
            max_deliveries: 4,
            dedup_window: Duration::from_secs(30),
            ack_wait: Some(Duration::from_secs(20)),
            dedup_hasher: DedupHasher::from_bytes(key),
            carry_dedup: true,
            max_fetch: 16,
            max_prefetch: 8,
            ..QueueSettings::default()
        };
        let faults = if opts.faults {
            Faults {
                io_per_mille: 15,
                read_per_mille: 30,
                space_per_mille: 250,
            }
        } else {
            Faults::NONE
        };
        let mix = Mix::draw(&mut rng, opts.moves);
        let store = Arc::new(TopologyStore::new(shards));
        store.set_binding_rule(Arc::new(OwnerRule));
        let defs = queue_defs();
        let n = defs.len();
        let mut world = World {
            rng,
            opts,
            faults,
            _root: root,
            data,
            disk,
            manual,
            clock,
            settings,
            store,
            shards: Vec::new(),
            inbounds: Vec::new(),
            committers: Vec::new(),
            conns: Vec::new(),
            next_serial: 0,
            defs,
            exists: vec![false; n],
            deleting: (0..n).map(|_| None).collect(),
            blocked: vec![false; n],
            model: Model::new(n),
            step: 0,
            trace: VecDeque::new(),
            summary: Summary {
                shards,
                ..Summary::default()
            },
            last_sweep: Duration::ZERO,
            mix,
            moving: None,
        };
        for (name, kind) in [("x", ExchangeKind::Direct), ("f", ExchangeKind::Fanout)] {
            world.change(TopologyChange::DeclareExchange {
                name: name.to_string(),
                kind,
                owner: None,
            })?;
        }
        for q in 0..n {
            world.declare(q)?;
        }
        world.boot().map_err(|v| v.detail)?;
        Ok(world)
    }

    fn note(&mut self, line: String) {
        // Paths relative to the data directory: a replay's trace is the
        // same text, whatever temporary directory it runs in.
        let line = line.replace(&*self.data.to_string_lossy(), "data");
        self.trace
            .push_back(format!("{:>6} t={:>7}ms {line}", self.step, self.now_ms()));
    }

    /// FNV-1a over every trace line.
    fn digest(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for line in &self.trace {
            for byte in line.bytes().chain(std::iter::once(b'\n')) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }

    /// What to show of the trace for a failure described by `detail`:
    /// every line naming a message id it names, every crash, and the last
    /// steps.
    fn trace_for(&self, detail: &str) -> Vec<String> {
        let ids: Vec<String> = detail
            .split(|c: char| c.is_whitespace() || c == '(' || c == ',')
            .filter(|t| SENDERS.iter().any(|s| t.starts_with(&format!("{s}-"))))
            .map(|t| format!("{t} "))
            .collect();
        let tail = if self.opts.full_trace {
            0
        } else {
            self.trace.len().saturating_sub(TRACE_LINES)
        };
        self.trace
            .iter()
            .enumerate()
            .filter(|(i, line)| {
                *i >= tail
                    || line.contains("CRASH")
                    || line.contains("recovered")
                    || ids.iter().any(|id| line.contains(id.as_str()))
            })
            .map(|(_, line)| line.clone())
            .collect()
    }

    fn now_ms(&self) -> u64 {
        self.manual.elapsed().as_millis() as u64
    }

    fn change(&self, change: TopologyChange) -> Result<(), String> {
        let mut result = self.store.submit(change);
        match result.try_take() {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("a topology change kept in memory was not applied at once".into()),
        }
    }

    /// Declares queue `q` and its bindings.
    fn declare(&mut self, q: usize) -> Result<(), String> {
        let def = self.defs[q].clone();
        self.change(TopologyChange::DeclareQueue {
            name: def.name.clone(),
            owner: def.owner.to_string(),
            by: None,
        })?;
        for (exchange, key) in def.binds {
            self.change(TopologyChange::Bind {
                queue: def.name.clone(),
                exchange: exchange.to_string(),
                key: key.to_string(),
                by: None,
            })?;
        }
        self.exists[q] = true;
        Ok(())
    }

    /// Starts the shards over what the disk holds, as a broker start does.
    fn boot(&mut self) -> Result<(), Violation> {
        let n = self.summary.shards;
        let snapshot = self.store.snapshot();
        // Deletions a crash interrupted are finished before anything reads.
        let mut deleting: Vec<String> = snapshot.deleting().iter().map(|s| s.to_string()).collect();
        deleting.sort();
        for name in deleting {
            self.disk.remove_dir(&queue_dir(&self.data, &name));
            let _ = self.change(TopologyChange::QueueRemoved { name: name.clone() });
            if let Some(q) = self.defs.iter().position(|d| d.name == name) {
                if self.deleting[q].take().is_some() || !self.blocked[q] {
                    self.model.deleted(q);
                }
                self.blocked[q] = false;
            }
        }
        // A move a crash interrupted ends here, as the broker's readoption
        // of a moving directory does: its directories come back.
        if let Some(mv) = self.moving.take() {
            for (_, names) in &mv.parts {
                for name in names {
                    self.come_home(name)?;
                }
            }
            self.note(format!("move of {}: ended by the restart", mv.owner));
        }
        let queues = self.data.join("queues");
        let mut listed: Vec<PathBuf> = std::fs::read_dir(&queues)
            .map_err(|e| io_violation("list queues", e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        listed.sort();
        for dir in listed {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if is_deleted_dir_name(name) {
                self.disk.remove_dir(&dir);
            }
        }
        self.shards.clear();
        self.inbounds.clear();
        self.committers.clear();
        for endpoint in Mesh::build(n) {
            self.shards.push(durable_shard(
                &self.data,
                SEGMENT_BYTES,
                &self.settings,
                &self.store,
                endpoint.outbound,
                &self.clock,
            ));
            self.inbounds.push(endpoint.inbound);
            self.committers.push(Committer::default());
        }
        let snapshot = self.store.snapshot();
        let mut infos: Vec<QueueInfo> = snapshot.queues().cloned().collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        let now = self.clock.now();
        for info in infos {
            let dir = queue_dir(&self.data, &info.name);
            if !dir.exists() {
                continue;
            }
            self.recover(info.shard as usize, &info.name, now)?;
        }
        self.disk
            .settle(&self.data)
            .map_err(|e| io_violation("settle", e))?;
        self.model.restarted();
        self.conns.clear();
        for cn in RECEIVERS.iter().chain(SENDERS.iter()) {
            self.open(cn);
        }
        Ok(())
    }

    /// Recovers queue `name` from its directory under `queues/` (which
    /// must exist) and has shard `shard` serve it, as a start or an
    /// adoption does.
    fn recover(&mut self, shard: usize, name: &Arc<str>, now: Instant) -> Result<(), Violation> {
        let window_ms = self.settings.dedup_window.as_millis() as u64;
        let dir = queue_dir(&self.data, name);
        let recovered = recover_queue_at(&dir, &self.settings.dedup_hasher, window_ms, &self.clock)
            .map_err(|e| Violation {
                invariant: invariant::ACKED_NOT_LOST,
                detail: format!("recovery of {name} failed: {e}"),
            })?;
        let runs: Vec<String> = recovered
            .backlog
            .iter()
            .map(|r| {
                format!(
                    "{}..={} ({}, holes {:?})",
                    r.first_seq, r.last_seq, r.count, r.holes
                )
            })
            .collect();
        let purged: Vec<String> = recovered
            .purged
            .iter()
            .map(|r| format!("{}..={} ({})", r.first_seq, r.last_seq, r.count))
            .collect();
        self.note(format!(
                "recovered {name}: next seq {}, runs {runs:?}, purging {purged:?}, damage {:?}, torn {:?}",
                recovered.next_seq,
                recovered
                    .damage
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>(),
                recovered.torn
            ));
        self.shards[shard].restore_queue(name.clone(), recovered, now);
        Ok(())
    }

    /// Opens a connection for `cn` on a shard the seed picks.
    fn open(&mut self, cn: &'static str) -> usize {
        let shard = self.rng.below(self.shards.len() as u64) as usize;
        let (cref, mailbox) = self.shards[shard].register_conn();
        self.next_serial += 1;
        self.conns.push(SimConn {
            serial: self.next_serial,
            shard,
            cref,
            mailbox,
            cn,
            receiver: cn.starts_with('r'),
            tracker: DeliveryTracker::default(),
            held: Vec::new(),
            next_cmd: 0,
            pending: HashMap::new(),
            next_n: 0,
            consumed: false,
            consuming: Vec::new(),
        });
        self.conns.len() - 1
    }

    fn info(&self, name: &str) -> Option<QueueInfo> {
        self.store.snapshot().queue(name).cloned()
    }

    /// The queues a message for `to` published to `exchange` with `key`
    /// lawfully reaches.
    fn targets(&self, exchange: &str, key: &str, to: &str) -> Vec<usize> {
        (0..self.defs.len())
            .filter(|&q| {
                let def = &self.defs[q];
                self.exists[q]
                    && def.owner == to
                    && def
                        .binds
                        .iter()
                        .any(|&(e, k)| e == exchange && (e == "f" || k == key))
            })
            .collect()
    }

    fn run(&mut self) -> Result<(), Violation> {
        while self.step < self.opts.steps {
            self.step += 1;
            self.act()?;
            self.settle()?;
        }
        self.note("final drain".into());
        self.faults = Faults::NONE;
        self.finish_move()?;
        self.drain()?;
        let names: Vec<String> = self.defs.iter().map(|d| d.name.clone()).collect();
        self.model.check_nothing_lost(&names)
    }

    /// One random action.
    fn act(&mut self) -> Result<(), Violation> {
        let by = Duration::from_millis(match self.rng.below(100) {
            0 => self.rng.between(5_000, 40_000),
            1..=30 => 0,
            _ => self.rng.below(40),
        });
        self.manual.advance(by);
        let roll = self.rng.below(self.mix.total());
        match self.mix.pick(roll) {
            Action::Publish => self.publish(),
            Action::PublishAgain => self.publish_again(),
            Action::Ack => self.ack(),
            Action::Nack => self.requeue(),
            Action::Fetch => self.fetch(),
            Action::Consume => self.consume(),
            Action::Commit => {
                let shard = self.rng.below(self.shards.len() as u64) as usize;
                self.commit(shard);
                Ok(())
            }
            Action::Read => {
                let shard = self.rng.below(self.shards.len() as u64) as usize;
                let now = self.clock.now();
                let n = read_backlog(&mut self.shards[shard], &mut self.rng, self.faults, now);
                if n > 0 {
                    self.note(format!("shard {shard} read {n} backlog runs"));
                }
                Ok(())
            }
            Action::Chores => {
                self.chores();
                Ok(())
            }
            Action::Purge => self.purge(),
            Action::Delete => self.delete(),
            Action::Redeclare => self.redeclare(),
            Action::Reconnect => {
                self.reconnect();
                Ok(())
            }
            Action::Crash if self.opts.crashes => self.crash(),
            Action::Crash => Ok(()),
            Action::Move => self.move_step(),
        }
    }

    fn commit(&mut self, shard: usize) {
        if let Some(what) = self.committers[shard].step(
            &mut self.shards[shard],
            &mut self.disk,
            &mut self.rng,
            self.faults,
        ) {
            if what.starts_with("wrote") {
                self.summary.rounds += 1;
            }
            self.note(format!("shard {shard} committer: {what}"));
        }
        for queue in self.committers[shard].take_forgotten() {
            self.summary.dedup_forgotten += 1;
            self.note(format!(
                "shard {shard} committer: {queue}'s acked segments went without their dedup ids (no space)"
            ));
            if let Some(q) = self.defs.iter().position(|d| *d.name == *queue) {
                self.model.dedup_forgotten(q);
            }
        }
    }

    fn chores(&mut self) {
        let now = self.clock.now();
        for shard in &mut self.shards {
            if shard.has_chores() {
                shard.do_chores(64, now);
            }
        }
    }

    fn pick_conn(&mut self, receiver: bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.conns.len())
            .filter(|&c| self.conns[c].receiver == receiver)
            .collect();
        (!candidates.is_empty()).then(|| *self.rng.pick(&candidates))
    }

    fn publish(&mut self) -> Result<(), Violation> {
        let Some(c) = self.pick_conn(false) else {
            return Ok(());
        };
        if self.conns[c].pending.len() >= WINDOW {
            return Ok(());
        }
        let to = *self.rng.pick(&RECEIVERS);
        let (exchange, key) = if self.rng.chance(250) {
            ("f", "")
        } else if self.rng.chance(800) {
            ("x", to)
        } else {
            ("x", *self.rng.pick(&RECEIVERS))
        };
        let conn = &mut self.conns[c];
        conn.next_n += 1;
        let (serial, n, cn) = (conn.serial, conn.next_n, conn.cn);
        let id = format!("{cn}-{serial}-{n}");
        let targets = self.targets(exchange, key, to);
        let m = self
            .model
            .published(id, to, exchange, key, serial, n, &targets);
        self.send_publish(c, m, &targets)
    }

    fn publish_again(&mut self) -> Result<(), Violation> {
        if self.model.msgs.is_empty() {
            return Ok(());
        }
        // Mostly one of the latest: the dedup window is about recent ids.
        let n = self.model.msgs.len() as u64;
        let m = if self.rng.chance(700) {
            (n - 1 - self.rng.below(n.min(64))) as usize
        } else {
            self.rng.below(n) as usize
        };
        let msg = &self.model.msgs[m];
        if msg.attempts >= 4 {
            return Ok(());
        }
        let sender = msg.id.split('-').next().unwrap_or_default().to_string();
        let (exchange, key, to) = (msg.exchange, msg.key, msg.to);
        let targets = self.targets(exchange, key, to);
        let same = targets.len() == msg.copies.len()
            && targets.iter().all(|q| {
                msg.copies
                    .get(q)
                    .is_some_and(|c| c.incarnation == self.model.incarnation[*q])
            });
        if !same {
            return Ok(());
        }
        let conns: Vec<usize> = (0..self.conns.len())
            .filter(|&c| self.conns[c].cn == sender)
            .collect();
        if conns.is_empty() {
            return Ok(());
        }
        let c = *self.rng.pick(&conns);
        if self.conns[c].pending.len() >= WINDOW {
            return Ok(());
        }
        let now_ms = self.now_ms();
        self.model.published_again(
            m,
            now_ms,
            self.settings.dedup_window,
            self.settings.max_deliveries,
        );
        self.send_publish(c, m, &targets)
    }

    fn send_publish(&mut self, c: usize, m: usize, targets: &[usize]) -> Result<(), Violation> {
        self.summary.publishes += 1;
        let msg = &self.model.msgs[m];
        let pad = (m * 7919 + msg.attempts as usize) % MAX_BODY;
        let pad = if pad > 600 && !m.is_multiple_of(5) {
            pad / 10
        } else {
            pad
        };
        let body = format!("{{\"to\":\"{}\",\"pad\":\"{}\"}}", msg.to, "x".repeat(pad));
        let (id, to, exchange, key) = (msg.id.clone(), msg.to, msg.exchange, msg.key);
        let conn = &mut self.conns[c];
        let sender: Arc<str> = Arc::from(conn.cn);
        let message = Message::published(
            &id,
            &body,
            sender,
            Route {
                exchange,
                routing_key: key,
                sent_at_ms: self.clock.unix_ms(),
            },
        );
        let origin = conn.origin();
        let now = self.clock.now();
        let status = self.shards[conn.shard].publish(origin, exchange, key, to, &message, now);
        let line = format!(
            "conn {} publish {id} to {to} via {exchange}/{key} (targets {targets:?}): {status:?}",
            conn.serial
        );
        match status {
            PublishStatus::Done(outcome) => {
                if targets.is_empty() && outcome.is_ok() {
                    return Err(Violation {
                        invariant: invariant::CONFINEMENT,
                        detail: format!("{line}: stored, but no lawful queue takes it"),
                    });
                }
                self.answered(m, outcome);
            }
            PublishStatus::Pending { local, remote } => {
                conn.pending.insert(
                    origin.seq,
                    Cmd::Publish {
                        msg: m,
                        outcome: local,
                        remaining: remote,
                        bytes: (body.len() * targets.len()) as u64,
                    },
                );
            }
        }
        self.note(line);
        Ok(())
    }

    fn answered(&mut self, m: usize, outcome: Result<(), NackReason>) {
        if outcome.is_ok() {
            self.summary.acked += 1;
        } else {
            self.summary.nacked += 1;
        }
        self.model.answered(m, outcome.is_ok());
    }

    /// Queues a receiver connection may read: its owner's, and their
    /// dead-letter queues.
    fn readable(&self, c: usize) -> Vec<(usize, bool)> {
        let owner = self.conns[c].cn;
        let mut out = Vec::new();
        for (q, def) in self.defs.iter().enumerate() {
            if def.owner != owner {
                continue;
            }
            if self.exists[q] {
                out.push((q, false));
            }
            // A dead-letter queue outlives its source.
            out.push((q, true));
        }
        out
    }

    fn queue_name(&self, q: usize, dlq: bool) -> String {
        if dlq {
            ciphermq_proto::name::dead_letter_queue_of(&self.defs[q].name).into_owned()
        } else {
            self.defs[q].name.clone()
        }
    }

    /// A receiver connection and one of its owner's queues (not a
    /// dead-letter queue; with `unconsumed`, one it does not consume yet).
    fn pick_own_queue(&mut self, unconsumed: bool) -> Option<(usize, usize, QueueInfo)> {
        let c = self.pick_conn(true)?;
        let own: Vec<usize> = self
            .readable(c)
            .into_iter()
            .filter(|&(q, dlq)| !(dlq || unconsumed && self.conns[c].consuming.contains(&q)))
            .map(|(q, _)| q)
            .collect();
        if own.is_empty() {
            return None;
        }
        let q = *self.rng.pick(&own);
        let info = self.info(&self.defs[q].name)?;
        Some((c, q, info))
    }

    fn consume(&mut self) -> Result<(), Violation> {
        let Some((c, q, info)) = self.pick_own_queue(true) else {
            return Ok(());
        };
        let prefetch = self.rng.between(1, 8) as u32;
        let now = self.clock.now();
        let conn = &mut self.conns[c];
        conn.consuming.push(q);
        conn.consumed = true;
        let origin = conn.origin();
        if self.shards[conn.shard]
            .consume(origin, &info, prefetch, now)
            .is_none()
        {
            conn.pending.insert(origin.seq, Cmd::Other);
        }
        let line = format!(
            "conn {} consume {} prefetch {prefetch}",
            conn.serial, info.name
        );
        self.note(line);
        Ok(())
    }

    fn fetch(&mut self) -> Result<(), Violation> {
        let Some(c) = self.pick_conn(true) else {
            return Ok(());
        };
        let readable = self.readable(c);
        if readable.is_empty() {
            return Ok(());
        }
        if self.conns[c]
            .pending
            .values()
            .any(|p| matches!(p, Cmd::Fetch))
        {
            return Ok(());
        }
        let (q, dlq) = *self.rng.pick(&readable);
        let name = self.queue_name(q, dlq);
        let Some(info) = self.info(&name) else {
            return Ok(());
        };
        let max = self.rng.between(1, 16) as u32;
        let now = self.clock.now();
        let conn = &mut self.conns[c];
        conn.consumed = true;
        let origin = conn.origin();
        let serial = conn.serial;
        match self.shards[conn.shard].fetch(origin, &info, max, now) {
            Some(Completion::Fetched(got)) => {
                self.note(format!(
                    "conn {serial} fetch {name} max {max}: {}",
                    got.len()
                ));
                for d in got {
                    self.delivered(c, d, true)?;
                }
            }
            Some(other) => {
                self.note(format!("conn {serial} fetch {name}: {other:?}"));
            }
            None => {
                self.conns[c].pending.insert(origin.seq, Cmd::Fetch);
                self.note(format!("conn {serial} fetch {name} max {max}: waits"));
            }
        }
        Ok(())
    }

    /// Takes one held delivery of a random connection (and every other of
    /// the same id from the same queue, as an `ack <id>` does).
    fn take_held(&mut self) -> Option<(usize, Vec<Outstanding>, Vec<Held>)> {
        let holders: Vec<usize> = (0..self.conns.len())
            .filter(|&c| !self.conns[c].held.is_empty())
            .collect();
        if holders.is_empty() {
            return None;
        }
        let c = *self.rng.pick(&holders);
        let conn = &mut self.conns[c];
        let i = self.rng.below(conn.held.len() as u64) as usize;
        let chosen = conn.held[i].clone();
        let id = self.model.msgs[chosen.msg].id.clone();
        let mut out = Vec::new();
        conn.tracker.take(&id, Some(&chosen.queue), &mut out);
        let mut taken = Vec::new();
        conn.held.retain(|h| {
            let same = h.msg == chosen.msg && h.queue == chosen.queue;
            if same {
                taken.push(h.clone());
            }
            !same
        });
        Some((c, out, taken))
    }

    fn ack(&mut self) -> Result<(), Violation> {
        let Some((c, out, taken)) = self.take_held() else {
            return Ok(());
        };
        let now = self.clock.now();
        let now_ms = self.now_ms();
        let conn = &self.conns[c];
        let shard = &mut self.shards[conn.shard];
        if out.len() > 1 || self.rng.chance(300) {
            shard.ack_many(conn.cref, &out, now);
        } else {
            for o in &out {
                shard.ack(conn.cref, o, now);
            }
        }
        for h in &taken {
            self.model.acked(h.msg, h.q, now_ms);
        }
        self.summary.consumer_acks += out.len() as u64;
        let serial = conn.serial;
        let seqs: Vec<u64> = out.iter().map(|o| o.seq).collect();
        let id = taken
            .first()
            .map(|h| self.model.msgs[h.msg].id.clone())
            .unwrap_or_default();
        let queue = taken
            .first()
            .map(|h| h.queue.to_string())
            .unwrap_or_default();
        self.note(format!("conn {serial} ack {id} from {queue} seqs {seqs:?}"));
        Ok(())
    }

    fn requeue(&mut self) -> Result<(), Violation> {
        let Some((c, out, taken)) = self.take_held() else {
            return Ok(());
        };
        let now = self.clock.now();
        let conn = &self.conns[c];
        for o in &out {
            self.shards[conn.shard].requeue(conn.cref, o, now);
        }
        let serial = conn.serial;
        let id = taken
            .first()
            .map(|h| self.model.msgs[h.msg].id.clone())
            .unwrap_or_default();
        self.note(format!(
            "conn {serial} nack {id} ({} deliveries)",
            out.len()
        ));
        Ok(())
    }

    fn purge(&mut self) -> Result<(), Violation> {
        let Some((c, q, info)) = self.pick_own_queue(false) else {
            return Ok(());
        };
        let now = self.clock.now();
        let conn = &mut self.conns[c];
        let origin = conn.origin();
        let serial = conn.serial;
        self.summary.purges += 1;
        // What is ready now may be gone, answered or not: the purge runs
        // even if its connection dies first. Marked again when answered,
        // for what was published meanwhile.
        self.model.purged(q);
        match self.shards[conn.shard].purge(origin, &info, now) {
            Some(done) => {
                self.note(format!("conn {serial} purge {}: {done:?}", info.name));
                self.model.purged(q);
            }
            None => {
                conn.pending.insert(origin.seq, Cmd::Purge { q });
                self.note(format!("conn {serial} purge {}: waits", info.name));
            }
        }
        Ok(())
    }

    /// Whether queue `q`'s owner is moving: its queues are neither deleted
    /// nor declared meanwhile (the cluster changes an owner's topology only
    /// where the owner is served).
    fn is_moving(&self, q: usize) -> bool {
        self.moving
            .as_ref()
            .is_some_and(|m| m.owner == self.defs[q].owner)
    }

    fn delete(&mut self) -> Result<(), Violation> {
        let candidates: Vec<usize> = (0..self.defs.len())
            .filter(|&q| self.exists[q] && !self.is_moving(q))
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let q = *self.rng.pick(&candidates);
        let name = self.defs[q].name.clone();
        let Some(info) = self.info(&name) else {
            return Ok(());
        };
        if let Err(e) = self.change(TopologyChange::DeleteQueue {
            name: name.clone(),
            by: Actor::receiver(self.defs[q].owner),
        }) {
            self.note(format!("delete {name} refused: {e}"));
            return Ok(());
        }
        self.exists[q] = false;
        self.summary.deletes += 1;
        let (removed, done) = pending();
        let shard = self.rng.below(self.shards.len() as u64) as usize;
        self.shards[shard].delete_queue(&info, done);
        self.deleting[q] = Some(removed);
        self.note(format!("delete {name} (from shard {shard})"));
        Ok(())
    }

    fn redeclare(&mut self) -> Result<(), Violation> {
        let candidates: Vec<usize> = (0..self.defs.len())
            .filter(|&q| {
                !self.exists[q]
                    && self.deleting[q].is_none()
                    && !self.blocked[q]
                    && !self.is_moving(q)
            })
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let q = *self.rng.pick(&candidates);
        self.declare(q).map_err(|e| Violation {
            invariant: "topology",
            detail: format!("declaring {} again: {e}", self.defs[q].name),
        })?;
        self.note(format!("declared {} again", self.defs[q].name));
        Ok(())
    }

    /// One step of an owner's move (see [`Move`]): starts one, detaches its
    /// settled queues, or brings them back once their directories moved.
    fn move_step(&mut self) -> Result<(), Violation> {
        let Some(mut mv) = self.moving.take() else {
            self.start_move();
            return Ok(());
        };
        if mv.detached.is_empty() {
            let quiet = mv
                .parts
                .iter()
                .all(|(s, names)| self.shards[*s].is_quiet(names));
            if quiet {
                let keep = self.data.join("moving");
                for (s, names) in &mv.parts {
                    let moved = self.shards[*s].detach(names, &|name| Some(keep.join(name)));
                    mv.detached.extend(moved.into_iter().map(|p| (p, None)));
                    // Gone from here as far as routing goes: in the cluster
                    // the topology now names the heir, and nothing makes
                    // these queues here again before they come back.
                    self.shards[*s].freeze(names);
                }
                let left: Vec<usize> = (0..self.defs.len())
                    .filter(|&q| {
                        mv.parts
                            .iter()
                            .any(|(_, names)| names.iter().any(|n| **n == *self.defs[q].name))
                    })
                    .collect();
                self.model.memory_lost(Some(&left));
                self.note(format!("move of {}: its queues leave", mv.owner));
            }
            self.moving = Some(mv);
            return Ok(());
        }
        for (moved, outcome) in &mut mv.detached {
            if outcome.is_none() {
                *outcome = moved.try_take();
            }
        }
        if mv.detached.iter().any(|(_, outcome)| outcome.is_none()) {
            self.moving = Some(mv);
            return Ok(());
        }
        self.arrive(mv)
    }

    /// Starts moving a receiver whose queues are not being deleted: its
    /// connections close (they were on the node it leaves) and its queues
    /// freeze.
    fn start_move(&mut self) {
        let owner = *self.rng.pick(&RECEIVERS);
        let deleting = (0..self.defs.len()).any(|q| {
            self.defs[q].owner == owner && (self.deleting[q].is_some() || self.blocked[q])
        });
        if deleting {
            return;
        }
        let mut parts = Vec::new();
        for s in 0..self.shards.len() {
            // In name order: the topology's own order is a hash map's.
            let mut names = self.shards[s].owner_queues(owner);
            names.sort();
            if !names.is_empty() {
                parts.push((s, names));
            }
        }
        if parts.is_empty() {
            return;
        }
        for (s, names) in &parts {
            self.shards[*s].freeze(names);
        }
        let mut c = 0;
        while c < self.conns.len() {
            if self.conns[c].cn != owner {
                c += 1;
                continue;
            }
            let conn = self.conns.swap_remove(c);
            self.shards[conn.shard].unregister_conn(conn.cref, conn.consumed);
            self.unanswered_purges(&conn);
        }
        self.summary.moves += 1;
        self.note(format!("move of {owner} begins: {parts:?} freeze"));
        self.moving = Some(Move {
            owner,
            parts,
            detached: Vec::new(),
        });
    }

    /// The moved queues arrive: each directory goes back under `queues/`
    /// (wherever its move left it: a failed rename leaves it in place), the
    /// queue is recovered from it and serves again, and the owner
    /// connects.
    fn arrive(&mut self, mv: Move) -> Result<(), Violation> {
        let now = self.clock.now();
        for (s, names) in &mv.parts {
            for name in names {
                let home = queue_dir(&self.data, name);
                self.come_home(name)?;
                // A queue that never stored anything has no directory: it
                // is made anew when first used, as the broker's adoption
                // leaves it.
                if home.exists() && !self.shards[*s].holds_queue(name) {
                    self.recover(*s, name, now)?;
                }
            }
            self.shards[*s].thaw(names, now);
            for name in names {
                if let Some(q) = self.defs.iter().position(|d| *d.name == **name) {
                    self.model.queue_moved(q);
                }
            }
        }
        let outcomes: Vec<String> = mv
            .detached
            .iter()
            .map(|(_, outcome)| format!("{outcome:?}"))
            .collect();
        self.note(format!(
            "move of {}: back and serving (directory moves: {outcomes:?})",
            mv.owner
        ));
        self.open(mv.owner);
        Ok(())
    }

    /// Moves `name`'s directory back from `moving/` if its move took it
    /// there, durably.
    fn come_home(&mut self, name: &str) -> Result<(), Violation> {
        let kept = self.data.join("moving").join(name);
        if !kept.exists() {
            return Ok(());
        }
        let home = queue_dir(&self.data, name);
        self.disk
            .rename_dir(&kept, &home)
            .map_err(|e| io_violation("moving a queue's directory back", e))?;
        self.disk.sync_dir(&self.data.join("queues"));
        self.disk.sync_dir(&self.data.join("moving"));
        Ok(())
    }

    /// Finishes a move in progress (before the final drain): commits until
    /// its queues settle, leave and come back.
    fn finish_move(&mut self) -> Result<(), Violation> {
        for _ in 0..10_000 {
            if self.moving.is_none() {
                return Ok(());
            }
            for shard in 0..self.shards.len() {
                while self.committers[shard].has_work(&self.shards[shard]) {
                    self.commit(shard);
                }
            }
            self.settle()?;
            self.move_step()?;
        }
        Err(Violation {
            invariant: invariant::ACKED_NOT_LOST,
            detail: "a move never finished: its queues never settled".into(),
        })
    }

    fn reconnect(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let c = self.rng.below(self.conns.len() as u64) as usize;
        let conn = self.conns.swap_remove(c);
        self.shards[conn.shard].unregister_conn(conn.cref, conn.consumed);
        self.unanswered_purges(&conn);
        self.note(format!(
            "conn {} ({}) closed with {} held; a new one opens",
            conn.serial,
            conn.cn,
            conn.held.len()
        ));
        self.open(conn.cn);
    }

    /// A purge its connection will never see answered may still have
    /// dropped what was published up to now.
    fn unanswered_purges(&mut self, conn: &SimConn) {
        for cmd in conn.pending.values() {
            if let Cmd::Purge { q } = cmd {
                self.model.purged(*q);
            }
        }
    }

    fn crash(&mut self) -> Result<(), Violation> {
        self.summary.crashes += 1;
        // Whatever is in flight dies with the process.
        for conn in std::mem::take(&mut self.conns) {
            self.unanswered_purges(&conn);
        }
        self.shards.clear();
        self.inbounds.clear();
        self.committers.clear();
        let changed = self
            .disk
            .crash(&mut self.rng)
            .map_err(|e| io_violation("crash", e))?;
        self.model.crashed();
        self.note(format!("CRASH: {} files changed", changed.len()));
        for line in changed {
            self.note(format!("CRASH   {line}"));
        }
        self.boot()
    }

    /// After an action: shards exchange what they sent each other,
    /// connections read their mailboxes, deletions are answered, and once
    /// a simulated second the shards sweep.
    fn settle(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            for shard in &mut self.shards {
                shard.flush();
            }
            let mut any = false;
            for (i, inbound) in self.inbounds.iter().enumerate() {
                while let Poll::Ready(Some(batch)) = inbound.poll_recv(&mut cx) {
                    any = true;
                    for msg in batch {
                        self.shards[i].handle(msg, now);
                    }
                }
            }
            if !any {
                break;
            }
        }
        for c in 0..self.conns.len() {
            let mut events = VecDeque::new();
            self.conns[c].mailbox.drain_into(&mut events);
            for event in events {
                self.event(c, event)?;
            }
        }
        for q in 0..self.defs.len() {
            let Some(result) = self.deleting[q].as_mut().and_then(Pending::try_take) else {
                continue;
            };
            self.deleting[q] = None;
            self.model.deleted(q);
            let name = self.defs[q].name.clone();
            match result {
                Ok(()) => {
                    let _ = self.change(TopologyChange::QueueRemoved { name: name.clone() });
                    self.note(format!("delete {name}: done"));
                }
                Err(e) => {
                    self.blocked[q] = true;
                    self.note(format!("delete {name}: {e}; the next start finishes it"));
                }
            }
        }
        let elapsed = self.manual.elapsed();
        if elapsed >= self.last_sweep + Duration::from_secs(1) {
            self.last_sweep = elapsed;
            for shard in &mut self.shards {
                shard.sweep(now);
            }
            self.check_memory()?;
        }
        Ok(())
    }

    fn event(&mut self, c: usize, event: ConnEvent) -> Result<(), Violation> {
        match event {
            ConnEvent::Completed { seq, completion } => {
                let cmd = self.conns[c].pending.remove(&seq);
                match (cmd, completion) {
                    (
                        Some(Cmd::Publish {
                            msg,
                            outcome,
                            remaining,
                            bytes,
                        }),
                        Completion::Enqueued(part),
                    ) => {
                        let outcome = outcome.and(part);
                        if remaining > 1 {
                            self.conns[c].pending.insert(
                                seq,
                                Cmd::Publish {
                                    msg,
                                    outcome,
                                    remaining: remaining - 1,
                                    bytes,
                                },
                            );
                        } else {
                            self.note(format!(
                                "conn {} publish {} answered: {outcome:?}",
                                self.conns[c].serial, self.model.msgs[msg].id
                            ));
                            self.answered(msg, outcome);
                        }
                    }
                    (_, Completion::Fetched(got)) => {
                        self.note(format!(
                            "conn {} fetch answered: {}",
                            self.conns[c].serial,
                            got.len()
                        ));
                        for d in got {
                            self.delivered(c, d, true)?;
                        }
                    }
                    (Some(Cmd::Purge { q }), Completion::Purged { count, durable }) => {
                        self.note(format!(
                            "purge of {} answered: {count} ({durable:?})",
                            self.defs[q].name
                        ));
                        self.model.purged(q);
                    }
                    (cmd, completion) => {
                        if !matches!(completion, Completion::Consumed) {
                            self.note(format!("unexpected answer {completion:?} to {cmd:?}"));
                        }
                    }
                }
            }
            ConnEvent::Delivery(d) => self.delivered(c, d, false)?,
            ConnEvent::QueueDeleted { queue, .. } => {
                let conn = &mut self.conns[c];
                conn.tracker.forget_queue(&queue);
                conn.held.retain(|h| h.queue != queue);
                if let Some(q) = self.defs.iter().position(|d| *d.name == *queue) {
                    conn.consuming.retain(|&x| x != q);
                }
            }
        }
        Ok(())
    }

    fn delivered(
        &mut self,
        c: usize,
        d: ciphermq_shard::Delivery,
        fetched: bool,
    ) -> Result<(), Violation> {
        self.summary.deliveries += 1;
        let base = d
            .queue
            .strip_suffix(ciphermq_proto::name::DEAD_LETTER_SUFFIX);
        let dlq = base.is_some();
        let base = base.unwrap_or(&d.queue);
        let Some(q) = self.defs.iter().position(|def| def.name == base) else {
            return Err(Violation {
                invariant: invariant::CONFINEMENT,
                detail: format!("delivery from unknown queue {}", d.queue),
            });
        };
        let owner = self.defs[q].owner;
        let serial = self.conns[c].serial;
        let id = d.msg.message_id().to_string();
        self.note(format!(
            "conn {serial} got {id} from {} seq {} count {}",
            d.queue, d.seq, d.count
        ));
        let m = self
            .model
            .delivered(serial, fetched, q, dlq, owner, &id, d.seq, d.count)?;
        let conn = &mut self.conns[c];
        conn.tracker.record(&d);
        conn.held.push(Held {
            queue: d.queue.clone(),
            q,
            msg: m,
            bytes: d.msg.body().len(),
        });
        Ok(())
    }

    /// The bodies each shard holds in memory stay bounded however long the
    /// backlog grows: a queue with messages on disk keeps at most a
    /// read-ahead batch of them in memory (`READAHEAD_MESSAGES`, so that
    /// consumers that keep up are served from memory), and the rest (queues
    /// served from memory) stays within twice the shard's part of the budget
    /// beyond what consumers hold unacked and what waits for its commit
    /// (bounded by the clients' windows).
    fn check_memory(&mut self) -> Result<(), Violation> {
        let unacked: u64 = self
            .conns
            .iter()
            .flat_map(|c| c.held.iter())
            .map(|h| h.bytes as u64)
            .sum();
        let uncommitted: u64 = self
            .conns
            .iter()
            .flat_map(|c| c.pending.values())
            .map(|p| match p {
                Cmd::Publish { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum();
        for (i, shard) in self.shards.iter().enumerate() {
            let stats = shard.queue_stats();
            let mut read_ahead = 0;
            for q in stats.iter().filter(|q| q.on_disk > 0) {
                let in_memory = q.ready as u64 - q.on_disk.min(q.ready as u64);
                if in_memory > READAHEAD_MESSAGES as u64 + READ_BATCH_MESSAGES {
                    return Err(Violation {
                        invariant: invariant::MEMORY_BUDGET,
                        detail: format!(
                            "shard {i}: {} keeps {in_memory} of its {} ready messages in memory beside {} on disk",
                            q.name, q.ready, q.on_disk
                        ),
                    });
                }
                read_ahead += q.memory_bytes;
            }
            let held = shard.held_bytes();
            let beyond = held.saturating_sub(unacked + uncommitted + read_ahead);
            let share = beyond as f64 / SPILL_BYTES as f64;
            if share > self.summary.worst_memory {
                self.summary.worst_memory = share;
            }
            if beyond > 2 * SPILL_BYTES + MAX_BODY as u64 {
                let queues: Vec<String> = stats
                    .iter()
                    .filter(|q| q.memory_bytes > 0)
                    .map(|q| {
                        format!(
                            "{}: {} bytes in memory, {} ready ({} on disk), {} unacked",
                            q.name, q.memory_bytes, q.ready, q.on_disk, q.unacked
                        )
                    })
                    .collect();
                return Err(Violation {
                    invariant: invariant::MEMORY_BUDGET,
                    detail: format!(
                        "shard {i} holds {held} bytes, {beyond} beyond consumers' unacked ({unacked}), publishes waiting for commits ({uncommitted}) and read-ahead ({read_ahead}); its budget is {SPILL_BYTES}: {queues:?}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The end: no more faults; every consumer takes and acks everything
    /// until the queues are empty.
    fn drain(&mut self) -> Result<(), Violation> {
        let mut quiet_rounds = 0;
        for round in 0..5_000 {
            self.manual.advance(Duration::from_millis(200));
            for shard in 0..self.shards.len() {
                while self.committers[shard].has_work(&self.shards[shard]) {
                    self.commit(shard);
                }
                let now = self.clock.now();
                read_backlog(&mut self.shards[shard], &mut self.rng, self.faults, now);
            }
            self.chores();
            self.settle()?;
            for c in 0..self.conns.len() {
                if self.conns[c].receiver {
                    // One fetch at a time, each round the next queue.
                    let readable = self.readable(c);
                    let waiting = self.conns[c]
                        .pending
                        .values()
                        .any(|p| matches!(p, Cmd::Fetch));
                    if let (false, Some(&(q, dlq))) =
                        (waiting, readable.get(round % readable.len().max(1)))
                    {
                        let name = self.queue_name(q, dlq);
                        if let Some(info) = self.info(&name) {
                            let now = self.clock.now();
                            let conn = &mut self.conns[c];
                            conn.consumed = true;
                            let origin = conn.origin();
                            match self.shards[conn.shard].fetch(origin, &info, 16, now) {
                                Some(Completion::Fetched(got)) => {
                                    for d in got {
                                        self.delivered(c, d, true)?;
                                    }
                                }
                                Some(_) => {}
                                None => {
                                    self.conns[c].pending.insert(origin.seq, Cmd::Fetch);
                                }
                            }
                        }
                    }
                }
            }
            self.settle()?;
            while self.take_held_and_ack()? {}
            self.settle()?;
            let busy = self
                .shards
                .iter()
                .any(|s| s.queue_stats().iter().any(|q| q.ready > 0 || q.unacked > 0))
                || self.conns.iter().any(|c| !c.pending.is_empty())
                || (0..self.shards.len()).any(|s| self.committers[s].has_work(&self.shards[s]));
            if busy {
                quiet_rounds = 0;
            } else {
                quiet_rounds += 1;
                if quiet_rounds >= 3 {
                    return Ok(());
                }
            }
        }
        let left: Vec<String> = self
            .shards
            .iter()
            .flat_map(|s| s.queue_stats())
            .filter(|q| q.ready > 0 || q.unacked > 0)
            .map(|q| {
                format!(
                    "{}: {} ready, {} unacked, {} on disk",
                    q.name, q.ready, q.unacked, q.on_disk
                )
            })
            .collect();
        let held: usize = self.conns.iter().map(|c| c.held.len()).sum();
        Err(Violation {
            invariant: invariant::ACKED_NOT_LOST,
            detail: format!(
                "the final drain did not empty the queues: {left:?}; clients hold {held}"
            ),
        })
    }

    fn take_held_and_ack(&mut self) -> Result<bool, Violation> {
        if self.conns.iter().all(|c| c.held.is_empty()) {
            return Ok(false);
        }
        self.ack()?;
        Ok(true)
    }
}
