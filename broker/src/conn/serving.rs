//! The task queues a shard serves its connections from.
//!
//! glommio shares a busy executor between task queues, and runs the tasks
//! of one queue in turn. With every connection in one queue, a consumer
//! behind 16 publishers got one turn in 17: its acks, and the deliveries
//! they make room for, waited for 16 publishers' turns, and with 1,000
//! deliveries of prefetch it fell behind for good (about 95,000 deliveries
//! a second against 135,000-165,000 published). Receivers are therefore
//! served from a queue of their own with the same shares as the rest:
//! however many publishers a shard has, its consumers get turns at least
//! once a preempt period (`server.rs`), and the publishers, held to the
//! other half of a contended shard, are slowed down in turn, which is the
//! backpressure that keeps a queue from growing without end.
//!
//! A turn is not enough by itself: glommio reads a socket only when its
//! reactor reports it readable, and while 16 publishers keep their task
//! queue busy the reactor runs once a preempt period (3 ms, `server.rs`
//! PREEMPT_TIMER). A consumer whose prefetch is used up is woken by nothing
//! else, so it moved at most its prefetch per period: with 1,000, about
//! 110,000 deliveries a second behind 16 publishers' 160,000, and it fell
//! behind for good. Two things close that wait. The shard wakes a full
//! consumer whenever a publish has to wait for it (`Shard::dispatch`); and
//! a connection whose glommio read is pending reads the socket directly,
//! without waiting (`sys::try_recv`), so the acks already there are taken
//! in that turn. Consumers served by another shard than their queue's
//! (consuming a queue someone else owns) are not woken this way.
//!
//! The queue does not ask for low latency (see `committer.rs` on what
//! `Latency::Matters` queues did to this glommio).

use std::cell::Cell;
use std::future::Future;

use glommio::{Latency, Shares, TaskQueueHandle};

use crate::access::acl::Role;

/// One shard's connection task queues, made on first use (on the shard's
/// executor; a shard's state may be built elsewhere, in tests).
#[derive(Debug, Default)]
pub(crate) struct Serving {
    /// Receivers' connections.
    receivers: Cell<Option<TaskQueueHandle>>,
}

impl Serving {
    /// Runs `connection`, a connection of `role`, from its role's queue.
    pub(crate) fn serve(&self, role: Role, connection: impl Future<Output = ()> + 'static) {
        match role {
            Role::Receiver => match glommio::spawn_local_into(connection, self.receivers()) {
                Ok(task) => {
                    task.detach();
                }
                // Only an unknown queue fails, and this one lives as long
                // as the shard.
                Err(e) => tracing::error!(error = %e, "cannot serve a receiver's connection"),
            },
            _ => {
                glommio::spawn_local(connection).detach();
            }
        }
    }

    fn receivers(&self) -> TaskQueueHandle {
        if let Some(queue) = self.receivers.get() {
            return queue;
        }
        let queue = glommio::executor().create_task_queue(
            Shares::default(),
            Latency::NotImportant,
            "receivers",
        );
        self.receivers.set(Some(queue));
        queue
    }
}
