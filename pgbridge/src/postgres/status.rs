//! What the bridge reports about itself: a snapshot any thread may take
//! (`/ready`, metrics) while the bridge thread updates it.

use std::sync::{Mutex, PoisonError};

/// A copy of the bridge's health, cheap to take from any thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BridgeStatus {
    /// Every connection the bridge needs is up (keys, and the mirror's when
    /// it mirrors metadata).
    pub connected: bool,
    /// Metadata rows inserted or updated in committed transactions.
    pub rows_written: u64,
    /// Log bytes past the mirror's committed watermark, over all queues: what
    /// the disk budget is measured against.
    pub lag_bytes: u64,
    /// Messages durable in the logs whose rows are not committed yet, over
    /// all queues. Right after a restart a queue counts from the start of
    /// the segment the mirror is in, until its first batch or catch-up.
    pub lag_rows: u64,
    /// 0 when the last tick read every log to its end and committed it;
    /// otherwise seconds since that last happened.
    pub lag_seconds: f64,
    /// Segments deleted before the mirror read them to the end: their rows
    /// are missing from `message_metadata` (the log says which).
    pub missed_segments: u64,
    /// Connections re-established after a loss.
    pub reconnects: u64,
    /// The last failure (connection, transaction, file), for a person.
    pub last_error: Option<String>,
}

/// Which of the bridge's connections an update is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkKind {
    /// Serves key registrations.
    Keys,
    /// Writes metadata batches.
    Mirror,
}

impl LinkKind {
    /// For log lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            LinkKind::Keys => "keys",
            LinkKind::Mirror => "mirror",
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    status: BridgeStatus,
    keys_up: bool,
    /// `None` without a mirror (memory mode): it does not count.
    mirror_up: Option<bool>,
}

/// The bridge thread's side of [`BridgeStatus`].
#[derive(Debug, Default)]
pub(crate) struct StatusCell {
    inner: Mutex<Inner>,
}

impl StatusCell {
    /// A cell for a bridge that mirrors metadata (`mirror`) or only keys.
    pub(crate) fn new(mirror: bool) -> StatusCell {
        StatusCell {
            inner: Mutex::new(Inner {
                mirror_up: mirror.then_some(false),
                ..Inner::default()
            }),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Inner)) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut inner);
        inner.status.connected = inner.keys_up && inner.mirror_up.unwrap_or(true);
    }

    /// A copy of the current status.
    pub(crate) fn snapshot(&self) -> BridgeStatus {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .status
            .clone()
    }

    /// `kind`'s connection is up; `again` when it replaces a lost one.
    pub(crate) fn link_up(&self, kind: LinkKind, again: bool) {
        self.update(|i| {
            match kind {
                LinkKind::Keys => i.keys_up = true,
                LinkKind::Mirror => i.mirror_up = Some(true),
            }
            if again {
                i.status.reconnects += 1;
            }
        });
    }

    /// `kind`'s connection is down (or could not be made) because of `why`.
    pub(crate) fn link_down(&self, kind: LinkKind, why: String) {
        self.update(|i| {
            match kind {
                LinkKind::Keys => i.keys_up = false,
                LinkKind::Mirror => i.mirror_up = Some(false),
            }
            i.status.last_error = Some(why);
        });
    }

    /// Records a failure that did not take a connection down.
    pub(crate) fn error(&self, why: String) {
        self.update(|i| i.status.last_error = Some(why));
    }

    /// The last error, for messages to registrants.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .status
            .last_error
            .clone()
    }

    /// A batch of `rows` committed, with `missed` newly missed segments.
    pub(crate) fn committed(&self, rows: u64, missed: u64) {
        self.update(|i| {
            i.status.rows_written += rows;
            i.status.missed_segments += missed;
        });
    }

    /// The mirror's distance from the logs' ends.
    pub(crate) fn lag(&self, bytes: u64, rows: u64, seconds: f64) {
        self.update(|i| {
            i.status.lag_bytes = bytes;
            i.status.lag_rows = rows;
            i.status.lag_seconds = seconds;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_needs_every_link_and_reconnects_count_only_returns() {
        let cell = StatusCell::new(true);
        cell.link_up(LinkKind::Keys, false);
        assert!(!cell.snapshot().connected, "the mirror is not up yet");
        cell.link_up(LinkKind::Mirror, false);
        assert!(cell.snapshot().connected);
        cell.link_down(LinkKind::Mirror, "gone".to_owned());
        let down = cell.snapshot();
        assert!(!down.connected);
        assert_eq!(down.last_error.as_deref(), Some("gone"));
        cell.link_up(LinkKind::Mirror, true);
        assert!(cell.snapshot().connected);
        assert_eq!(cell.snapshot().reconnects, 1);

        let keys_only = StatusCell::new(false);
        keys_only.link_up(LinkKind::Keys, false);
        assert!(keys_only.snapshot().connected);
    }
}
