//! The session layer under the seeded simulation: random clients send
//! command lines through [`Session`]s to one durable shard whose commits
//! run on the simulation's committer and disk (`ciphermq-sim`), with failed
//! writes and syncs, full disks, and crashes that tear what was not synced.
//! What the clients read back is checked after every step:
//!
//! - **replies**: every command gets exactly its reply, in command order,
//!   with the text docs/PROTOCOL.md gives: `ACK <id>` only where a queue
//!   lawfully takes the envelope, `NACK <id> no_route` where none does,
//!   `NACK <id> storage` only when the disk failed it, the ACL's
//!   `Access denied` lines for a receiver using another's queue or a
//!   sender consuming, `ACK_CONFIRMED`/`NACK_CONFIRMED` for a held
//!   delivery and `Error: no outstanding delivery` for any other id,
//!   `OK ack_batch <q> <n>` with `n` the deliveries it settled;
//! - **confinement**: a receiver is delivered only from its own queue, only
//!   envelopes addressed to it, and only what a sender published;
//! - **acked-not-lost**: after a last drain without faults, every publish
//!   answered `ACK` was acked by its receiver (`ACK_CONFIRMED`) at some
//!   point, across any number of crashes, unless its queue was purged or
//!   it was given back so often it may have been dead-lettered.
//!
//! Receivers also close connections holding deliveries, and delete their
//! queue and declare it again while everyone else keeps going; what races a
//! deletion is allowed either outcome the contract gives it.
//!
//! The shard-level simulation (`sim/`) drives the shard directly, with
//! more queues and two shards; this one adds what lies between a client's
//! line and the shard: parsing, the ACL, the reply queue and its order.
//! Seeded and replayable: a failure names its seed and the lines that led
//! to it; `CIPHERMQ_SESSION_SIM_SEED=<n>` runs that seed alone and
//! `CIPHERMQ_SESSION_SIM_RUNS=<n>` runs more seeds than the default.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ciphermq_shard::log::{queue_dir, recover_queue_at};
use ciphermq_shard::{Clock, ManualClock, Mesh, MeshInbound, QueueSettings, TopologyStore};
use ciphermq_sim::committer::{read_backlog, Committer, Faults};
use ciphermq_sim::disk::SimDisk;
use ciphermq_sim::rng::Rng;
use ciphermq_sim::shard_on_disk::durable_shard;

use super::{body, Backing, Broker, Client};

/// How long a reply decided off the shard may take before the run fails
/// rather than hangs (the saver thread answers in milliseconds; a busy host
/// may take seconds).
const HANG_GUARD: Duration = Duration::from_secs(300);

/// Wakes the simulation's thread when a reply decided by another thread
/// (the topology saver) is in.
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Seeds a default run tries.
const RUNS: u64 = 120;
/// Commands per seed, before the last drain.
const STEPS: usize = 400;
/// Small segments, so acked ones are deleted (and their ids carried)
/// within a run.
const SEGMENT_BYTES: u64 = 8 * 1024;
/// The receivers, each owning `<cn>_queue` bound to `ex` under its CN.
const RECEIVERS: [&str; 2] = ["receiver_1", "receiver_2"];
const SENDERS: [&str; 2] = ["sender_1", "sender_2"];
/// Routing keys a sender picks from: each receiver's, and one no queue
/// is bound with.
const KEYS: [&str; 3] = ["receiver_1", "receiver_2", "nobody"];
/// A delivery given back this many times may have gone to the dead-letter
/// queue (the broker's `max_deliveries` is higher): not judged for loss.
const GIVEN_BACK_LIMIT: u32 = 3;

/// What a command's reply must be.
#[derive(Debug)]
enum Expect {
    /// Exactly this line.
    Exactly(String),
    /// A broken line's error: `Error: …`, or `NACK …` for a publish.
    AnyError,
    /// A publish that a queue takes: `ACK <id>`, or `NACK <id> storage`
    /// when the disk failed it.
    Stored { id: String, msg: usize },
    /// Either of two lines (a command racing a queue's deletion).
    Either(String, String),
    /// A publish to a queue being deleted and declared again: as
    /// [`Expect::Stored`], or `NACK <id> no_route`; an `ACK` is not judged
    /// for loss (the queue it reached may be the deleted one).
    Flux { id: String, msg: usize },
    /// `OK delete_queue <q>`, or its storage error (the queue is deleted
    /// all the same; the next start removes its log).
    DeleteQueue(String),
    /// `OK fetch <n>`, or the quota's error.
    Fetch,
    /// `OK purge_queue <q> <n>`, or the storage error of a purge.
    Purge(String),
}

