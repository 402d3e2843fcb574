//! A one-line progress display for the client binaries, redrawn in place a few
//! times a second. The binaries show it only when stdout is a terminal, so logs
//! and piped output stay clean.

use std::io::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::receiver::ReceiverStats;
use crate::sender::SenderStats;

/// How often the line is redrawn.
pub const TICK: Duration = Duration::from_millis(250);

/// Width of the bar in characters.
const BAR_WIDTH: usize = 30;

/// A running progress line; [`ProgressLine::finish`] erases it.
#[derive(Debug)]
pub struct ProgressLine {
    /// Tells the task to stop.
    stop: Arc<Notify>,
    /// The drawing task.
    task: JoinHandle<()>,
}

impl ProgressLine {
    /// Starts redrawing `render(elapsed)` on stdout every [`TICK`].
    pub fn start<F>(render: F) -> ProgressLine
    where
        F: Fn(Duration) -> String + Send + 'static,
    {
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let mut out = std::io::stdout().lock();
                        let _ = write!(out, "\r\x1b[2K{}", render(started.elapsed()));
                        let _ = out.flush();
                    }
                    () = stopped.notified() => break,
                }
            }
        });
        ProgressLine { stop, task }
    }

    /// Stops redrawing and erases the line.
    pub async fn finish(self) {
        self.stop.notify_one();
        let _ = self.task.await;
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K");
        let _ = out.flush();
    }
}

/// `[#####.....]  42%` for `done` of `total`; empty if `total` is 0 (unknown).
pub fn bar(done: u64, total: u64) -> String {
    if total == 0 {
        return String::new();
    }
    let done = done.min(total);
    let filled = (done as u128 * BAR_WIDTH as u128 / total as u128) as usize;
    format!(
        "[{}{}] {:3}% ",
        "#".repeat(filled),
        ".".repeat(BAR_WIDTH - filled),
        done * 100 / total
    )
}

/// Rate over `elapsed`.
fn rate(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// The sender's line: bar, sent, acked, failed, retries, msg/s.
pub fn sender_line(stats: &SenderStats, elapsed: Duration) -> String {
    let acked = stats.acked.load(Relaxed);
    let failed = stats.failed.load(Relaxed);
    let total = stats.total.load(Relaxed);
    format!(
        "{}sent {} acked {} failed {} retries {} | {:.0} msg/s",
        bar(acked + failed, total),
        stats.sent.load(Relaxed),
        acked,
        failed,
        stats.retries.load(Relaxed),
        rate(acked, elapsed)
    )
}

/// The receiver's line: received, written, duplicates, rejected, msg/s.
pub fn receiver_line(stats: &ReceiverStats, elapsed: Duration) -> String {
    let written = stats.written.load(Relaxed);
    format!(
        "received {} written {} duplicates {} rejected {} acked {} | {:.0} msg/s",
        stats.received.load(Relaxed),
        written,
        stats.duplicates.load(Relaxed),
        stats.rejected.load(Relaxed),
        stats.acked.load(Relaxed),
        rate(written, elapsed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_proportionally() {
        assert_eq!(bar(0, 0), "");
        let half = bar(50, 100);
        assert!(
            half.starts_with("[###############..............."),
            "{half}"
        );
        assert!(half.ends_with(" 50% "));
        assert!(bar(200, 100).contains("100%"));
    }
}
