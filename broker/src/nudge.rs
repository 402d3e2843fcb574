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
//!
//! Not covered: the same park before the executor's first task is ever
//! polled, when no waker exists yet. The thread would have to lose its
//! core for the whole preempt period at start-up; the start would then wait
//! for that shard. A signal to the shard's thread ends such a sleep too
//! (glommio takes an interrupted wait as a wake-up; the test below relies
//! on it), but the broker does not send one.

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
        if let Err(steps) = busy_executor_with_nudges() {
            panic!(
                "the executor slept with a runnable task: {steps} of {STEPS} steps done in {DONE_WITHIN:?}"
            );
        }
    }

    /// Steps of [`busy_executor_with_nudges`]: 2 s of work.
    const STEPS: u64 = 40_000;
    /// How long the steps may take, sleeps ended by the nudge thread included.
    const DONE_WITHIN: Duration = Duration::from_secs(60);

    /// Runs [`STEPS`] busy steps on an executor with a 20 µs preempt timer
    /// and its own nudge thread; `Err(steps)`: it slept with work runnable
    /// and stayed asleep.
    fn busy_executor_with_nudges() -> Result<(), u64> {
        let pulses = Arc::new(Pulses::new(1));
        spawn(&pulses, vec![Arc::new(ShardStats::new(0))]).unwrap();
        let steps = Arc::new(AtomicU64::new(0));
        let (started_tx, started_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let (p, s) = (pulses.clone(), steps.clone());
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(20))
            .name(EXECUTOR_NAME)
            .spawn(move || async move {
                // This task's waker is the one the nudge thread wakes: it
                // exists from the first poll, before any step.
                futures_lite::future::poll_fn(|cx| {
                    p.shard(0).listen(cx.waker());
                    Poll::Ready(())
                })
                .await;
                p.beat(0);
                let _ = started_tx.send(());
                let beats = p.clone();
                glommio::spawn_local(async move {
                    loop {
                        beats.beat(0);
                        glommio::timer::sleep(TICK).await;
                    }
                })
                .detach();
                // Busy in 50 µs steps, yielding between them.
                for _ in 0..STEPS {
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
        // The executor can also fall asleep before its first task is ever
        // polled, when no waker exists yet for the nudge thread to wake.
        // That is not the case under test (in the broker, a shard's
        // stall watch runs among its first tasks): until the task has
        // left its waker, a signal to the executor's thread ends any such
        // sleep (glommio takes an interrupted wait as a wake-up).
        let begun = std::time::Instant::now();
        while started_rx.recv_timeout(Duration::from_millis(50)).is_err() {
            assert!(
                begun.elapsed() < Duration::from_secs(30),
                "the executor never polled its first task"
            );
            interrupt_threads_named(EXECUTOR_NAME);
        }
        if done_rx.recv_timeout(DONE_WITHIN).is_err() {
            return Err(steps.load(Ordering::Relaxed));
        }
        executor.join().unwrap();
        Ok(())
    }

    /// The test executor's thread name (a prefix: glommio appends an id).
    const EXECUTOR_NAME: &str = "nudge-test";

    /// Sends SIGURG, handled by doing nothing, to every thread of this
    /// process whose name starts with `prefix`: a thread waiting in a
    /// system call returns from it with `EINTR`.
    fn interrupt_threads_named(prefix: &str) {
        extern "C" fn ignore(_: libc::c_int) {}
        static HANDLER: std::sync::Once = std::sync::Once::new();
        // SAFETY: installs a handler that does nothing, for a signal the
        // test process does not otherwise use; no SA_RESTART, so a waiting
        // system call is interrupted.
        HANDLER.call_once(|| unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigaction(libc::SIGURG, &action, std::ptr::null_mut());
        });
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for task in tasks.flatten() {
            let named = std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix));
            let tid = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<libc::pid_t>().ok());
            if let (true, Some(tid)) = (named, tid) {
                // SAFETY: tgkill to a thread of this very process, with a
                // signal whose handler does nothing.
                unsafe {
                    libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGURG);
                }
            }
        }
    }
}
