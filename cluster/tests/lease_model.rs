//! An exhaustive model of the lease and adoption protocol that shared storage
//! is to rely on (docs/CLUSTER.md, "When a node dies"), checked with
//! stateright on every `cargo test`.
//!
//! Why: the protocol's safety rests on timing (leases, a watcher's silence
//! rule) and on file-system fencing (renaming an epoch directory aside, and a
//! commit checking its directory's identity after fsync). Tests against real
//! processes only ever see a few interleavings of pauses, crashes and
//! renames; this model enumerates all of them in a small world, so a change
//! to the rules that breaks a promise shows up here as a counterexample (a
//! step-by-step trace) instead of as a lost message in production.
//!
//! What it abstracts:
//! - One owner, two nodes, two messages, epochs 1 to 3. PostgreSQL is one
//!   record (which nodes are alive, the placement); the shared file system
//!   is a list of directories, each with an identity (its index: the inode),
//!   the epoch its path names, where it is (at its path, renamed aside with
//!   recorded lengths, deleted) and its durable log.
//! - A step is one atomic action of one actor: a node's heartbeat,
//!   declaration, placement read, rename, directory open, copy, delete,
//!   write-and-fsync, directory check, lease check-and-ACK; a crash, a
//!   restart; or the clock ticking. A pause is a node taking no steps while
//!   others do, which the exhaustive interleaving covers without a step of
//!   its own.
//! - Time is a global discrete tick that advances on its own. Every clock
//!   reads it exactly (no drift), but only at the step that reads it, so a
//!   paused node acts on whatever its last reading allowed. Times are kept
//!   relative (ticks of lease left, ticks since a node's last accepted
//!   heartbeat, saturating), so the state space is finite without bounding
//!   time.
//! - A heartbeat's send, acceptance and reply are one step: a node that
//!   learns of its lease later has a lease ending at the same instant, and
//!   only knows less in between.
//! - Watchers are eager: any running node may declare the owner's node dead
//!   once that node's heartbeat is `lease + margin` ticks old. The real rule
//!   (watch that long yourself, link up throughout, forget on a failure)
//!   only allows fewer declarations, so it is left out, and with it links
//!   and PostgreSQL going down: they only stop heartbeats, declarations and
//!   placement reads, steps the model may always leave untaken. Only the
//!   owner's node is declared dead; declaring another node only takes power
//!   away from it.
//! - The node that declares is the heir (it wrote the placement itself).
//! - A commit round holds one message, written and fsynced in one step:
//!   unsynced bytes that survive a crash are as if fsynced by a round that
//!   was never ACKed, and a round of several messages ACKs each as a round
//!   of one would.
//! - An ACK happens at the lease check that decides it; what the publisher
//!   does with it afterwards is not modelled.

use stateright::{Checker, HasDiscoveries, Model, Property};

type NodeId = usize;
type Epoch = u8;
type MessageId = u8;
/// A directory's identity (its inode): an index into [`World::storage`].
type DirId = usize;

/// How a commit round tells that its epoch directory is still in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DirectoryCheck {
    /// The protocol: the directory at `<owner>/<epoch>/` is the very one the
    /// node opened (same inode); a directory recreated there is not.
    SameIdentity,
    /// Weakened, to show why identity matters: some directory exists at the
    /// path, and a round's first write that finds the path missing recreates
    /// it (`create_dir_all`) and opens the log there by path.
    PathExistsRecreating,
}

/// The model's bounds and the protocol variant it checks.
#[derive(Clone, Debug)]
struct LeaseModel {
    nodes: usize,
    messages: MessageId,
    max_epoch: Epoch,
    /// A lease lasts this many ticks from the heartbeat that grants it.
    lease_ticks: u8,
    /// A watcher waits `lease_ticks + margin_ticks` of silence.
    margin_ticks: u8,
    /// The commit round checks the lease on the node's clock before its ACK.
    commit_checks_lease: bool,
    /// An heir checks its lease before it creates (or opens) its epoch
    /// directory and before it deletes a renamed directory it has copied.
    /// The design contract does not say so; the model shows it must.
    heir_checks_lease: bool,
    directory_check: DirectoryCheck,
}

