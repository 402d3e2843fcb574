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
//! own task was the one waiting (docs/benchmarks-journal.md "Tail latency" and
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
//! The same park can come before the executor's first task is ever polled,
//! when no waker exists yet: the thread lost its core for the whole preempt
//! period at start-up, and the start would wait for that shard forever.
//! [`await_first_word`] covers it: while a new shard's first task has not
//! been polled ([`FirstPoll`]), its thread, if asleep, is interrupted with a
//! signal, and glommio takes an interrupted wait as a wake-up. Once the task
//! runs, a shard that is only slow to answer is left alone.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

use ciphermq_stats::ShardStats;

use crate::liveness::pulse::{thread_asleep, Pulses};
use crate::liveness::stall_watch::TICK;

/// How often the thread reads the heartbeats.
pub(crate) const PERIOD: Duration = Duration::from_millis(2);

/// A shard whose heartbeat is older than this (two stall-watch ticks) is
/// woken.
pub(crate) const SILENCE: Duration = Duration::from_millis(2 * TICK.as_millis() as u64);

/// How long a new executor may take to send its first word before its
/// thread is interrupted, and again after each interruption.
pub(crate) const FIRST_WORD_GRACE: Duration = Duration::from_millis(50);

/// Whether a new executor has polled its first task: before that no waker
/// of it exists, and a signal is the only way to end a park (module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct FirstPoll(Arc<AtomicBool>);

impl FirstPoll {
    /// `task`, marking the first poll before it runs: the executor's first
    /// task must be wrapped.
    pub(crate) async fn mark<F: Future>(self, task: F) -> F::Output {
        self.0.store(true, Ordering::Release);
        task.await
    }

    /// Whether the wrapped task has been polled.
    pub(crate) fn happened(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Waits for the first message a newly spawned executor sends on `ready`
/// (`Err` once it has dropped its sender). `thread` is its thread's name,
/// and `first_poll` wraps its first task: each time [`FIRST_WORD_GRACE`]
/// passes without a word and before that task's first poll, the threads of
/// that name found asleep are interrupted, which ends a park before the
/// first poll (module doc). After it, a shard slow to answer (restoring a
/// large backlog, say) is waited for without interruptions.
pub(crate) fn await_first_word<T>(
    ready: &mpsc::Receiver<T>,
    thread: &str,
    first_poll: &FirstPoll,
) -> Result<T, mpsc::RecvError> {
    loop {
        match ready.recv_timeout(FIRST_WORD_GRACE) {
            Ok(word) => return Ok(word),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::RecvTimeoutError::Timeout) if first_poll.happened() => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                for tid in threads_named(thread) {
                    if thread_asleep(tid) {
                        crate::runtime::sys::interrupt_thread(tid);
                    }
                }
            }
        }
    }
}

/// The threads of this process named `name` (as the kernel keeps it: at
/// most 15 bytes). glommio gives an executor's blocking-I/O thread its
/// executor's name, so there may be two.
fn threads_named(name: &str) -> Vec<i32> {
    let name = &name.as_bytes()[..name.len().min(15)];
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read(task.path().join("comm"))
                .is_ok_and(|comm| comm.strip_suffix(b"\n").unwrap_or(&comm) == name)
        })
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

