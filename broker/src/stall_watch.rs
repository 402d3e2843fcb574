//! Watches a shard's loop for stalls: one task wants a turn every
//! [`TICK`]; a turn that comes [`STALL_THRESHOLD`] late means something
//! held the shard's thread that long (a step that did not yield, a blocking
//! call). The lateness of every turn goes to `ciphermq_shard_loop_lag_seconds`,
//! each stall to `ciphermq_shard_stalls_total` and to the log, naming the
//! shard step begun last before it (every step runs through
//! [`ShardLocal::with_shard`], which notes its caller's source line).
//!
//! Each turn also renews the shard's heartbeat ([`crate::pulse`]), which the
//! systemd watchdog and the nudge thread ([`crate::nudge`]) read from their
//! own threads; the nudge thread wakes the shard through this task's waker
//! when the heartbeat goes silent.
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
    // The nudge thread wakes the shard through this task (`nudge.rs`).
    futures_lite::future::poll_fn(|cx| {
        pulses.shard(shard).listen(cx.waker());
        std::task::Poll::Ready(())
    })
    .await;
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
