//! The cross-shard mesh: one crossbeam channel into every shard, carrying
//! batches of [`ShardMsg`], and an [`AtomicWaker`] that wakes the receiving
//! shard's inbox task from any thread.
//!
//! A shard buffers what it sends during one piece of work and flushes once,
//! so a burst of cross-shard publishes costs one channel send and one wakeup
//! per peer, not one per message. Idle shards sleep in the reactor: nothing
//! spins. The channels are unbounded, but what travels is bounded by the
//! senders: each connection caps its pending replies, each consumer its
//! prefetch.

use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::mailbox::Completion;
use crate::message::Message;
use crate::pending::Resolver;
use crate::placement::{ConnRef, ShardId};
use crate::queue::Delivery;

/// Which command, on which connection, a remote result belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The connection that sent the command.
    pub conn: ConnRef,
    /// The command's position on that connection.
    pub seq: u64,
}

/// A message between shards.
#[derive(Debug)]
pub enum ShardMsg {
    /// Store `msg` in these queues (all owned by the receiving shard).
    Enqueue {
        /// Where to report.
        origin: Origin,
        /// Target queues.
        queues: Vec<Arc<str>>,
        /// The message.
        msg: Arc<Message>,
    },
    /// Register a consumer on a queue of the receiving shard.
    Consume {
        /// Where to report.
        origin: Origin,
        /// The queue.
        queue: Arc<str>,
        /// Its prefetch.
        prefetch: u32,
    },
    /// Pull deliveries from a queue of the receiving shard.
    Fetch {
        /// Where to report.
        origin: Origin,
        /// The queue.
        queue: Arc<str>,
        /// At most this many.
        max: u32,
    },
    /// Drop the ready messages of a queue of the receiving shard.
    Purge {
        /// Where to report.
        origin: Origin,
        /// The queue.
        queue: Arc<str>,
    },
    /// A command finished: hand the result to its connection.
    Done {
        /// The command.
        origin: Origin,
        /// Its result.
        completion: Completion,
    },
    /// A push delivery for a connection of the receiving shard.
    Deliver {
        /// The consumer's connection.
        conn: ConnRef,
        /// The delivery.
        delivery: Delivery,
    },
    /// The connection acked a delivery from a queue of the receiving shard.
    Ack {
        /// Who acks.
        conn: ConnRef,
        /// The queue.
        queue: Arc<str>,
        /// The message's position there.
        seq: u64,
    },
    /// The connection gives a delivery back (nack, resend).
    Requeue {
        /// Who gives it back.
        conn: ConnRef,
        /// The queue.
        queue: Arc<str>,
        /// The message's position there.
        seq: u64,
    },
    /// The connection closed: drop its consumers, requeue what it owed.
    ConnClosed {
        /// The closed connection.
        conn: ConnRef,
    },
    /// `delete_queue`, once the topology without the queue is saved: drop
    /// the queue of the receiving shard and remove its log.
    DeleteQueue {
        /// The queue.
        queue: Arc<str>,
        /// Resolved once the log is gone from the queue directory for good
        /// (`Err`: why it could not be moved away).
        done: Resolver<Result<(), String>>,
    },
    /// Work handed in from outside the shard threads (a cluster move's
    /// steps), run with the shard's state at its next turn.
    Run(ShardTask),
    /// Answered with the receiving shard's id on `done`: every message the
    /// sender sent before it has been handled. A move waits for one from
    /// every shard, so that no publish routed before its owner stopped
    /// being served here is still on its way.
    Barrier {
        /// Told once handled.
        done: Sender<ShardId>,
    },
    /// A queue the connection consumed from, or holds deliveries of, was
    /// deleted.
    QueueDeleted {
        /// The connection told.
        conn: ConnRef,
        /// The deleted queue.
        queue: Arc<str>,
        /// Whether it was a consumer of it (and is told so), or only holds
        /// deliveries of it (which it forgets).
        consumer: bool,
    },
}

