//! What other threads can see of each shard without asking it (a shard
//! answers nothing while it is wedged, and nothing once it ended).
//!
//! - A heartbeat: the shard's stall watch (`stall_watch.rs`) renews it every
//!   few milliseconds, so a heartbeat that stops means the shard's loop no
//!   longer runs. The systemd watchdog ([`crate::runtime::systemd`]) pings only while
//!   every shard beats, so the service manager restarts a wedged broker.
//! - Once the broker stops: what the shard's drain still waits for
//!   (connections, commit rounds, handshakes), renewed by the drain itself
//!   (`shutdown.rs`), and whether the drain gave up at
//!   `server.shutdown_timeout_secs`. `ciphermq-broker` logs it when the drain
//!   does not finish in time or a second signal cuts it short.
//!
//! - A way in: the stall watch's waker, through which the nudge thread
//!   ([`crate::liveness::nudge`]) wakes a shard whose executor fell asleep with work
//!   still to run.
//!
//! Plain atomics, each written by one shard and read by anyone: the
//! shard never waits on a reader. (The waker sits behind a lock the shard
//! takes only when it starts and when it ends.)

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::Waker;
use std::time::{Duration, Instant};

/// Every shard's pulse.
#[derive(Debug)]
pub struct Pulses {
    /// What the heartbeats count their milliseconds from.
    base: Instant,
    shards: Box<[ShardPulse]>,
}

/// One shard's pulse; see the module documentation.
#[derive(Debug, Default)]
pub struct ShardPulse {
    /// Milliseconds from [`Pulses::base`] to the last beat.
    beat_ms: AtomicU64,
    /// The shard's executor ended (after its drain): it no longer beats, and
    /// that is no stall.
    ended: AtomicBool,
    /// The drain began: the three counts below are kept current.
    draining: AtomicBool,
    /// Connections the drain waits for.
    connections: AtomicUsize,
    /// Commit rounds in flight, plus one when appends wait for a round.
    commits: AtomicUsize,
    /// TLS handshakes in progress.
    handshakes: AtomicUsize,
    /// The drain gave up at the deadline with work still open.
    gave_up: AtomicBool,
    /// The stall watch's task, left when the shard starts and taken when it
    /// ends (so the waker is dropped on the shard's own thread).
    watch: Mutex<Option<Waker>>,
    /// The shard's thread (its Linux thread id; 0 until the stall watch
    /// starts), to tell a shard asleep from one that is busy.
    thread: AtomicI32,
}

/// What one shard's drain still waited for when last looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenWork {
    /// Which shard.
    pub shard: usize,
    /// Connections not yet answered and closed (usually: a client that does
    /// not read what it is owed).
    pub connections: usize,
    /// Commit rounds in flight, plus one when appends wait for a round:
    /// publishes whose `ACK` waits for an `fdatasync`.
    pub commits: usize,
    /// TLS handshakes in progress.
    pub handshakes: usize,
    /// The drain has not begun on this shard (it has not seen the stop yet).
    pub not_draining: bool,
    /// The shard's executor has ended.
    pub ended: bool,
}

impl OpenWork {
    /// Whether the shard waits for nothing.
    pub fn is_idle(&self) -> bool {
        self.connections == 0 && self.commits == 0 && self.handshakes == 0
    }
}

impl fmt::Display for OpenWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}: ", self.shard)?;
        if self.ended {
            return f.write_str("ended");
        }
        if self.not_draining {
            return f.write_str("not draining yet");
        }
        write!(
            f,
            "{} connection(s), {} commit(s) pending, {} handshake(s)",
            self.connections, self.commits, self.handshakes
        )
    }
}

/// [`OpenWork`] of every shard, shown as one line (`shard 0: …; shard 1: …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenWorkList(pub Vec<OpenWork>);

impl fmt::Display for OpenWorkList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, work) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{work}")?;
        }
        Ok(())
    }
}