/// One connection of the simulated clients.
struct Conn {
    cn: &'static str,
    client: Client,
    /// Replies owed, in command order.
    owed: VecDeque<(Expect, String)>,
    /// Deliveries held, by id (a count: an id stored twice is held twice;
    /// an `ack` of the id settles them all).
    held: HashMap<String, u32>,
    consuming: bool,
}

/// A message a sender published.
#[derive(Debug)]
struct Published {
    id: String,
    /// The receiver its envelope names.
    to: &'static str,
    /// Its publish was answered `ACK` at least once.
    acked: bool,
    /// Its receiver acked a delivery of it.
    consumed: bool,
    /// Its queue was purged after it was published, or it was given back
    /// often: not judged for loss.
    exempt: bool,
    /// The most deliveries of it seen (the `count` of its lines).
    max_count: u32,
}

/// One seed's run.
struct World {
    rng: Rng,
    broker: Broker,
    settings: QueueSettings,
    store: Arc<TopologyStore>,
    data: PathBuf,
    _disk_root: tempfile::TempDir,
    disk: SimDisk,
    clock: Clock,
    manual: Arc<ManualClock>,
    inbound: MeshInbound,
    committer: Committer,
    faults: Faults,
    conns: Vec<Conn>,
    msgs: Vec<Published>,
    by_id: HashMap<String, usize>,
    trace: VecDeque<String>,
    crashes: u64,
    acks: u64,
    /// A failure found where it cannot be returned (while sending).
    failure: Option<Failure>,
    /// The last deletion's log was not moved away: the next start finishes
    /// it.
    delete_failed: bool,
    /// Receivers whose queue is being deleted and declared again.
    flux: Vec<&'static str>,
    /// Queue deletions and connections closed holding deliveries.
    deletes: u64,
    reconnects: u64,
}

/// A broken promise, with what led to it.
type Failure = String;

impl World {
    fn new(seed: u64) -> World {
        let broker = Broker::start(Backing::DataDir, &RECEIVERS, "");
        let mut admin = broker.client("admin");
        let mut setup = vec![(
            "declare_exchange ex direct".to_owned(),
            "OK declare_exchange ex".to_owned(),
        )];
        for cn in RECEIVERS {
            setup.push((
                format!("declare_queue {cn}_queue"),
                format!("OK declare_queue {cn}_queue"),
            ));
            setup.push((
                format!("bind {cn}_queue ex {cn}"),
                format!("OK bind {cn}_queue ex {cn}"),
            ));
        }
        for (line, reply) in setup {
            assert_eq!(admin.send(line.as_bytes()), vec![reply], "setup: {line}");
        }
        drop(admin);
        let settings = QueueSettings {
            carry_dedup: true,
            // A fixed key: one seed, one run.
            dedup_hasher: ciphermq_shard::DedupHasher::from_bytes([7; 16]),
            ..QueueSettings::default()
        };
        let store = broker.local.shared.topology.clone();
        let disk_root = tempfile::tempdir().expect("tempdir");
        let data = disk_root.path().to_path_buf();
        std::fs::create_dir_all(data.join("queues")).expect("queues dir");
        let disk = SimDisk::new(&data).expect("simulated disk");
        let (clock, manual) = Clock::manual(1_700_000_000_000);
        let inbound = Mesh::build(1).pop().expect("one endpoint").inbound;
        let mut rng = Rng::new(seed);
        let faults = Faults {
            io_per_mille: rng.between(5, 40),
            read_per_mille: 30,
            space_per_mille: 250,
        };
        let mut world = World {
            rng,
            broker,
            settings,
            store,
            data,
            _disk_root: disk_root,
            disk,
            clock,
            manual,
            inbound,
            committer: Committer::default(),
            faults,
            conns: Vec::new(),
            msgs: Vec::new(),
            by_id: HashMap::new(),
            trace: VecDeque::new(),
            crashes: 0,
            acks: 0,
            failure: None,
            delete_failed: false,
            flux: Vec::new(),
            deletes: 0,
            reconnects: 0,
        };
        world.boot().expect("the first start");
        world
    }

