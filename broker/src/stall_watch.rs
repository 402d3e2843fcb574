//! Watches a shard's loop for stalls: one task wants a turn every
//! [`TICK`]; a turn that comes [`STALL_THRESHOLD`] late means something
//! held the shard's thread that long (a step that did not yield, a blocking
//! call). The lateness of every turn goes to `ciphermq_shard_loop_lag_seconds`,
//! each stall to `ciphermq_shard_stalls_total` and to the log, naming the
//! shard step begun last before it (every step runs through
//! [`ShardLocal::with_shard`], which notes its caller's source line).
//!
//! Each turn also renews the shard's heartbeat ([`crate::pulse`]), which the
//! systemd watchdog reads from its own thread.
//!
//! The task runs in a task queue of its own, with no latency request (see
//! `committer.rs` for why no queue asks glommio for one), so a turn may also
//! come late because other queues had their fair share first: at most a few
//! milliseconds, far below the threshold.

use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{Latency, Shares};

use crate::context::ShardLocal;
use ciphermq_shard::log_throttle::LogThrottle;

/// How often the watch wants a turn.
pub const TICK: Duration = Duration::from_millis(5);

/// A turn this late is a stall: logged and counted.
pub const STALL_THRESHOLD: Duration = Duration::from_millis(20);

/// Starts the watch of this shard in its own task queue.
pub fn spawn(local: Rc<ShardLocal>) {
    let queue = glommio::executor().create_task_queue(
        Shares::default(),
        Latency::NotImportant,
        "stall-watch",
    );
    let task = glommio::spawn_local_into(run(local.clone()), queue)
        .unwrap_or_else(|_| glommio::spawn_local(run(local)));
    task.detach();
}

async fn run(local: Rc<ShardLocal>) {
    let throttle = LogThrottle::new(Duration::from_secs(1));
    let (pulses, shard) = (local.shared.pulses.clone(), local.stats.shard);
    loop {
        pulses.beat(shard);
        let asked = Instant::now();
        glommio::timer::sleep(TICK).await;
        let late = asked.elapsed().saturating_sub(TICK);
        local.stats.loop_lag.observe(late);
        if late >= STALL_THRESHOLD {
            local.stats.stalls.add(1);
            let step = local.last_step();
            if let Some(skipped) = throttle.admit(Instant::now()) {
                tracing::warn!(
                    shard = local.stats.shard,
                    late_ms = late.as_millis() as u64,
                    last_step = %step.map_or_else(|| "none".to_owned(), |l| format!("{}:{}", l.file(), l.line())),
                    skipped,
                    "shard loop stalled: a turn came late (counted in ciphermq_shard_stalls_total)"
                );
            }
        }
    }
}
