//! A one-line progress display for the client binaries, redrawn in place a few
//! times a second. The binaries show it only when stdout is a terminal, so logs
//! and piped output stay clean.
//!
//! Log lines go to stderr, which is usually the same terminal: the console
//! log writer ([`crate::logging`]) erases the progress line before each log
//! line and draws it again after ([`LogLine`]), so a log line never lands on
//! the bar. One lock serialises the two.

use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::receiver::ReceiverStats;
use crate::sender::SenderStats;

/// How often the line is redrawn.
pub const TICK: Duration = Duration::from_millis(250);

/// Width of the bar in characters.
const BAR_WIDTH: usize = 30;

/// Erases the terminal line the cursor is on and returns to its start.
const ERASE_LINE: &str = "\r\x1b[2K";

/// The progress line as the terminal shows it: one per process, shared by the
/// drawing task and the log writer.
static SCREEN: Mutex<Screen> = Mutex::new(Screen { drawn: None });

/// What is drawn on the terminal's last line.
#[derive(Debug, Default)]
struct Screen {
    /// The progress text on the screen now, if any.
    drawn: Option<String>,
}

impl Screen {
    /// Draws `text` in place of the current line.
    fn draw(&mut self, out: &mut dyn Write, text: String) {
        let _ = write!(out, "{ERASE_LINE}{text}");
        let _ = out.flush();
        self.drawn = Some(text);
    }

    /// Erases the progress line for good.
    fn erase(&mut self, out: &mut dyn Write) {
        if self.drawn.take().is_some() {
            let _ = write!(out, "{ERASE_LINE}");
            let _ = out.flush();
        }
    }

    /// Before a log line: the progress line is erased, and remembered.
    fn hide(&self, out: &mut dyn Write) {
        if self.drawn.is_some() {
            let _ = write!(out, "{ERASE_LINE}");
            let _ = out.flush();
        }
    }

    /// After a log line (which ended with a newline): the progress line again.
    fn show(&self, out: &mut dyn Write) {
        if let Some(text) = &self.drawn {
            let _ = write!(out, "{ERASE_LINE}{text}");
            let _ = out.flush();
        }
    }
}

/// The screen, even if a thread panicked while drawing (the text is still
/// what is on the terminal).
fn screen() -> MutexGuard<'static, Screen> {
    SCREEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held while one log line is written to stderr: the progress line (if one is
/// drawn) is erased when this is made and drawn again when it is dropped, and
/// cannot be redrawn in between.
#[derive(Debug)]
pub struct LogLine {
    /// The locked screen.
    screen: MutexGuard<'static, Screen>,
}

impl LogLine {
    /// Erases the progress line, if one is drawn, for a log line to follow.
    pub fn start() -> LogLine {
        let screen = screen();
        screen.hide(&mut std::io::stdout().lock());
        LogLine { screen }
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        self.screen.show(&mut std::io::stdout().lock());
    }
}

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
                        let text = render(started.elapsed());
                        screen().draw(&mut std::io::stdout().lock(), text);
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
        screen().erase(&mut std::io::stdout().lock());
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

/// The receiver's line: received, written, duplicates, rejected, msg/s. The
/// rate is over the time messages flowed ([`ReceiverStats::msgs_per_sec`]),
/// not `_elapsed`: a receiver mostly waits.
pub fn receiver_line(stats: &ReceiverStats, _elapsed: Duration) -> String {
    format!(
        "received {} written {} duplicates {} rejected {} acked {} | {:.0} msg/s",
        stats.received.load(Relaxed),
        stats.written.load(Relaxed),
        stats.duplicates.load(Relaxed),
        stats.rejected.load(Relaxed),
        stats.acked.load(Relaxed),
        stats.msgs_per_sec()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a terminal receives from stdout and stderr together, in order.
    #[derive(Default)]
    struct Terminal(Vec<u8>);

    impl Write for Terminal {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Terminal {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0).into_owned()
        }
    }

    #[test]
    fn a_log_line_erases_the_progress_line_first_and_redraws_it_after() {
        let mut screen = Screen::default();
        let mut term = Terminal::default();
        screen.draw(&mut term, "[#####] 50%".to_owned());
        // A log line, as the console writer writes it.
        screen.hide(&mut term);
        term.write_all(b"WARN connection lost; reconnecting\n")
            .unwrap();
        screen.show(&mut term);
        assert_eq!(
            term.text(),
            "\r\x1b[2K[#####] 50%\r\x1b[2KWARN connection lost; reconnecting\n\r\x1b[2K[#####] 50%"
        );
        // The log line starts on an erased line, at its start.
        let log_at = term.text().find("WARN").unwrap();
        assert!(term.text()[..log_at].ends_with(ERASE_LINE));
    }

    #[test]
    fn without_a_progress_line_log_lines_pass_untouched() {
        let mut screen = Screen::default();
        let mut term = Terminal::default();
        screen.hide(&mut term);
        term.write_all(b"INFO connected\n").unwrap();
        screen.show(&mut term);
        assert_eq!(term.text(), "INFO connected\n");
        // Nor after the line was erased for good.
        screen.draw(&mut term, "x".to_owned());
        screen.erase(&mut term);
        let mut term = Terminal::default();
        screen.hide(&mut term);
        term.write_all(b"INFO done\n").unwrap();
        screen.show(&mut term);
        assert_eq!(term.text(), "INFO done\n");
    }

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