    /// A shard over the simulated disk with every queue recovered from it,
    /// in place of the one before; every client connects again.
    fn boot(&mut self) -> Result<(), Failure> {
        self.conns.clear();
        // Deletions whose log was not moved away are finished before
        // anything reads, as a start does.
        let deleting: Vec<String> = self
            .store
            .snapshot()
            .deleting()
            .iter()
            .map(|s| s.to_string())
            .collect();
        for name in deleting {
            self.disk.remove_dir(&queue_dir(&self.data, &name));
            let mut removed = self
                .store
                .submit(ciphermq_shard::TopologyChange::QueueRemoved { name: name.clone() });
            let mut waited = 0;
            loop {
                match removed.try_take() {
                    Some(Ok(_)) => break,
                    Some(Err(e)) => return Err(format!("removing {name} at start: {e}")),
                    None if waited < 100_000 => {
                        waited += 1;
                        std::thread::yield_now();
                    }
                    None => return Err(format!("removing {name} at start: never saved")),
                }
            }
        }
        let endpoint = Mesh::build(1).pop().expect("one endpoint");
        let mut shard = durable_shard(
            &self.data,
            SEGMENT_BYTES,
            &self.settings,
            &self.store,
            endpoint.outbound,
            &self.clock,
        );
        let window_ms = self.settings.dedup_window.as_millis() as u64;
        let now = self.clock.now();
        for cn in RECEIVERS {
            let name = format!("{cn}_queue");
            let dir = queue_dir(&self.data, &name);
            if !dir.exists() {
                continue;
            }
            let recovered =
                recover_queue_at(&dir, &self.settings.dedup_hasher, window_ms, &self.clock)
                    .map_err(|e| format!("recovery of {name} failed: {e}"))?;
            shard.restore_queue(Arc::from(name.as_str()), recovered, now);
        }
        self.disk
            .settle(&self.data)
            .map_err(|e| format!("disk settle: {e}"))?;
        *self.broker.local.shard.borrow_mut() = shard;
        self.inbound = endpoint.inbound;
        self.committer = Committer::default();
        for cn in RECEIVERS.iter().chain(SENDERS.iter()) {
            self.connect(cn);
        }
        Ok(())
    }

    fn connect(&mut self, cn: &'static str) {
        self.conns.push(Conn {
            cn,
            client: self.broker.client(cn),
            owed: VecDeque::new(),
            held: HashMap::new(),
            consuming: false,
        });
    }

