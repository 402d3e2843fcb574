//! A progress bar on stderr while a run goes (hidden when stderr is not a
//! terminal, so logs and CI output stay clean).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::args::LoadArgs;
use crate::scenario::{Clock, Stats};

/// A running progress bar and the task that refreshes it.
pub struct Progress {
    /// The bar (hidden when stderr is not a terminal).
    bar: ProgressBar,
    /// Refreshes the bar from the run's counters.
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Stops refreshing and removes the bar.
    pub fn finish(self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}

/// Starts a bar titled `title`: acknowledged publishes out of the total, or
/// seconds out of `--duration`, with current rates.
pub fn start(
    title: &str,
    args: &LoadArgs,
    stats: Arc<Stats>,
    clock: Clock,
    t0_us: u64,
) -> Progress {
    let by_time = args.duration.is_some() && args.count.is_none();
    let length = if by_time {
        args.duration.unwrap_or_default().as_secs().max(1)
    } else {
        args.total().unwrap_or(0)
    };
    let bar = ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr());
    let template = if by_time {
        "{prefix} [{bar:30}] {pos}/{len} s {msg}"
    } else {
        "{prefix} [{bar:30}] {pos}/{len} {msg}"
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(title.to_owned());
    let shown = bar.clone();
    let ticker = tokio::spawn(async move {
        let period = Duration::from_millis(250);
        let mut tick = tokio::time::interval(period);
        let (mut last_acked, mut last_delivered) = (0u64, 0u64);
        loop {
            tick.tick().await;
            let acked = stats.acked.load(Ordering::Relaxed);
            let delivered = stats.delivered.load(Ordering::Relaxed);
            let per_sec = |now: u64, before: u64| (now - before) as f64 / period.as_secs_f64();
            shown.set_position(if by_time {
                clock.now_us().saturating_sub(t0_us) / 1_000_000
            } else {
                acked
            });
            shown.set_message(format!(
                "acked {acked} ({:.0}/s), delivered {delivered} ({:.0}/s)",
                per_sec(acked, last_acked),
                per_sec(delivered, last_delivered),
            ));
            (last_acked, last_delivered) = (acked, delivered);
        }
    });
    Progress { bar, ticker }
}