/// A step run on a shard's thread with its state and the time of its
/// turn ([`ShardMsg::Run`]).
pub struct ShardTask(pub Box<ShardStep>);

/// What a [`ShardTask`] runs.
pub type ShardStep = dyn FnOnce(&mut crate::Shard, std::time::Instant) + Send;

impl std::fmt::Debug for ShardTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardTask")
    }
}

/// Sends into any shard from any thread, one message at a time: for the
/// few messages that start outside the shards (a cluster move's steps).
#[derive(Debug, Clone)]
pub struct MeshInjector {
    peers: Vec<Peer>,
}

impl MeshInjector {
    /// Hands `msg` to shard `to` and wakes it; false when the shard has
    /// stopped.
    pub fn send(&self, to: ShardId, msg: ShardMsg) -> bool {
        let Some(peer) = self.peers.get(to as usize) else {
            return false;
        };
        let sent = peer.tx.send(vec![msg]).is_ok();
        peer.waker.wake();
        sent
    }

    /// Runs `task` on shard `to`.
    pub fn run(
        &self,
        to: ShardId,
        task: impl FnOnce(&mut crate::Shard, std::time::Instant) + Send + 'static,
    ) -> bool {
        self.send(to, ShardMsg::Run(ShardTask(Box::new(task))))
    }

    /// How many shards it reaches.
    pub fn shards(&self) -> usize {
        self.peers.len()
    }
}

#[derive(Debug, Clone)]
struct Peer {
    tx: Sender<Vec<ShardMsg>>,
    waker: Arc<AtomicWaker>,
}

/// Builds the mesh.
#[derive(Debug)]
pub struct Mesh;

impl Mesh {
    /// One endpoint per shard, each connected to every shard (itself included).
    pub fn build(shards: usize) -> Vec<MeshEndpoint> {
        let channels: Vec<_> = (0..shards)
            .map(|_| crossbeam_channel::unbounded())
            .collect();
        let peers: Vec<Peer> = channels
            .iter()
            .map(|(tx, _)| Peer {
                tx: tx.clone(),
                waker: Arc::new(AtomicWaker::new()),
            })
            .collect();
        channels
            .into_iter()
            .enumerate()
            .map(|(i, (_, rx))| MeshEndpoint {
                outbound: MeshOutbound {
                    shard: i as ShardId,
                    peers: peers.clone(),
                    pending: (0..shards).map(|_| Vec::new()).collect(),
                    last_batch: vec![0; shards],
                },
                inbound: MeshInbound {
                    rx,
                    waker: peers[i].waker.clone(),
                },
            })
            .collect()
    }
}

/// One shard's two ends of the mesh.
#[derive(Debug)]
pub struct MeshEndpoint {
    /// Sending side, owned by the shard state.
    pub outbound: MeshOutbound,
    /// Receiving side, owned by the shard's inbox task.
    pub inbound: MeshInbound,
}

/// Largest capacity a new batch reserves up front (messages).
const BATCH_RESERVE_CAP: usize = 1024;

/// Buffers messages per peer and sends them in batches.
#[derive(Debug)]
pub struct MeshOutbound {
    /// The shard this endpoint belongs to.
    shard: ShardId,
    /// Every shard's channel and waker, by shard id.
    peers: Vec<Peer>,
    /// Messages waiting for the next flush, per peer. A sent batch leaves
    /// with its allocation, so each batch is a new `Vec`.
    pending: Vec<Vec<ShardMsg>>,
    /// Length of the last batch sent to each peer: the next one reserves that
    /// much (up to [`BATCH_RESERVE_CAP`]) instead of growing step by step.
    last_batch: Vec<usize>,
}

impl MeshOutbound {
    /// The shard this endpoint belongs to.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// How many shards the mesh joins.
    pub fn shards(&self) -> usize {
        self.peers.len()
    }