    fn note(&mut self, line: String) {
        if self.trace.len() == trace_lines() {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    /// Sends `line` on connection `c`, owing `expect`.
    fn send(&mut self, c: usize, line: String, expect: Expect) {
        let cn = self.conns[c].cn;
        let shown = match line.find('{') {
            Some(at) => format!("{}{{…}}", &line[..at]),
            None => line.clone(),
        };
        self.note(format!("{cn}#{c}: {shown}"));
        // A connection executes nothing while a reply decided off the
        // shard (a topology change being saved) is pending.
        if let Err(e) = self.await_pending(c) {
            self.failure.get_or_insert(e);
            return;
        }
        self.conns[c].owed.push_back((expect, shown));
        self.conns[c].client.session.execute(line.as_bytes());
    }

    /// Runs the shard until connection `c`'s replies decided off the shard
    /// are in (a topology change saved by the saver thread, a deletion
    /// finished by the committer). While only another thread can answer,
    /// this thread sleeps until that reply wakes it.
    fn await_pending(&mut self, c: usize) -> Result<(), Failure> {
        if self.conns[c].client.session.pending_replies.is_empty() {
            return Ok(());
        }
        // The shard is brought to rest first, so what it does from here
        // depends on the replies alone, never on when the saver thread
        // answered: a seed replays exactly.
        self.pump(None)?;
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let started = std::time::Instant::now();
        loop {
            let session = &mut self.conns[c].client.session;
            session.poll_pending_replies(&mut cx);
            if session.pending_replies.is_empty() {
                return Ok(());
            }
            let shard_work = {
                let shard = self.broker.local.shard.borrow();
                self.committer.has_work(&shard) || shard.has_chores()
            };
            if shard_work {
                self.pump(None)?;
                continue;
            }
            // Not a timing assumption: only a reply that never comes gets
            // here, and it fails the run instead of hanging it.
            if started.elapsed() > HANG_GUARD {
                return Err(format!(
                    "{}#{c}: a reply decided off the shard never came",
                    self.conns[c].cn
                ));
            }
            std::thread::park_timeout(Duration::from_secs(1));
        }
    }

    /// One random command.
    fn act(&mut self) -> Result<(), Failure> {
        let c = self.rng.below(self.conns.len() as u64) as usize;
        let cn = self.conns[c].cn;
        let roll = self.rng.below(100);
        if cn.starts_with("sender") {
            match roll {
                0..=84 => self.publish(c),
                85..=89 => self.republish(c),
                90..=94 => {
                    let q = format!("{}_queue", self.rng.pick(&RECEIVERS));
                    self.send(
                        c,
                        format!("consume {q} 4"),
                        Expect::Exactly(
                            "Access denied: senders may not consume (role=sender)".into(),
                        ),
                    );
                }
                95..=97 => self.ack_unknown(c),
                _ => self.reconnect(c),
            }
            return Ok(());
        }
        let own = format!("{cn}_queue");
        match roll {
            0..=9 if !self.conns[c].consuming => {
                self.conns[c].consuming = true;
                let prefetch = self.rng.between(1, 8);
                let reply = format!("OK consume {own}");
                self.send(
                    c,
                    format!("consume {own} {prefetch}"),
                    Expect::Exactly(reply),
                );
            }
            0..=29 => {
                let n = self.rng.between(1, 8);
                self.send(c, format!("fetch {own} {n}"), Expect::Fetch);
            }
            30..=64 => self.ack_held(c, false),
            65..=72 => self.ack_held(c, true),
            73..=76 => self.ack_unknown(c),
            77..=80 => {
                let other = RECEIVERS.iter().find(|r| **r != cn).expect("two receivers");
                let verb = *self.rng.pick(&["fetch", "consume", "purge_queue"]);
                self.send(
                    c,
                    format!("{verb} {other}_queue"),
                    Expect::Exactly(
                        "Access denied: receivers may only use their own queues (role=receiver)"
                            .into(),
                    ),
                );
            }
            81..=82 => {
                let id = format!("{cn}-forged-{}", self.rng.below(1000));
                let line = format!("publish ex {cn} {}", body(&id, cn));
                self.send(c, line, Expect::Exactly(format!("NACK {id} access_denied")));
            }
            83 => {
                for m in &mut self.msgs {
                    if m.to == cn && !m.consumed {
                        m.exempt = true;
                    }
                }
                self.send(c, format!("purge_queue {own}"), Expect::Purge(own));
            }
            84..=89 => self.ack_batch(c),
            90..=92 => self.reconnect(c),
            93 => return self.delete_and_declare(c),
            _ => self.garbage(c),
        }
        Ok(())
    }

    fn publish(&mut self, c: usize) {
        let cn = self.conns[c].cn;
        let key = *self.rng.pick(&KEYS);
        let to = *self.rng.pick(&RECEIVERS);
        let id = format!("{cn}-{}", self.msgs.len());
        let msg = self.msgs.len();
        self.by_id.insert(id.clone(), msg);
        self.msgs.push(Published {
            id: id.clone(),
            to,
            acked: false,
            consumed: false,
            exempt: false,
            max_count: 0,
        });
        let line = format!("publish ex {key} {}", body(&id, to));
        // Confinement: a queue takes only its owner's envelopes, so a key
        // naming another receiver routes nowhere.
        let expect = if key == to {
            Expect::Stored { id, msg }
        } else {
            Expect::Exactly(format!("NACK {id} no_route"))
        };
        self.send(c, line, expect);
    }

    /// The same id and envelope again, routed where it was: stored at most
    /// once more, answered as a first publish.
    fn republish(&mut self, c: usize) {
        let cn = self.conns[c].cn;
        let mine: Vec<usize> = (0..self.msgs.len())
            .filter(|&m| self.msgs[m].id.starts_with(cn))
            .collect();
        if mine.is_empty() {
            return self.publish(c);
        }
        let msg = *self.rng.pick(&mine);
        let (id, to) = (self.msgs[msg].id.clone(), self.msgs[msg].to);
        let line = format!("publish ex {to} {}", body(&id, to));
        self.send(c, line, Expect::Stored { id, msg });
    }

    /// Acks (or gives back) a delivery the connection holds.
    fn ack_held(&mut self, c: usize, nack: bool) {
        let mut held: Vec<String> = self.conns[c].held.keys().cloned().collect();
        if held.is_empty() {
            return self.ack_unknown(c);
        }
        held.sort();
        let id = self.rng.pick(&held).clone();
        // Without a queue, `ack` and `nack` settle every outstanding
        // delivery of the id to the connection (an id stored twice).
        self.conns[c].held.remove(&id);
        let m = self.by_id[&id];
        if nack && self.msgs[m].max_count < GIVEN_BACK_LIMIT {
            self.send(
                c,
                format!("nack {id}"),
                Expect::Exactly(format!("NACK_CONFIRMED {id}")),
            );
            return;
        }
        self.msgs[m].consumed = true;
        self.acks += 1;
        self.send(
            c,
            format!("ack {id}"),
            Expect::Exactly(format!("ACK_CONFIRMED {id}")),
        );
    }

    /// `ack_batch` of some held ids, one repeated and one never delivered:
    /// `n` counts the deliveries settled (every one of an id held twice).
    fn ack_batch(&mut self, c: usize) {
        let cn = self.conns[c].cn;
        let mut held: Vec<String> = self.conns[c].held.keys().cloned().collect();
        held.sort();
        let take = self.rng.below(held.len() as u64 + 1) as usize;
        let mut ids: Vec<String> = Vec::new();
        let mut settled = 0;
        for _ in 0..take {
            let id = self.rng.pick(&held).clone();
            if let Some(n) = self.conns[c].held.remove(&id) {
                settled += n;
                self.msgs[self.by_id[&id]].consumed = true;
                self.acks += 1;
            }
            ids.push(id);
        }
        ids.push(format!("never-{}", self.rng.below(1000)));
        let own = format!("{cn}_queue");
        let reply = format!("OK ack_batch {own} {settled}");
        let expect = if self.flux.contains(&cn) {
            Expect::Either(reply, format!("OK ack_batch {own} 0"))
        } else {
            Expect::Exactly(reply)
        };
        self.send(c, format!("ack_batch {own} {}", ids.join(" ")), expect);
    }

    /// Closes connection `c` (what it holds is given back, and redelivered
    /// with a higher count) and opens another for its CN.
    fn reconnect(&mut self, c: usize) {
        let conn = self.conns.remove(c);
        self.note(format!(
            "{}#{c} closes holding {} deliveries",
            conn.cn,
            conn.held.len()
        ));
        self.reconnects += 1;
        let cn = conn.cn;
        drop(conn);
        self.connect(cn);
    }

    /// Deletes the receiver's queue and declares and binds it again, each
    /// command answered before the next is sent; every other command of
    /// that receiver or routed to it meanwhile races the deletion.
    fn delete_and_declare(&mut self, c: usize) -> Result<(), Failure> {
        let cn = self.conns[c].cn;
        let own = format!("{cn}_queue");
        self.deletes += 1;
        self.flux.push(cn);
        for m in &mut self.msgs {
            if m.to == cn {
                m.exempt = true;
            }
        }
        // Answers already owed race the deletion too.
        for conn in &mut self.conns {
            for (expect, _) in &mut conn.owed {
                match expect {
                    Expect::Stored { id, msg } if self.msgs[*msg].to == cn => {
                        *expect = Expect::Flux {
                            id: id.clone(),
                            msg: *msg,
                        };
                    }
                    Expect::Exactly(line)
                        if conn.cn == cn
                            && (line.starts_with("ACK_CONFIRMED ")
                                || line.starts_with("NACK_CONFIRMED ")) =>
                    {
                        let id = line.split(' ').nth(1).unwrap_or_default();
                        let gone = format!("Error: no outstanding delivery {id}");
                        *expect = Expect::Either(line.clone(), gone);
                    }
                    _ => {}
                }
            }
        }
        self.delete_failed = false;
        self.send(
            c,
            format!("delete_queue {own}"),
            Expect::DeleteQueue(own.clone()),
        );
        self.settle(c)?;
        for conn in &mut self.conns {
            if conn.cn == cn {
                conn.held.clear();
                conn.consuming = false;
            }
        }
        let c = if self.delete_failed {
            // The name stays taken until a start removes the log.
            self.crash()?;
            (0..self.conns.len())
                .find(|&c| self.conns[c].cn == cn)
                .ok_or("no connection of the receiver after the restart")?
        } else {
            c
        };
        self.send(
            c,
            format!("declare_queue {own}"),
            Expect::Exactly(format!("OK declare_queue {own}")),
        );
        self.settle(c)?;
        self.send(
            c,
            format!("bind {own} ex {cn}"),
            Expect::Exactly(format!("OK bind {own} ex {cn}")),
        );
        self.settle(c)?;
        self.flux.retain(|r| *r != cn);
        Ok(())
    }

    /// An ack or nack of an id the connection does not hold (senders may
    /// not nack at all).
    fn ack_unknown(&mut self, c: usize) {
        let id = format!("never-{}", self.rng.below(1000));
        let verb = *self.rng.pick(&["ack", "nack"]);
        let reply = if verb == "nack" && self.conns[c].cn.starts_with("sender") {
            "Access denied: senders may not nack (role=sender)".to_owned()
        } else {
            format!("Error: no outstanding delivery {id}")
        };
        self.send(c, format!("{verb} {id}"), Expect::Exactly(reply));
    }

    /// A broken line: a command cut short, or one with an unknown verb.
    fn garbage(&mut self, c: usize) {
        let lines = [
            "publish ex".to_owned(),
            "fetch".to_owned(),
            "ack".to_owned(),
            "frobnicate receiver_1_queue".to_owned(),
            format!(
                "publish ex receiver_1 {{\"message_id\":\"x{}",
                self.rng.below(100)
            ),
        ];
        let line = self.rng.pick(&lines).clone();
        self.send(c, line, Expect::AnyError);
    }

    /// Runs the shard's side for a while: mesh messages, commit rounds
    /// (`rounds` committer steps, or until none is left), backlog reads,
    /// chores and the sweep; then every connection reads what it is owed.
    fn pump(&mut self, rounds: Option<u64>) -> Result<(), Failure> {
        self.manual.advance(Duration::from_millis(5));
        let now = self.clock.now();
        let mut steps = 0;
        loop {
            {
                let mut shard = self.broker.local.shard.borrow_mut();
                shard.flush();
                let mut cx = Context::from_waker(Waker::noop());
                while let Poll::Ready(Some(batch)) = self.inbound.poll_recv(&mut cx) {
                    for msg in batch {
                        shard.handle(msg, now);
                    }
                }
                let more = match rounds {
                    Some(n) => steps < n,
                    None => self.committer.has_work(&shard) || shard.has_chores(),
                };
                if more {
                    if let Some(what) =
                        self.committer
                            .step(&mut shard, &mut self.disk, &mut self.rng, self.faults)
                    {
                        drop(shard);
                        self.note(format!("committer: {what}"));
                        shard = self.broker.local.shard.borrow_mut();
                    }
                    steps += 1;
                }
                let read = read_backlog(&mut shard, &mut self.rng, self.faults, now);
                if shard.has_chores() {
                    shard.do_chores(64, now);
                }
                shard.sweep(now);
                if !more && read == 0 {
                    break;
                }
            }
            self.read_all()?;
        }
        self.read_all()
    }

    /// Runs the shard until connection `c` has read every reply it is
    /// owed; a reply that never comes is a failure too.
    fn settle(&mut self, c: usize) -> Result<(), Failure> {
        for _ in 0..1_000 {
            if self.conns[c].owed.is_empty() {
                return Ok(());
            }
            self.await_pending(c)?;
            self.pump(None)?;
        }
        let (_, command) = &self.conns[c].owed[0];
        Err(format!(
            "{}#{c} never got a reply to {command:?}",
            self.conns[c].cn
        ))
    }

    /// Every connection applies what its shard reported and reads the
    /// lines then owed, checking each.
    fn read_all(&mut self) -> Result<(), Failure> {
        for c in 0..self.conns.len() {
            let mut events = VecDeque::new();
            self.conns[c].client.mailbox.drain_into(&mut events);
            for event in events {
                self.conns[c].client.session.apply(event);
            }
            let mut out = Vec::new();
            self.conns[c]
                .client
                .session
                .replies
                .render(&mut out, usize::MAX);
            let text = String::from_utf8(out).map_err(|_| "a reply that is not UTF-8")?;
            for line in text.split_terminator('\n') {
                self.read(c, line)?;
            }
        }
        Ok(())
    }

    /// Checks one line connection `c` read.
    fn read(&mut self, c: usize, line: &str) -> Result<(), Failure> {
        let cn = self.conns[c].cn;
        if let Some(rest) = line.strip_prefix("Message: ") {
            return self.delivered(c, rest);
        }
        if line == format!("Error: queue {cn}_queue deleted") && self.flux.contains(&cn) {
            // Pushed to a consumer of a queue deleted meanwhile: its consume
            // ended, and what it held from the queue is owed no more.
            self.note(format!("{cn}#{c} <- {line}"));
            self.conns[c].consuming = false;
            self.conns[c].held.clear();
            return Ok(());
        }
        let Some((expect, command)) = self.conns[c].owed.pop_front() else {
            return Err(format!(
                "{cn}#{c} read {line:?} with no command owed a reply"
            ));
        };
        let ok = match &expect {
            Expect::Exactly(want) => line == want,
            Expect::Either(a, b) => line == a || line == b,
            Expect::Flux { id, msg } => {
                if line == format!("ACK {id}") {
                    self.msgs[*msg].acked = true;
                    self.msgs[*msg].exempt = true;
                    true
                } else {
                    line == format!("NACK {id} storage") || line == format!("NACK {id} no_route")
                }
            }
            Expect::AnyError => line.starts_with("Error: ") || line.starts_with("NACK "),
            Expect::Stored { id, msg } => {
                if line == format!("ACK {id}") {
                    self.msgs[*msg].acked = true;
                    true
                } else {
                    line == format!("NACK {id} storage")
                }
            }
            Expect::DeleteQueue(q) => {
                if line.starts_with(&format!("Error: delete_queue {q}: storage: ")) {
                    self.delete_failed = true;
                    true
                } else {
                    line == format!("OK delete_queue {q}")
                }
            }
            Expect::Fetch => {
                line.strip_prefix("OK fetch ")
                    .is_some_and(|n| n.parse::<u32>().is_ok())
                    || line.starts_with("Error: fetch: this connection holds ")
            }
            Expect::Purge(q) => {
                line.strip_prefix(&format!("OK purge_queue {q} "))
                    .is_some_and(|n| n.parse::<u64>().is_ok())
                    || line.starts_with(&format!("Error: purge_queue {q}: "))
            }
        };
        self.note(format!("{cn}#{c} <- {line}"));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{cn}#{c} sent {command:?} and read {line:?}, expected {expect:?}"
            ))
        }
    }

    /// A `Message: <id> <queue> <count> <body>` line read by `c`.
    fn delivered(&mut self, c: usize, rest: &str) -> Result<(), Failure> {
        let cn = self.conns[c].cn;
        let mut parts = rest.splitn(4, ' ');
        let (Some(id), Some(queue), Some(count), Some(body)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "{cn}#{c}: a delivery line without its parts: {rest:?}"
            ));
        };
        self.note(format!("{cn}#{c} <- Message: {id} {queue} {count}"));
        if queue != format!("{cn}_queue") {
            return Err(format!("confinement: {cn} was delivered {id} from {queue}"));
        }
        let Some(&m) = self.by_id.get(id) else {
            return Err(format!(
                "confinement: {cn} was delivered {id}, which no one published"
            ));
        };
        if self.msgs[m].to != cn || !body.contains(&format!("\"receiver_client_id\":\"{cn}\"")) {
            return Err(format!(
                "confinement: {cn} was delivered {id}, an envelope for {}",
                self.msgs[m].to
            ));
        }
        let count: u32 = count
            .parse()
            .map_err(|_| format!("{cn}#{c}: a delivery count that is not a number: {rest:?}"))?;
        let msg = &mut self.msgs[m];
        msg.max_count = msg.max_count.max(count);
        if msg.max_count >= GIVEN_BACK_LIMIT {
            msg.exempt = true;
        }
        *self.conns[c].held.entry(id.to_owned()).or_insert(0) += 1;
        Ok(())
    }

    /// A power cut: every connection and everything not synced is gone.
    fn crash(&mut self) -> Result<(), Failure> {
        self.crashes += 1;
        self.conns.clear();
        let changed = self
            .disk
            .crash(&mut self.rng)
            .map_err(|e| format!("crash: {e}"))?;
        self.note(format!("CRASH: {} files changed", changed.len()));
        self.boot()
    }

    /// The end: no more faults, every receiver fetches and acks until its
    /// queue is empty; then every `ACK`ed publish must have been consumed.
    fn drain(&mut self) -> Result<(), Failure> {
        self.faults = Faults::NONE;
        self.pump(None)?;
        // The receivers' connections close (what they held is given back);
        // one fresh connection each fetches.
        self.conns.retain(|c| !RECEIVERS.contains(&c.cn));
        self.pump(None)?;
        for receiver in RECEIVERS {
            self.connect(receiver);
            let c = self.conns.len() - 1;
            loop {
                self.send(c, format!("fetch {receiver}_queue 64"), Expect::Fetch);
                self.settle(c)?;
                let held: BTreeSet<String> = self.conns[c].held.keys().cloned().collect();
                if held.is_empty() {
                    break;
                }
                for id in held {
                    self.conns[c].held.remove(&id);
                    self.msgs[self.by_id[&id]].consumed = true;
                    self.send(
                        c,
                        format!("ack {id}"),
                        Expect::Exactly(format!("ACK_CONFIRMED {id}")),
                    );
                }
                self.settle(c)?;
            }
        }
        let lost: Vec<&str> = self
            .msgs
            .iter()
            .filter(|m| m.acked && !m.consumed && !m.exempt)
            .map(|m| m.id.as_str())
            .collect();
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        if !lost.is_empty() {
            return Err(format!(
                "acked-not-lost: {} ACKed publish(es) never reached their receiver: {lost:?}",
                lost.len()
            ));
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), Failure> {
        for _ in 0..STEPS {
            self.act()?;
            if let Some(e) = self.failure.take() {
                return Err(e);
            }
            match self.rng.below(100) {
                0 => self.crash()?,
                1..=59 => {
                    let rounds = self.rng.below(3);
                    self.pump(Some(rounds))?;
                }
                _ => {}
            }
        }
        self.drain()
    }
}

