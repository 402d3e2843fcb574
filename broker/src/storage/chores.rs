//! The chores of one shard: work a command (or a close) starts that is too
//! large for one shard step. A `purge_queue` takes a queue's messages out
//! at once but leaves each one to settle (its id remembered as acked, its
//! ack logged, its body freed), a `delete_queue` leaves its messages to
//! free, and a connection that closes owing a prefetch on each of many
//! queues leaves its deliveries to give back; a million of any is about a
//! second of the shard's time, which done in one step would hold every
//! connection of the shard that long. This task
//! does them [`SLICE`] messages at a time with a [`PAUSE`] after each, so
//! they take about half of the shard's thread while they last, never all of
//! it; a purge's ack records also go out at the pace of the commits, a
//! slice or two per round, so that publishes committed beside them are not
//! held behind megabytes of them. (Measured in docs/benchmarks-journal.md, "Large
//! purges and deletions": slices alone, back to back, still let a purge of
//! a million messages crowd a two-core machine into 50-120 ms stalls.)

use std::rc::Rc;
use std::time::{Duration, Instant};

use ciphermq_shard::{ChoreProgress, Shard};
use glommio::{Latency, Shares};

use crate::runtime::context::ShardLocal;

/// Messages settled or freed per shard step: about a millisecond's work.
pub(crate) const SLICE: usize = 1024;

/// The rest after each slice, and the wait when the last slices' ack
/// records are not committed yet (about one commit round).
pub(crate) const PAUSE: Duration = Duration::from_millis(1);

/// Starts the chores of this shard in a task queue of their own.
pub(crate) fn spawn(local: Rc<ShardLocal>) {
    let queue =
        glommio::executor().create_task_queue(Shares::default(), Latency::NotImportant, "chores");
    let task = glommio::spawn_local_into(run(local.clone()), queue)
        .unwrap_or_else(|_| glommio::spawn_local(run(local)));
    task.detach();
}

async fn run(local: Rc<ShardLocal>) {
    loop {
        local
            .work_for(Shard::has_chores, Shard::register_chores)
            .await;
        let progress = local.with_shard(|shard| shard.do_chores(SLICE, Instant::now()));
        if progress != ChoreProgress::Done(0) {
            glommio::timer::sleep(PAUSE).await;
        }
    }
}