impl LeaseModel {
    /// The protocol as designed, in a world small enough to check on every
    /// `cargo test`: two nodes (the owner's, and the heir, which may in turn
    /// be declared dead and taken over by the first node rejoined), two
    /// messages, epochs 1 to 3.
    fn protocol() -> Self {
        LeaseModel {
            nodes: 2,
            messages: 2,
            max_epoch: 3,
            lease_ticks: 1,
            margin_ticks: 1,
            commit_checks_lease: true,
            heir_checks_lease: true,
            directory_check: DirectoryCheck::SameIdentity,
        }
    }

    fn silence_to_declare(&self) -> u8 {
        self.lease_ticks + self.margin_ticks
    }
}

/// Everything there is: PostgreSQL, the nodes, the shared storage, and a
/// record of the ACKs given so far.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    database: Database,
    nodes: Vec<Node>,
    storage: Vec<Directory>,
    acks: Acks,
}

/// What PostgreSQL holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Database {
    /// The nodes whose state is alive (the others are dead).
    alive: Set,
    /// The owner's placement; `epoch` is its fencing token and only rises.
    placement: Placement,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Placement {
    node: NodeId,
    epoch: Epoch,
}

/// One broker process (or its absence, after a crash).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Node {
    running: bool,
    /// Ticks left of its lease (0: expired or never had one).
    lease_left: u8,
    /// Ticks since PostgreSQL last accepted its heartbeat (saturating): how
    /// long a watcher can have seen its stamp unchanged.
    silent_for: u8,
    ownership: Option<Ownership>,
}

/// A node's (volatile) belief that it serves the owner at an epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Ownership {
    epoch: Epoch,
    /// The epoch directory this node opened and holds its log's file handle
    /// in: writes through it land there wherever it is renamed to.
    opened: Option<DirId>,
    /// Renamed directories this node has copied into its log, durably.
    copied: Set,
    round: Option<Round>,
}

/// The commit round under way: its message is written and fsynced; the
/// checks follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Round {
    message: MessageId,
    directory_checked: bool,
}

/// One directory `<owner>/<epoch>/` of the shared storage, by identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Directory {
    /// The epoch its path names.
    epoch: Epoch,
    place: Place,
    /// Durable contents of its log: message ids in append order.
    log: Log,
}

/// Where a directory is: at its path, renamed aside, or gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    AtPath,
    /// Renamed aside by an heir, which recorded the log's length then.
    Fenced {
        recorded_len: usize,
    },
    Deleted,
}

/// The ACKs given so far, as the two invariants need them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Acks {
    acked: Set,
    highest_epoch: Epoch,
    /// Epochs that have ACKed during the current tick.
    epochs_this_tick: Set,
    /// An ACK came at an epoch lower than one already ACKed, or in the same
    /// tick as an ACK of another epoch.
    overlapped: bool,
}

/// A step of one actor, or of the clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    Tick,
    /// Heartbeat sent, accepted (or, for a dead node, answered with a new
    /// incarnation holding nothing) and its answer read.
    Heartbeat(NodeId),
    /// Compare-and-set alive -> dead on the owner's node, and the owner to
    /// the watcher at epoch + 1, which starts adopting it.
    DeclareDead(NodeId),
    /// A node reads the placement and finds it is to serve the owner (after
    /// a restart).
    ReadPlacement(NodeId),
    /// An heir renames an older epoch directory aside, recording lengths.
    RenameAside {
        node: NodeId,
        dir: DirId,
    },
    /// An heir opens (creating it if missing) its own epoch directory.
    OpenOwnDirectory(NodeId),
    /// An heir copies a renamed directory's recorded contents into its log
    /// (deduplicated by message id) and fsyncs.
    CopyRenamed {
        node: NodeId,
        dir: DirId,
    },
    /// An heir deletes a renamed directory it has copied.
    DeleteRenamed {
        node: NodeId,
        dir: DirId,
    },
    /// The owner's node writes a published message through its handle and
    /// fsyncs: a round of one message.
    WriteAndFsync {
        node: NodeId,
        message: MessageId,
    },
    /// After the fsync: is its epoch directory still in place? If not, the
    /// node is fenced and gives the owner up.
    CheckDirectory(NodeId),
    /// Reads the clock, and ACKs the round if the lease is valid.
    CheckLeaseAndAck(NodeId),
    /// The process dies: its lease, ownership and round are gone; its
    /// fsynced writes stay.
    Crash(NodeId),
    /// A new process, knowing nothing until it heartbeats and reads the
    /// placement.
    Restart(NodeId),
}