/// What the seeds did, to show they did what they are for.
#[derive(Debug, Default)]
struct Counts {
    crashes: u64,
    /// Deliveries acked by receivers.
    acks: u64,
    /// Publishes answered `ACK`.
    acked: u64,
    deletes: u64,
    reconnects: u64,
}

/// Runs seed `seed`, adding to `counts`; the error names the seed, what
/// broke and the last lines before it.
fn run_seed(seed: u64, counts: &mut Counts) -> Result<(), String> {
    ciphermq_shard::hashers::fix_name_hashing_for_simulation();
    let mut world = World::new(seed);
    match world.run() {
        Ok(()) => {
            counts.crashes += world.crashes;
            counts.acks += world.acks;
            counts.acked += world.msgs.iter().filter(|m| m.acked).count() as u64;
            counts.deletes += world.deletes;
            counts.reconnects += world.reconnects;
            Ok(())
        }
        Err(e) => {
            let trace: Vec<String> = world.trace.iter().map(|l| format!("  {l}")).collect();
            Err(format!(
                "seed {seed}: {e}\nlast lines:\n{}\nreplay: CIPHERMQ_SESSION_SIM_SEED={seed} cargo test -p ciphermq-broker --lib session_sim",
                trace.join("\n")
            ))
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn session_sim_every_reply_and_acked_publish_holds_across_faults_and_crashes() {
    let seeds: Vec<u64> = match env_u64("CIPHERMQ_SESSION_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("CIPHERMQ_SESSION_SIM_RUNS").unwrap_or(RUNS)).collect(),
    };
    let mut counts = Counts::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        if let Err(e) = run_seed(seed, &mut counts) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n\n")
    );
    // The runs did what they are for.
    let n = seeds.len() as u64;
    if n >= 20 {
        assert!(counts.crashes > n, "{counts:?}");
        assert!(counts.acked > n * 20, "{counts:?}");
        assert!(counts.acks > n * 20, "{counts:?}");
        assert!(counts.deletes > n / 2, "{counts:?}");
        assert!(counts.reconnects > n, "{counts:?}");
    }
    eprintln!("{} seeds: {counts:?}", seeds.len());
}

#[test]
fn session_sim_a_seed_replays_exactly() {
    let trace = |seed| {
        ciphermq_shard::hashers::fix_name_hashing_for_simulation();
        let mut world = World::new(seed);
        world.run().expect("the seed passes");
        let acked = world.msgs.iter().filter(|m| m.acked).count();
        (world.trace.iter().cloned().collect::<Vec<_>>(), acked)
    };
    assert_eq!(trace(3), trace(3), "the same seed, the same run");
}

/// Lines a failure shows (`CIPHERMQ_SESSION_SIM_TRACE` for more).
fn trace_lines() -> usize {
    env_u64("CIPHERMQ_SESSION_SIM_TRACE").map_or(80, |n| n as usize)
}
