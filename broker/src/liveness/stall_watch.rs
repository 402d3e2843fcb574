//! Watches a shard's loop for stalls: one task wants a turn every
//! [`TICK`]; a turn that comes [`STALL_THRESHOLD`] late means something
//! held the shard's thread that long (a step that did not yield, a blocking
//! call). The lateness of every turn goes to `ciphermq_shard_loop_lag_seconds`,
//! each stall to `ciphermq_shard_stalls_total` and to the log, naming the
//! shard step begun last before it (every step runs through
//! [`ShardLocal::with_shard`], which notes its caller's source line).
//!
//! Each turn also renews the shard's heartbeat ([`crate::liveness::pulse`]), which the
//! systemd watchdog and the nudge thread ([`crate::liveness::nudge`]) read from their
//! own threads; the nudge thread wakes the shard through this task's waker
//! when the heartbeat goes silent.
//!
//! A turn can also come late because the host did not give the thread a
//! CPU (other processes on a busy machine): the thread was ready to run and
//! waited. The kernel counts that wait (`/proc/thread-self/schedstat`, one
//! `pread` a turn); a late turn that waited for a CPU at least half of its
//! lateness is not the broker's stall but host contention, counted in
//! `ciphermq_shard_cpu_starved_total` and logged at info, at most once a
//! minute.
//!
//! The task runs in a task queue of its own, with no latency request (see
//! `committer.rs` for why no queue asks glommio for one), so a turn may also
//! come late because other queues had their fair share first: at most a few
//! milliseconds, far below the threshold.

use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{Latency, Shares};

use crate::runtime::context::ShardLocal;
use ciphermq_admin::thread_sched::OwnSchedstat;
use ciphermq_shard::log_throttle::LogThrottle;
use ciphermq_shard::log_throttled;

/// How often the watch wants a turn.
pub(crate) const TICK: Duration = Duration::from_millis(5);

/// A turn this late is a stall: logged and counted.
pub(crate) const STALL_THRESHOLD: Duration = Duration::from_millis(20);

/// Starts the watch of this shard in its own task queue.
pub(crate) fn spawn(local: Rc<ShardLocal>) {
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
    let stalled = LogThrottle::new(Duration::from_secs(1));
    let starved = LogThrottle::new(STARVED_LOG_EVERY);
    // This task runs on the shard's thread: these are its figures.
    let sched = OwnSchedstat::open();
    let waiting = || sched.as_ref().and_then(OwnSchedstat::waiting_ns);
    let (pulses, shard) = (local.shared.pulses.clone(), local.stats.shard);
    // The nudge thread wakes the shard through this task (`nudge.rs`).
    futures_lite::future::poll_fn(|cx| {
        pulses.shard(shard).listen(cx.waker());
        std::task::Poll::Ready(())
    })
    .await;
    loop {
        pulses.beat(shard);
        let waiting_before = waiting();
        let asked = Instant::now();
        glommio::timer::sleep(TICK).await;
        let late = asked.elapsed().saturating_sub(TICK);
        local.stats.loop_lag.observe(late);
        if late < STALL_THRESHOLD {
            continue;
        }
        let waited = waiting_before
            .zip(waiting())
            .map(|(before, now)| Duration::from_nanos(now.saturating_sub(before)));
        let late_ms = late.as_millis() as u64;
        match LateTurn::judge(late, waited) {
            LateTurn::Stall => {
                local.stats.stalls.add(1);
                let step = local.last_step();
                log_throttled!(warn, stalled.admit(Instant::now()), "stalls",
                    {
                        shard,
                        late_ms,
                        last_step = %step.map_or_else(|| "none".to_owned(), |l| format!("{}:{}", l.file(), l.line())),
                    },
                    "shard loop stalled: a turn came late (counted in ciphermq_shard_stalls_total)");
            }
            LateTurn::CpuStarved { waited } => {
                local.stats.cpu_starved.add(1);
                let waited_ms = waited.as_millis() as u64;
                log_throttled!(info, starved.admit(Instant::now()), "such turns",
                    { shard, late_ms, waited_ms, },
                    "shard loop waited for a CPU: the host is busy, not the broker (counted in ciphermq_shard_cpu_starved_total)");
            }
        }
    }
}