impl Pulses {
    /// Pulses for `shards` shards, each beating now.
    pub fn new(shards: usize) -> Pulses {
        Pulses {
            base: Instant::now(),
            shards: (0..shards).map(|_| ShardPulse::default()).collect(),
        }
    }

    /// Shard `shard`'s pulse (`shard` < the shard count).
    pub fn shard(&self, shard: usize) -> &ShardPulse {
        &self.shards[shard]
    }

    /// Renews `shard`'s heartbeat (a relaxed store: no reader needs more).
    pub fn beat(&self, shard: usize) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.shards[shard].beat_ms.store(ms, Ordering::Relaxed);
    }

    /// Every shard still running that has not beaten for longer than
    /// `limit`, each with the time of its last beat (milliseconds from the
    /// pulses' start: the same value for as long as one silence lasts).
    pub fn silent(&self, limit: Duration) -> impl Iterator<Item = (usize, u64)> + '_ {
        let now = self.base.elapsed();
        self.shards
            .iter()
            .enumerate()
            .filter_map(move |(i, pulse)| {
                if pulse.ended.load(Ordering::Acquire) {
                    return None;
                }
                let beat = pulse.beat_ms.load(Ordering::Relaxed);
                (now.saturating_sub(Duration::from_millis(beat)) > limit).then_some((i, beat))
            })
    }

    /// Whether every shard's executor has ended.
    pub fn all_ended(&self) -> bool {
        self.shards.iter().all(|p| p.ended.load(Ordering::Acquire))
    }

    /// The first shard that is still running but has not beaten for longer
    /// than `limit`, and how long ago it last did.
    pub fn stalled(&self, limit: Duration) -> Option<(usize, Duration)> {
        let (shard, beat) = self.silent(limit).next()?;
        let silent = self
            .base
            .elapsed()
            .saturating_sub(Duration::from_millis(beat));
        Some((shard, silent))
    }

    /// What every shard's drain still waits for, as last recorded.
    pub fn open_work(&self) -> OpenWorkList {
        OpenWorkList(
            self.shards
                .iter()
                .enumerate()
                .map(|(shard, p)| OpenWork {
                    shard,
                    connections: p.connections.load(Ordering::Relaxed),
                    commits: p.commits.load(Ordering::Relaxed),
                    handshakes: p.handshakes.load(Ordering::Relaxed),
                    not_draining: !p.draining.load(Ordering::Acquire),
                    ended: p.ended.load(Ordering::Acquire),
                })
                .collect(),
        )
    }

    /// Whether some shard's drain gave up at the deadline.
    pub fn any_gave_up(&self) -> bool {
        self.shards
            .iter()
            .any(|p| p.gave_up.load(Ordering::Acquire))
    }
}

impl ShardPulse {
    /// Records what the drain waits for now.
    pub(crate) fn draining(&self, work: OpenWork) {
        self.connections.store(work.connections, Ordering::Relaxed);
        self.commits.store(work.commits, Ordering::Relaxed);
        self.handshakes.store(work.handshakes, Ordering::Relaxed);
        self.draining.store(true, Ordering::Release);
    }

    /// The drain gave up at the deadline.
    pub(crate) fn give_up(&self) {
        self.gave_up.store(true, Ordering::Release);
    }

