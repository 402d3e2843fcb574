//! Wakes a shard whose executor fell asleep with work still to run.
//!
//! glommio 0.9's loop parks its thread whenever a pass over the task queues
//! comes back having run nothing, and a pass also comes back that way when
//! the preempt timer (`server.rs` PREEMPT_TIMER) fired before its first
//! queue ran: the thread lost its core for longer than the timer between
//! arming it and running. The park sleeps in `io_uring_enter` until some
//! I/O completes or a timer comes due, while tasks wait runnable. Under load
//! nothing of theirs is in flight (a connection with bytes left to read
//! polls no socket, a committer with a round to take waits on no thread),
//! so the shard slept until its next timer: 0.3-1 s when the stall watch's
//! own task was the one waiting (docs/BENCHMARKS.md "Tail latency" and
//! "The shard's long sleeps"). Outside the broker, a glommio executor with a
//! 20 µs preempt timer and one always-runnable task sleeps like this several
//! times a second.
//!
//! The stall watch renews its shard's heartbeat every few milliseconds
//! (`stall_watch.rs`). This thread reads every heartbeat each [`PERIOD`] and
//! wakes the stall watch of a shard silent for longer than [`SILENCE`]: a
//! wake from another thread rings the executor's eventfd, the sleep ends,
//! and the loop runs its queues again. A shard that was only busy gets a
//! wake it does not need, which costs it nothing. Each silence during which
//! the shard's thread was found asleep (waiting in the kernel, not running
//! or ready to run) is counted once in `ciphermq_shard_nudges_total`.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ciphermq_admin::stats::ShardStats;

use crate::pulse::Pulses;
use crate::stall_watch::TICK;

/// How often the thread reads the heartbeats.
pub const PERIOD: Duration = Duration::from_millis(2);

/// A shard whose heartbeat is older than this (two stall-watch ticks) is
/// woken.
pub const SILENCE: Duration = Duration::from_millis(2 * TICK.as_millis() as u64);

/// Starts the thread for the shards of `pulses`, counting its wakes in
/// `stats` (indexed by shard). It ends once every shard has ended or the
/// pulses are gone.
pub fn spawn(pulses: &Arc<Pulses>, stats: Vec<Arc<ShardStats>>) -> std::io::Result<()> {
    let pulses: Weak<Pulses> = Arc::downgrade(pulses);
    std::thread::Builder::new()
        .name("shard-nudge".into())
        .spawn(move || {
            // Each shard's silence counted so far, by the beat it began
            // after: woken every period while it lasts, counted once (the
            // first time its thread is found asleep).
            let mut counted: HashMap<usize, u64> = HashMap::new();
            while let Some(pulses) = pulses.upgrade() {
                if pulses.all_ended() {
                    break;
                }
                let mut still: HashMap<usize, u64> = HashMap::new();
                for (shard, since) in pulses.silent(SILENCE) {
                    let pulse = pulses.shard(shard);
                    // Read before the wake, which makes the thread runnable.
                    let asleep = pulse.asleep();
                    let seen = counted.get(&shard) == Some(&since);
                    let count = pulse.wake() && asleep && !seen;
                    if count {
                        if let Some(s) = stats.get(shard) {
                            s.nudges.add(1);
                        }
                    }
                    if count || seen {
                        still.insert(shard, since);
                    }
                }
                counted = still;
                drop(pulses);
                std::thread::sleep(PERIOD);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc;
    use std::task::Poll;

    use glommio::{LocalExecutorBuilder, Placement};

    use super::*;

    /// The glommio sleep this module is for, on purpose: a preempt timer so
    /// short that it often fires before the executor's first queue runs.
    /// One task is always runnable and needs nothing from the kernel; a
    /// second beats like the stall watch. Without the nudge thread the
    /// executor sooner or later sleeps with the first task runnable and no
    /// timer due, and never wakes: the test then times out.
    #[test]
    fn an_executor_asleep_with_a_runnable_task_is_woken() {
        let pulses = Arc::new(Pulses::new(1));
        spawn(&pulses, vec![Arc::new(ShardStats::new(0))]).unwrap();
        let steps = Arc::new(AtomicU64::new(0));
        let (done_tx, done_rx) = mpsc::channel();
        let (p, s) = (pulses.clone(), steps.clone());
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(20))
            .spawn(move || async move {
                let watch = p.clone();
                glommio::spawn_local(async move {
                    futures_lite::future::poll_fn(|cx| {
                        watch.shard(0).listen(cx.waker());
                        Poll::Ready(())
                    })
                    .await;
                    loop {
                        watch.beat(0);
                        glommio::timer::sleep(TICK).await;
                    }
                })
                .detach();
                // Busy for 2 s in 50 µs steps, yielding between them.
                for _ in 0..40_000 {
                    let step = std::time::Instant::now();
                    while step.elapsed() < Duration::from_micros(50) {
                        std::hint::spin_loop();
                    }
                    s.fetch_add(1, Ordering::Relaxed);
                    futures_lite::future::yield_now().await;
                }
                p.shard(0).end();
                let _ = done_tx.send(());
            })
            .unwrap();
        let limit = Duration::from_secs(60);
        if done_rx.recv_timeout(limit).is_err() {
            panic!(
                "the executor slept with a runnable task: {} of 40000 steps done in {limit:?}",
                steps.load(Ordering::Relaxed)
            );
        }
        executor.join().unwrap();
    }
}