impl World {
    fn directory_at_path(&self, epoch: Epoch) -> Option<DirId> {
        self.storage
            .iter()
            .position(|d| d.epoch == epoch && d.place == Place::AtPath)
    }

    /// The older directory an heir at `epoch` renames next: the lowest epoch
    /// still at its path.
    fn next_to_rename(&self, epoch: Epoch) -> Option<DirId> {
        self.storage
            .iter()
            .enumerate()
            .filter(|(_, d)| d.epoch < epoch && d.place == Place::AtPath)
            .min_by_key(|(id, d)| (d.epoch, *id))
            .map(|(id, _)| id)
    }

    /// Renamed directories older than `epoch`, still awaiting adoption.
    fn awaiting_adoption(&self, epoch: Epoch) -> impl Iterator<Item = DirId> + '_ {
        self.storage
            .iter()
            .enumerate()
            .filter(move |(_, d)| d.epoch < epoch && matches!(d.place, Place::Fenced { .. }))
            .map(|(id, _)| id)
    }

    /// The messages a renamed directory holds up to its recorded length.
    fn recorded_contents(&self, dir: DirId) -> &[MessageId] {
        let d = &self.storage[dir];
        match d.place {
            Place::Fenced { recorded_len } => &d.log.as_slice()[..recorded_len.min(d.log.len())],
            _ => &[],
        }
    }

    /// Appends through a file handle: the bytes land in the directory it
    /// opened, wherever that now is, and nowhere once it is deleted.
    fn append(&mut self, dir: DirId, messages: &[MessageId]) {
        let d = &mut self.storage[dir];
        if d.place != Place::Deleted {
            messages.iter().for_each(|&m| d.log.push(m));
        }
    }

    /// What the owner's current node serves, or will once it has adopted:
    /// the current epoch's directory, or, before the heir has created it,
    /// the older ones still at their paths (it renames them first); and
    /// every renamed directory up to its recorded lengths.
    fn readable(&self) -> Vec<MessageId> {
        let current = self.database.placement.epoch;
        let mut readable: Vec<MessageId> = Vec::new();
        match self.directory_at_path(current) {
            Some(dir) => readable.extend(self.storage[dir].log.as_slice()),
            None => self
                .storage
                .iter()
                .filter(|d| d.epoch < current && d.place == Place::AtPath)
                .for_each(|d| readable.extend(d.log.as_slice())),
        }
        for (id, _) in self.storage.iter().enumerate() {
            readable.extend(self.recorded_contents(id));
        }
        readable
    }
}

impl LeaseModel {
    /// Whether a node serving `epoch` from the directory it `opened` finds
    /// that directory still in place (before an ACK or a deletion).
    fn directory_in_place(&self, world: &World, epoch: Epoch, opened: DirId) -> bool {
        match self.directory_check {
            DirectoryCheck::SameIdentity => world.storage[opened].place == Place::AtPath,
            DirectoryCheck::PathExistsRecreating => world.directory_at_path(epoch).is_some(),
        }
    }

    /// The steps that might be taken in `world`, by who can act at all;
    /// [`Self::apply`] rejects those whose conditions do not hold.
    fn steps(&self, world: &World) -> Vec<Step> {
        let mut steps = vec![Step::Tick];
        for (n, node) in world.nodes.iter().enumerate() {
            if !node.running {
                steps.push(Step::Restart(n));
                continue;
            }
            steps.extend([
                Step::Heartbeat(n),
                Step::DeclareDead(n),
                Step::ReadPlacement(n),
                Step::Crash(n),
            ]);
            if node.ownership.is_none() {
                continue;
            }
            for dir in 0..world.storage.len() {
                steps.push(Step::RenameAside { node: n, dir });
                steps.push(Step::CopyRenamed { node: n, dir });
                steps.push(Step::DeleteRenamed { node: n, dir });
            }
            steps.push(Step::OpenOwnDirectory(n));
            for message in 0..self.messages {
                steps.push(Step::WriteAndFsync { node: n, message });
            }
            steps.push(Step::CheckDirectory(n));
            steps.push(Step::CheckLeaseAndAck(n));
        }
        steps
    }

