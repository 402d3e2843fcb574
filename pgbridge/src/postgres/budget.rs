//! The disk budget: how long fully acked segments wait for the mirror.
//!
//! While the mirror's backlog is within budget, each queue's
//! `MirrorWatermarks` cell holds the segment the mirror is reading, so the
//! broker keeps everything the mirror still needs. Past the budget the
//! mirror lets go of every queue (`release_all`): the broker keeps serving
//! and deletes acked segments, and rows in segments deleted before the
//! mirror reaches them are missing (logged, and counted in
//! `missed_segments`). Back within budget, precise holds resume.

/// What to do with the watermarks after measuring the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Within budget: hold each queue at the mirror's segment as usual.
    Hold,
    /// Over budget: let go of every queue (again: shards may have created
    /// cells since). `newly` is the first tick over it, to warn once.
    Release {
        /// First tick over the budget.
        newly: bool,
    },
    /// Back within budget after a release: hold every queue again.
    Restore,
}

/// Whether the mirror currently holds segments back.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    max_bytes: u64,
    released: bool,
}

impl Budget {
    /// A budget of `max_bytes` unmirrored log bytes, holding at first.
    pub(crate) fn new(max_bytes: u64) -> Budget {
        Budget {
            max_bytes,
            released: false,
        }
    }

    /// The mirror has let go: committed batches must not set holds.
    pub(crate) fn released(&self) -> bool {
        self.released
    }

    /// Decides from the backlog `lag_bytes`.
    pub(crate) fn decide(&mut self, lag_bytes: u64) -> Decision {
        if lag_bytes > self.max_bytes {
            let newly = !self.released;
            self.released = true;
            Decision::Release { newly }
        } else if self.released {
            self.released = false;
            Decision::Restore
        } else {
            Decision::Hold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_past_the_budget_warns_once_and_restores_below_it() {
        let mut budget = Budget::new(100);
        assert_eq!(
            budget.decide(100),
            Decision::Hold,
            "at the budget is within it"
        );
        assert!(!budget.released());
        assert_eq!(budget.decide(101), Decision::Release { newly: true });
        assert!(budget.released());
        assert_eq!(budget.decide(5_000), Decision::Release { newly: false });
        assert_eq!(budget.decide(0), Decision::Restore);
        assert!(!budget.released());
        assert_eq!(budget.decide(0), Decision::Hold);
        assert_eq!(budget.decide(101), Decision::Release { newly: true });
    }

    #[test]
    fn a_zero_budget_releases_on_any_backlog() {
        let mut budget = Budget::new(0);
        assert_eq!(budget.decide(0), Decision::Hold);
        assert_eq!(budget.decide(1), Decision::Release { newly: true });
    }
}
