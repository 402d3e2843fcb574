//! The shard's part of moving an owner to another node of a cluster: its
//! queues stop changing (frozen), their logs settle, and then they leave
//! the shard whole, each log directory moved aside for the node's
//! coordinator to hand over. On the node it arrives at, the queues are
//! restored from the handed-over directories as on a restart
//! ([`Shard::restore_queue`]).
//!
//! A frozen queue delivers nothing, takes no publish and is not created
//! again by one; acks of deliveries made before still land, and are in
//! what is handed over once its log is quiet.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::Shard;
use crate::mesh::ShardMsg;
use crate::pending::{pending, Pending};
use crate::placement::ShardId;

impl Shard {
    /// The queues of `owner` this shard holds, as the topology records
    /// them (dead-letter queues included).
    pub fn owner_queues(&mut self, owner: &str) -> Vec<Arc<str>> {
        let id = self.id;
        self.topology
            .current()
            .queues()
            .filter(|q| &*q.owner == owner && q.shard == id)
            .map(|q| q.name.clone())
            .collect()
    }

    /// Whether this shard holds a queue named `name` in memory.
    pub fn holds_queue(&self, name: &str) -> bool {
        self.queues.contains_key(name)
    }

    /// Stops `names` delivering and taking publishes, and keeps them from
    /// being created again, until [`Shard::thaw`] or [`Shard::detach`].
    pub fn freeze(&mut self, names: &[Arc<str>]) {
        for name in names {
            self.frozen.insert(name.clone());
            if let Some(q) = self.queues.get_mut(name) {
                q.set_frozen(true);
            }
        }
    }

    /// Ends a freeze (a move given up): the queues serve again.
    pub fn thaw(&mut self, names: &[Arc<str>], now: Instant) {
        for name in names {
            self.frozen.remove(name);
            if let Some(q) = self.queues.get_mut(name) {
                q.set_frozen(false);
            }
            self.dispatch(name, now);
        }
    }

    /// Whether the logs of `names` stand still: what their directories
    /// hold now is everything they were told.
    pub fn is_quiet(&self, names: &[Arc<str>]) -> bool {
        match &self.durable {
            None => true,
            Some(d) => names.iter().all(|n| d.is_quiet(n)),
        }
    }

    /// Takes frozen, quiet queues out of the shard whole: their messages
    /// leave memory, waiting fetches get what they have, and each log
    /// directory is moved to `keep(name)` by the committer (the pendings
    /// resolve, in `names` order, once it is); where `keep` gives `None`
    /// the files stay where they are (shared storage another node took). Deliveries still owed for
    /// them are forgotten here: the node they go to delivers those
    /// messages again, as a restart would.
    pub fn detach(
        &mut self,
        names: &[Arc<str>],
        keep: &dyn Fn(&str) -> Option<PathBuf>,
    ) -> Vec<Pending<Result<(), String>>> {
        let mut moved = Vec::with_capacity(names.len());
        for name in names {
            let (waiting, done) = pending();
            moved.push(waiting);
            self.take_off(name, |_, q| {
                tracing::info!(queue = %name, ready = q.ready_len(), unacked = q.unacked_len(), "queue leaves this node");
            });
            self.frozen.remove(name);
            match (&mut self.durable, keep(name)) {
                (Some(d), Some(keep)) => {
                    let waiters = d.detach(name, keep, done);
                    self.release_waiters(&waiters, true);
                }
                (Some(d), None) => {
                    let waiters = d.forget(name);
                    self.release_waiters(&waiters, true);
                    done.resolve(Ok(()));
                }
                (None, _) => done.resolve(Ok(())),
            }
        }
        moved
    }

    /// Sends shard `to` a [`ShardMsg::Barrier`] behind everything this
    /// shard sent it so far.
    pub fn barrier(&mut self, to: ShardId, done: Sender<ShardId>) {
        self.out.send(to, ShardMsg::Barrier { done });
    }
}