    /// Applies `step` to a copy of `world`; `None` when it cannot be taken.
    fn apply(&self, world: &World, step: &Step) -> Option<World> {
        let mut w = world.clone();
        match *step {
            Step::Tick => {
                let silence = self.silence_to_declare();
                for node in w.nodes.iter_mut() {
                    node.lease_left = node.lease_left.saturating_sub(1);
                    node.silent_for = (node.silent_for + 1).min(silence);
                }
                w.acks.epochs_this_tick = Set::default();
            }
            Step::Heartbeat(n) => {
                if !w.nodes[n].running {
                    return None;
                }
                if !w.database.alive.contains(n) {
                    // Rejoins under a new incarnation, holding nothing.
                    w.database.alive.insert(n);
                    w.nodes[n].ownership = None;
                }
                w.nodes[n].lease_left = self.lease_ticks;
                w.nodes[n].silent_for = 0;
            }
            Step::DeclareDead(watcher) => {
                let placement = w.database.placement;
                let dead = placement.node;
                if !w.nodes[watcher].running
                    || watcher == dead
                    || !w.database.alive.contains(watcher)
                    || !w.database.alive.contains(dead)
                    || w.nodes[dead].silent_for < self.silence_to_declare()
                    || placement.epoch >= self.max_epoch
                {
                    return None;
                }
                let epoch = placement.epoch + 1;
                w.database.alive.remove(dead);
                w.database.placement = Placement {
                    node: watcher,
                    epoch,
                };
                w.nodes[watcher].ownership = Some(Ownership::adopting(epoch));
            }
            Step::ReadPlacement(n) => {
                let placement = w.database.placement;
                let held = w.nodes[n].ownership.as_ref().map(|o| o.epoch);
                if !w.nodes[n].running || placement.node != n || held == Some(placement.epoch) {
                    return None;
                }
                w.nodes[n].ownership = Some(Ownership::adopting(placement.epoch));
            }
            Step::RenameAside { node, dir } => {
                let n = &w.nodes[node];
                let own = n.ownership.as_ref()?;
                if !n.running || own.opened.is_some() || w.next_to_rename(own.epoch) != Some(dir) {
                    return None;
                }
                let recorded_len = w.storage[dir].log.len();
                w.storage[dir].place = Place::Fenced { recorded_len };
            }
            Step::OpenOwnDirectory(n) => {
                let node = &w.nodes[n];
                let own = node.ownership.as_ref()?;
                let epoch = own.epoch;
                if !node.running
                    || own.opened.is_some()
                    || (self.heir_checks_lease && node.lease_left == 0)
                    || w.next_to_rename(epoch).is_some()
                {
                    return None;
                }
                let dir = match w.directory_at_path(epoch) {
                    Some(dir) => dir,
                    None => create_directory(&mut w, epoch),
                };
                ownership_mut(&mut w, n)?.opened = Some(dir);
            }
            Step::CopyRenamed { node, dir } => {
                let (epoch, opened) = self.adopting(&w, node)?;
                let copied = w.nodes[node].ownership.as_ref()?.copied;
                let next = w
                    .awaiting_adoption(epoch)
                    .filter(|&d| !copied.contains(d))
                    .min_by_key(|&d| (w.storage[d].epoch, d));
                if next != Some(dir) {
                    return None;
                }
                let copies: Vec<MessageId> = w
                    .recorded_contents(dir)
                    .iter()
                    .copied()
                    .filter(|&m| !w.storage[opened].log.contains(m))
                    .collect();
                w.append(opened, &copies);
                ownership_mut(&mut w, node)?.copied.insert(dir);
            }
            Step::DeleteRenamed { node, dir } => {
                let (epoch, opened) = self.adopting(&w, node)?;
                let copied = w.nodes[node].ownership.as_ref()?.copied.contains(dir);
                if !copied
                    || !matches!(w.storage[dir].place, Place::Fenced { .. })
                    || (self.heir_checks_lease && w.nodes[node].lease_left == 0)
                    || !self.directory_in_place(&w, epoch, opened)
                {
                    return None;
                }
                w.storage[dir].place = Place::Deleted;
                w.storage[dir].log.clear();
            }
            Step::WriteAndFsync { node, message } => {
                let (epoch, _) = self.serving(&w, node)?;
                let own = w.nodes[node].ownership.as_ref()?;
                if own.round.is_some() || w.acks.acked.contains(message.into()) {
                    return None;
                }
                if self.directory_check == DirectoryCheck::PathExistsRecreating {
                    // Opens `<owner>/<epoch>/log` by path, creating what is missing.
                    let dir = match w.directory_at_path(epoch) {
                        Some(dir) => dir,
                        None => create_directory(&mut w, epoch),
                    };
                    ownership_mut(&mut w, node)?.opened = Some(dir);
                }
                let opened = w.nodes[node].ownership.as_ref()?.opened?;
                // A message its log already holds is not written twice.
                w.append(opened, &[message]);
                ownership_mut(&mut w, node)?.round = Some(Round {
                    message,
                    directory_checked: false,
                });
            }
            Step::CheckDirectory(n) => {
                let node = &w.nodes[n];
                let own = node.ownership.as_ref()?;
                let round = own.round?;
                if !node.running || round.directory_checked {
                    return None;
                }
                if self.directory_in_place(&w, own.epoch, own.opened?) {
                    ownership_mut(&mut w, n)?.round = Some(Round {
                        directory_checked: true,
                        ..round
                    });
                } else {
                    // Fenced: it serves the owner no more.
                    w.nodes[n].ownership = None;
                }
            }
            Step::CheckLeaseAndAck(n) => {
                let node = &w.nodes[n];
                let own = node.ownership.as_ref()?;
                let round = own.round?;
                if !node.running || !round.directory_checked {
                    return None;
                }
                let lease_valid = node.lease_left > 0 || !self.commit_checks_lease;
                let epoch = own.epoch;
                ownership_mut(&mut w, n)?.round = None;
                if lease_valid {
                    record_ack(&mut w.acks, epoch, round.message);
                }
            }
            Step::Crash(n) => {
                if !w.nodes[n].running {
                    return None;
                }
                // Its writes were all fsynced: the files keep them.
                w.nodes[n] = Node {
                    running: false,
                    lease_left: 0,
                    ownership: None,
                    ..w.nodes[n].clone()
                };
            }
            Step::Restart(n) => {
                if w.nodes[n].running {
                    return None;
                }
                w.nodes[n].running = true;
            }
        }
        // A dead node's silence no longer matters: one state for all.
        for n in 0..w.nodes.len() {
            if !w.database.alive.contains(n) {
                w.nodes[n].silent_for = 0;
            }
        }
        Some(w)
    }