/// Starts the thread for the shards of `pulses`, counting its wakes in
/// `stats` (indexed by shard). It ends once every shard has ended or the
/// pulses are gone.
pub(crate) fn spawn(pulses: &Arc<Pulses>, stats: Vec<Arc<ShardStats>>) -> std::io::Result<()> {
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

    /// The start-up case: executors with a preempt timer so short that it
    /// often fires before their first task is polled, each asked for its
    /// first word the broker's way. An executor asleep then and never
    /// interrupted keeps the wait going for ever: the test gives up after
    /// [`FIRST_WORD_WITHIN`]. (Without the interruption it failed at the
    /// first to fourth executor, in every run tried.)
    #[test]
    fn an_executor_asleep_before_its_first_poll_is_woken() {
        for round in 0..EXECUTORS {
            let (ready_tx, ready_rx) = mpsc::channel();
            let first_poll = FirstPoll::default();
            let marked = first_poll.clone();
            let executor = LocalExecutorBuilder::new(Placement::Unbound)
                .preempt_timer(Duration::from_micros(20))
                .name("first-word")
                .spawn(move || {
                    marked.mark(async move {
                        let _ = ready_tx.send(round);
                    })
                })
                .unwrap();
            assert_eq!(
                first_word_within(ready_rx, executor.thread(), first_poll, FIRST_WORD_WITHIN),
                Some(round),
                "executor {round} gave no first word in {FIRST_WORD_WITHIN:?}"
            );
            executor.join().unwrap();
        }
    }

    /// After its first poll a shard may take its time to answer, asleep in
    /// the kernel (waiting for a file, say): it is not interrupted then. The
    /// executor's first task waits in a blocking socket read, which an
    /// interruption would end with `EINTR`; the byte comes after several
    /// grace periods. (Interrupted every time when the first poll is not
    /// looked at.)
    #[test]
    fn a_shard_slow_after_its_first_poll_is_not_interrupted() {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixStream;

        let (mut writer, mut reader) = UnixStream::pair().unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        let first_poll = FirstPoll::default();
        let marked = first_poll.clone();
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .name("slow-start")
            .spawn(move || {
                marked.mark(async move {
                    let mut byte = [0u8; 1];
                    let read = reader.read(&mut byte).map_err(|e| e.kind());
                    let _ = ready_tx.send(read);
                })
            })
            .unwrap();
        let thread = executor.thread().clone();
        let word = std::thread::spawn(move || {
            first_word_within(ready_rx, &thread, first_poll, FIRST_WORD_WITHIN)
        });
        std::thread::sleep(FIRST_WORD_GRACE * 6);
        // Fails once an interrupted reader has closed its end.
        let _ = writer.write_all(b"x");
        assert_eq!(
            word.join().unwrap(),
            Some(Ok(1)),
            "the read was interrupted"
        );
        executor.join().unwrap();
    }

    /// Executors started by [`an_executor_asleep_before_its_first_poll_is_woken`].
    const EXECUTORS: u32 = 20;

    /// How long a test waits for an executor's first word, interruptions
    /// included, before it fails instead of hanging.
    const FIRST_WORD_WITHIN: Duration = Duration::from_secs(30);

    /// [`await_first_word`] for the executor running on `thread`, on a
    /// thread of its own; `None` if it has not returned a word in `limit`.
    fn first_word_within<T: Send + 'static>(
        ready: mpsc::Receiver<T>,
        thread: &std::thread::Thread,
        first_poll: FirstPoll,
        limit: Duration,
    ) -> Option<T> {
        let name = thread.name().unwrap_or_default().to_owned();
        let (word_tx, word_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = word_tx.send(await_first_word(&ready, &name, &first_poll));
        });
        word_rx.recv_timeout(limit).ok()?.ok()
    }

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
        let first_poll = FirstPoll::default();
        let marked = first_poll.clone();
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_micros(20))
            .name(EXECUTOR_NAME)
            .spawn(move || {
                marked.mark(async move {
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
            })
            .unwrap();
        // The executor can also fall asleep before its first task is ever
        // polled, when no waker exists yet for the nudge thread to wake:
        // the start-up case, covered the broker's way.
        first_word_within(started_rx, executor.thread(), first_poll, FIRST_WORD_WITHIN)
            .expect("the executor polled its first task");
        if done_rx.recv_timeout(DONE_WITHIN).is_err() {
            return Err(steps.load(Ordering::Relaxed));
        }
        executor.join().unwrap();
        Ok(())
    }

    /// The test executor's thread name (glommio appends an id).
    const EXECUTOR_NAME: &str = "nudge-test";
}