/// At most one line per this long for turns the host made late: on a busy
/// shared machine they come in runs, and they are the host's news, not the
/// broker's.
const STARVED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why a turn came [`STALL_THRESHOLD`] late or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LateTurn {
    /// The shard's thread was not waiting for a CPU most of that time: it
    /// ran a long step, sat in a blocking call, or was stopped.
    Stall,
    /// The thread waited, ready to run, for a CPU (`waited` of it) at least
    /// half of that time: other processes or threads held the cores.
    CpuStarved {
        /// Time ready to run but not running, during the turn's wait.
        waited: Duration,
    },
}

impl LateTurn {
    /// Judges a turn `late` past its tick, during whose wait the thread was
    /// ready to run but off a CPU for `waited` (`None`: the kernel keeps no
    /// such figure, so every late turn counts as a stall, as before).
    fn judge(late: Duration, waited: Option<Duration>) -> LateTurn {
        match waited {
            Some(waited) if waited >= late / 2 => LateTurn::CpuStarved { waited },
            _ => LateTurn::Stall,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::session::tests::{Backing, Broker};

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log buffer").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_late_turn_spent_waiting_for_a_cpu_is_the_host_s_not_a_stall() {
        let ms = Duration::from_millis;
        assert_eq!(LateTurn::judge(ms(100), Some(ms(0))), LateTurn::Stall);
        assert_eq!(LateTurn::judge(ms(100), Some(ms(49))), LateTurn::Stall);
        assert_eq!(
            LateTurn::judge(ms(100), Some(ms(50))),
            LateTurn::CpuStarved { waited: ms(50) }
        );
        assert_eq!(
            LateTurn::judge(ms(100), Some(ms(104))),
            LateTurn::CpuStarved { waited: ms(104) }
        );
        assert_eq!(LateTurn::judge(ms(100), None), LateTurn::Stall);
    }

    /// A shard step that holds the thread (a blocking call, here a sleep)
    /// past the threshold: the watch counts one stall, times its lateness,
    /// logs the step by its source line, and the shard's heartbeat goes
    /// stale while it lasts, so the systemd watchdog would withhold its ping.
    #[test]
    fn a_step_that_holds_the_shard_is_counted_logged_and_named() {
        const HELD: Duration = Duration::from_millis(150);
        let log = Captured::default();
        let sink = log.clone();
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let subscriber = tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_writer(move || sink.clone())
                    .finish();
                let _default = tracing::subscriber::set_default(subscriber);
                let broker = Broker::start(Backing::Memory, &[], "");
                let local = broker.local.clone();
                spawn(local.clone());
                glommio::timer::sleep(TICK * 4).await;
                let lag_before = local.stats.loop_lag.snapshot().count();
                assert!(lag_before > 0, "the watch takes turns");

                // Another thread, as the watchdog, reads the heartbeat while
                // the shard is held.
                let pulses = local.shared.pulses.clone();
                let watchdog = std::thread::spawn(move || {
                    std::thread::sleep(HELD / 2);
                    pulses.stalled(HELD / 4)
                });
                let held_at = line!() + 1;
                local.with_shard(|_| std::thread::sleep(HELD));
                glommio::timer::sleep(TICK * 4).await;

                let stalled = watchdog.join().expect("the watchdog thread");
                let (shard, silent) = stalled.expect("a held shard's heartbeat is stale");
                assert_eq!(shard, 0);
                assert!(silent >= HELD / 4, "silent for {silent:?}");
                // At least: a loaded machine may deschedule the thread too.
                assert!(local.stats.stalls.get() >= 1, "the held step is a stall");
                let step = local.last_step().expect("the held step is noted");
                assert_eq!((step.file(), step.line()), (file!(), held_at));
                assert!(
                    local.shared.pulses.stalled(HELD / 2).is_none(),
                    "beating again"
                );
                let late = local.stats.loop_lag.snapshot();
                assert!(late.count() > lag_before);
                (held_at, late)
            })
            .expect("an executor");
        let (held_at, late) = executor.join().expect("the shard thread");
        assert!(
            late.sum_us >= (HELD - TICK).as_micros() as u64,
            "the late turn is timed: {} µs late in all",
            late.sum_us
        );
        let text = String::from_utf8(log.0.lock().expect("log buffer").clone()).expect("utf-8");
        let named = format!("last_step={}:{held_at}", file!());
        let line = text
            .lines()
            .find(|l| l.contains(&named))
            .unwrap_or_else(|| panic!("no warning names the held step ({named}): {text}"));
        assert!(line.contains("WARN") && line.contains("shard=0"), "{line}");
        assert!(line.contains("shard loop stalled"), "{line}");
        assert!(line.contains("ciphermq_shard_stalls_total"), "{line}");
    }
}