    /// A running heir past its renames, with its own directory open:
    /// its epoch and that directory.
    fn adopting(&self, w: &World, n: NodeId) -> Option<(Epoch, DirId)> {
        let node = &w.nodes[n];
        let own = node.ownership.as_ref()?;
        if !node.running {
            return None;
        }
        Some((own.epoch, own.opened?))
    }

    /// A running node that has adopted everything older and may serve.
    fn serving(&self, w: &World, n: NodeId) -> Option<(Epoch, DirId)> {
        let (epoch, opened) = self.adopting(w, n)?;
        if w.awaiting_adoption(epoch).next().is_some() {
            return None;
        }
        Some((epoch, opened))
    }
}

impl Ownership {
    /// An heir's ownership, before it has renamed or opened anything.
    fn adopting(epoch: Epoch) -> Self {
        Ownership {
            epoch,
            opened: None,
            copied: Set::default(),
            round: None,
        }
    }
}

fn create_directory(w: &mut World, epoch: Epoch) -> DirId {
    w.storage.push(Directory {
        epoch,
        place: Place::AtPath,
        log: Log::default(),
    });
    w.storage.len() - 1
}

fn ownership_mut(w: &mut World, n: NodeId) -> Option<&mut Ownership> {
    w.nodes[n].ownership.as_mut()
}