    /// The shard's executor is about to end. Called on the shard's thread.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        drop(self.watch_lock().take());
    }

    /// Leaves the waker of the shard's stall watch, for [`ShardPulse::wake`],
    /// and notes the calling thread as the shard's. Called on the shard's
    /// thread.
    pub(crate) fn listen(&self, waker: &Waker) {
        *self.watch_lock() = Some(waker.clone());
        self.thread
            .store(crate::runtime::sys::thread_id(), Ordering::Relaxed);
    }

    /// Whether the shard's thread is asleep in the kernel
    /// ([`thread_asleep`]); false before it has listened.
    pub(crate) fn asleep(&self) -> bool {
        match self.thread.load(Ordering::Relaxed) {
            0 => false,
            tid => thread_asleep(tid),
        }
    }

    /// Wakes the shard's stall watch from any thread: if the executor sleeps,
    /// the wake ends its sleep. Whether there was a waker to wake.
    pub(crate) fn wake(&self) -> bool {
        match self.watch_lock().as_ref() {
            Some(waker) => {
                waker.wake_by_ref();
                true
            }
            None => false,
        }
    }

    fn watch_lock(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.watch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether thread `tid` of this process is off the CPU, waiting in the
/// kernel (the state `/proc` gives it is `S` or `D`), rather than running or
/// ready to run. False when that cannot be told.
pub(crate) fn thread_asleep(tid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // "<tid> (<name>) <state> …": the name may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('S' | 'D'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_stops_beating_is_stalled_until_it_ends() {
        let pulses = Pulses::new(2);
        pulses.beat(0);
        pulses.beat(1);
        assert_eq!(pulses.stalled(Duration::from_millis(200)), None);
        std::thread::sleep(Duration::from_millis(60));
        pulses.beat(0);
        let (shard, silent) = pulses.stalled(Duration::from_millis(30)).unwrap();
        assert_eq!(shard, 1);
        assert!(silent >= Duration::from_millis(30), "{silent:?}");
        pulses.shard(1).end();
        assert_eq!(pulses.stalled(Duration::from_millis(30)), None);
    }

    /// Counts the wakes it gets.
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_silent_shard_keeps_its_last_beat_and_is_woken_through_its_watch() {
        let pulses = Pulses::new(2);
        pulses.beat(0);
        pulses.beat(1);
        assert_eq!(pulses.silent(Duration::from_millis(200)).count(), 0);
        std::thread::sleep(Duration::from_millis(60));
        pulses.beat(0);
        let silent: Vec<_> = pulses.silent(Duration::from_millis(30)).collect();
        assert_eq!(silent.len(), 1);
        assert_eq!(silent[0].0, 1);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            pulses.silent(Duration::from_millis(30)).collect::<Vec<_>>(),
            silent,
            "one silence keeps the beat it began after"
        );

        assert!(!pulses.shard(1).wake(), "no watch has left a waker yet");
        let counter = std::sync::Arc::new(CountingWaker(Default::default()));
        pulses.shard(1).listen(&Waker::from(counter.clone()));
        assert!(pulses.shard(1).wake());
        assert!(pulses.shard(1).wake(), "the waker stays for the next wake");
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);

        assert!(!pulses.shard(1).asleep(), "this thread is running");

        pulses.shard(1).end();
        assert!(!pulses.shard(1).wake(), "an ended shard lets its waker go");
        assert_eq!(pulses.silent(Duration::from_millis(30)).count(), 0);
        assert!(!pulses.all_ended());
        pulses.shard(0).end();
        assert!(pulses.all_ended());
    }

    #[test]
    fn a_shard_thread_waiting_in_the_kernel_is_asleep() {
        let pulses = std::sync::Arc::new(Pulses::new(1));
        assert!(!pulses.shard(0).asleep(), "no thread noted yet");
        let (noted_tx, noted_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let p = pulses.clone();
        let thread = std::thread::spawn(move || {
            p.shard(0).listen(Waker::noop());
            noted_tx.send(()).unwrap();
            let _ = stop_rx.recv();
        });
        noted_rx.recv().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pulses.shard(0).asleep() {
            assert!(
                Instant::now() < deadline,
                "a thread blocked on a channel reads as asleep"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        stop_tx.send(()).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn open_work_reads_as_one_line_per_broker() {
        let pulses = Pulses::new(3);
        pulses.shard(0).draining(OpenWork {
            connections: 2,
            commits: 1,
            ..OpenWork::default()
        });
        pulses.shard(1).draining(OpenWork::default());
        pulses.shard(1).end();
        assert_eq!(
            pulses.open_work().to_string(),
            "shard 0: 2 connection(s), 1 commit(s) pending, 0 handshake(s); shard 1: ended; \
             shard 2: not draining yet"
        );
        assert!(!pulses.any_gave_up());
        pulses.shard(0).give_up();
        assert!(pulses.any_gave_up());
    }
}