    /// A sender into every shard usable from any thread.
    pub fn injector(&self) -> MeshInjector {
        MeshInjector {
            peers: self.peers.clone(),
        }
    }

    /// Buffers `msg` for shard `to`; it leaves on the next [`MeshOutbound::flush`].
    #[inline]
    pub fn send(&mut self, to: ShardId, msg: ShardMsg) {
        let batch = &mut self.pending[to as usize];
        if batch.capacity() == 0 {
            batch.reserve(self.last_batch[to as usize]);
        }
        batch.push(msg);
    }

    /// Whether anything waits for [`MeshOutbound::flush`].
    pub fn has_pending(&self) -> bool {
        self.pending.iter().any(|p| !p.is_empty())
    }

    /// Sends every buffered batch and wakes each receiving shard once.
    pub fn flush(&mut self) {
        for (to, batch) in self.pending.iter_mut().enumerate() {
            if batch.is_empty() {
                continue;
            }
            let batch = std::mem::take(batch);
            self.last_batch[to] = batch.len().min(BATCH_RESERVE_CAP);
            let peer = &self.peers[to];
            // The receiver lives as long as the broker; a send only fails during
            // shutdown, when dropping the batch is what we want.
            let _ = peer.tx.send(batch);
            peer.waker.wake();
        }
    }
}

/// Receives batches for one shard.
#[derive(Debug)]
pub struct MeshInbound {
    rx: Receiver<Vec<ShardMsg>>,
    waker: Arc<AtomicWaker>,
}

impl MeshInbound {
    /// The next batch, or `Pending` after registering to be woken by a sender.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Vec<ShardMsg>>> {
        match self.rx.try_recv() {
            Ok(batch) => return Poll::Ready(Some(batch)),
            Err(TryRecvError::Disconnected) => return Poll::Ready(None),
            Err(TryRecvError::Empty) => {}
        }
        self.waker.register(cx.waker());
        // A batch may have arrived between the first look and the registration.
        match self.rx.try_recv() {
            Ok(batch) => Poll::Ready(Some(batch)),
            Err(TryRecvError::Disconnected) => Poll::Ready(None),
            Err(TryRecvError::Empty) => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn batches_reach_their_shard_in_order() {
        let mut mesh = Mesh::build(2);
        let b = mesh.pop().unwrap();
        let mut a = mesh.pop().unwrap();
        let conn = ConnRef { shard: 0, id: 1 };
        a.outbound.send(1, ShardMsg::ConnClosed { conn });
        a.outbound.send(
            1,
            ShardMsg::ConnClosed {
                conn: ConnRef { shard: 0, id: 2 },
            },
        );
        assert!(a.outbound.has_pending());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(b.inbound.poll_recv(&mut cx).is_pending());
        a.outbound.flush();
        match b.inbound.poll_recv(&mut cx) {
            Poll::Ready(Some(batch)) => {
                assert_eq!(batch.len(), 2);
                assert!(matches!(batch[1], ShardMsg::ConnClosed { conn } if conn.id == 2));
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_reserves_the_size_of_the_last_one() {
        let mut mesh = Mesh::build(2);
        let b = mesh.pop().unwrap();
        let mut a = mesh.pop().unwrap();
        let closed = |id| ShardMsg::ConnClosed {
            conn: ConnRef { shard: 0, id },
        };
        for id in 0..100 {
            a.outbound.send(1, closed(id));
        }
        a.outbound.flush();
        a.outbound.send(1, closed(100));
        assert!(a.outbound.pending[1].capacity() >= 100);
        a.outbound.flush();
        let mut cx = Context::from_waker(Waker::noop());
        let sizes: Vec<usize> = std::iter::from_fn(|| match b.inbound.poll_recv(&mut cx) {
            Poll::Ready(Some(batch)) => Some(batch.len()),
            _ => None,
        })
        .collect();
        assert_eq!(sizes, [100, 1]);
        assert!(!a.outbound.has_pending());
    }
}