fn record_ack(acks: &mut Acks, epoch: Epoch, message: MessageId) {
    let other_epoch_this_tick = acks
        .epochs_this_tick
        .iter()
        .any(|e| e != usize::from(epoch));
    if epoch < acks.highest_epoch || other_epoch_this_tick {
        acks.overlapped = true;
    }
    acks.highest_epoch = acks.highest_epoch.max(epoch);
    acks.epochs_this_tick.insert(epoch.into());
    acks.acked.insert(message.into());
}

/// A small set of indices (nodes, directories, messages, epochs), as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Set(u16);

impl Set {
    fn contains(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }
    fn insert(&mut self, i: usize) {
        self.0 |= 1 << i;
    }
    fn remove(&mut self, i: usize) {
        self.0 &= !(1 << i);
    }
    fn iter(self) -> impl Iterator<Item = usize> {
        (0..16).filter(move |&i| self.contains(i))
    }
}

/// A log's message ids in append order; each at most once, since writes
/// and copies are deduplicated by id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Log {
    ids: [MessageId; 4],
    len: usize,
}

impl Log {
    fn as_slice(&self) -> &[MessageId] {
        &self.ids[..self.len]
    }
    fn len(&self) -> usize {
        self.len
    }
    fn contains(&self, id: MessageId) -> bool {
        self.as_slice().contains(&id)
    }
    /// Appends `id` unless the log holds it already.
    fn push(&mut self, id: MessageId) {
        if !self.contains(id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }
    fn clear(&mut self) {
        *self = Log::default();
    }
}

const ACKS_NEVER_OVERLAP: &str = "ACKs of two epochs of one owner never overlap in time";
const ACKED_IS_READABLE: &str = "every acknowledged message is in the current owner's readable log";
const TAKEOVER_ACKS: &str = "an heir ACKs after a takeover";
const THIRD_EPOCH_ADOPTS_BOTH: &str =
    "an heir stopped mid-adoption leaves its renames, and the third epoch adopts both";
const OLD_OWNER_WRITES_AFTER_RENAME: &str =
    "a paused old owner writes after its directory is renamed";

impl Model for LeaseModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        // Every node has just joined (its heartbeat accepted); node 0 serves
        // the owner at epoch 1 from `<owner>/1/`, directory 0.
        let node = |n: NodeId| Node {
            running: true,
            lease_left: self.lease_ticks,
            silent_for: 0,
            ownership: (n == 0).then(|| Ownership {
                opened: Some(0),
                ..Ownership::adopting(1)
            }),
        };
        vec![World {
            database: Database {
                alive: (0..self.nodes).fold(Set::default(), |mut all, n| {
                    all.insert(n);
                    all
                }),
                placement: Placement { node: 0, epoch: 1 },
            },
            nodes: (0..self.nodes).map(node).collect(),
            storage: vec![Directory {
                epoch: 1,
                place: Place::AtPath,
                log: Log::default(),
            }],
            acks: Acks::default(),
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Step>) {
        actions.extend(self.steps(world));
    }

    fn next_state(&self, world: &World, step: Step) -> Option<World> {
        self.apply(world, &step)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ACKS_NEVER_OVERLAP, |_, w: &World| !w.acks.overlapped),
            Property::always(ACKED_IS_READABLE, |_, w: &World| {
                let readable = w.readable();
                w.acks
                    .acked
                    .iter()
                    .all(|m| readable.iter().any(|&r| usize::from(r) == m))
            }),
            Property::sometimes(TAKEOVER_ACKS, |_, w: &World| w.acks.highest_epoch >= 2),
            Property::sometimes(THIRD_EPOCH_ADOPTS_BOTH, |_, w: &World| {
                w.nodes
                    .iter()
                    .filter_map(|n| n.ownership.as_ref())
                    .any(|o| {
                        let epochs: Vec<Epoch> =
                            o.copied.iter().map(|d| w.storage[d].epoch).collect();
                        o.epoch == 3 && epochs.contains(&1) && epochs.contains(&2)
                    })
            }),
            Property::sometimes(OLD_OWNER_WRITES_AFTER_RENAME, |_, w: &World| {
                w.storage.iter().any(|d| match d.place {
                    Place::Fenced { recorded_len } => d.log.len() > recorded_len,
                    _ => false,
                })
            }),
        ]
    }
}

#[test]
fn the_protocol_keeps_its_promises() {
    let checker = LeaseModel::protocol().checker().spawn_bfs().join();
    eprintln!(
        "lease model: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    assert!(checker.is_done());
    checker.assert_properties();
}

/// Prints a counterexample's steps, so a failing or surprising run explains
/// itself (`cargo test -- --nocapture`).
fn print_trace(name: &str, path: stateright::Path<World, Step>) {
    eprintln!("counterexample to {name:?}:");
    for (i, step) in path.into_actions().iter().enumerate() {
        eprintln!("  {i:2}. {step:?}");
    }
}

/// The model without the commit round's lease check.
fn without_commit_lease_check() -> LeaseModel {
    LeaseModel {
        commit_checks_lease: false,
        ..LeaseModel::protocol()
    }
}

/// Without the lease check, a commit whose directory check passed just
/// before the heir's rename ACKs after the heir has ACKed at the next epoch
/// (the old node was paused in between): the lease is what keeps the
/// epochs' ACKs apart.
#[test]
fn without_the_commit_lease_check_acks_of_two_epochs_overlap() {
    let checker = without_commit_lease_check()
        .checker()
        .finish_when(HasDiscoveries::AnyOf(
            [ACKS_NEVER_OVERLAP].into_iter().collect(),
        ))
        .spawn_bfs()
        .join();
    let overlap = checker.discovery(ACKS_NEVER_OVERLAP);
    assert!(
        overlap.is_some(),
        "the lease check was not needed for {ACKS_NEVER_OVERLAP:?}"
    );
    if let Some(path) = overlap {
        print_trace(ACKS_NEVER_OVERLAP, path);
    }
}

/// Without the lease check, the directory identity still keeps every ACKed
/// message readable: a round that passed it had fsynced before the rename,
/// so its message is within the lengths the heir recorded and copies.
#[test]
fn without_the_commit_lease_check_acked_messages_stay_readable() {
    let checker = without_commit_lease_check().checker().spawn_bfs().join();
    assert!(checker.is_done());
    checker.assert_no_discovery(ACKED_IS_READABLE);
}

/// Without the lease check and with only a path-existence check, an old
/// node that recreates its missing directory when it writes ACKs messages
/// into a directory no heir reads: the directory's identity is what fences
/// it.
#[test]
fn a_path_only_directory_check_acknowledges_messages_nobody_reads() {
    let model = LeaseModel {
        directory_check: DirectoryCheck::PathExistsRecreating,
        ..without_commit_lease_check()
    };
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(
            [ACKED_IS_READABLE].into_iter().collect(),
        ))
        .spawn_bfs()
        .join();
    let lost = checker.discovery(ACKED_IS_READABLE);
    assert!(
        lost.is_some(),
        "the identity check was not needed for {ACKED_IS_READABLE:?}"
    );
    if let Some(path) = lost {
        print_trace(ACKED_IS_READABLE, path);
    }
}

/// An heir without a lease is an heir that may have been declared dead in
/// turn: paused past its lease, it creates its epoch directory after the
/// next heir has renamed everything older aside, copies a renamed directory
/// into it and deletes that directory, which the next heir has not copied
/// yet. So an heir checks its lease before it creates its directory and
/// before each deletion.
#[test]
fn an_heir_without_a_lease_deletes_what_the_next_heir_needs() {
    let model = LeaseModel {
        heir_checks_lease: false,
        ..LeaseModel::protocol()
    };
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(
            [ACKED_IS_READABLE].into_iter().collect(),
        ))
        .spawn_bfs()
        .join();
    let lost = checker.discovery(ACKED_IS_READABLE);
    assert!(
        lost.is_some(),
        "the heir's lease check was not needed for {ACKED_IS_READABLE:?}"
    );
    if let Some(path) = lost {
        print_trace(ACKED_IS_READABLE, path);
    }
}
