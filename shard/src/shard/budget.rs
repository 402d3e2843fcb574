//! The memory budget: moving bodies to disk past the shard's part of it,
//! and asking again for the backlog reads that waited for room. Apart
//! because commits, reads, fetches and the sweep all answer to it.

use super::Shard;
use crate::queue::Queue;

/// Least time between two searches for the queue to spill: a search scans
/// every queue of the shard.
const SPILL_SEARCH_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

impl Shard {
    /// Past 7/8 of its part of the memory budget, the shard moves the
    /// bodies of the queue holding the most in memory to disk, down to 3/4
    /// of its part: the biggest backlog pays, a queue served from memory
    /// does not. The last eighth is for what a body in memory costs besides
    /// its bytes (its message and queue entries, about 100 bytes), so that
    /// the budget bounds memory, not only body bytes.
    pub(super) fn keep_budget(&mut self) {
        let Some(part) = self.settings.spill_bytes else {
            return;
        };
        let cap = part / 8 * 7;
        let held = self.held.get();
        if held <= cap {
            return;
        }
        let now = self.clock.now();
        if self
            .last_spill_search
            .is_some_and(|t| now.duration_since(t) < SPILL_SEARCH_EVERY)
        {
            return;
        }
        self.last_spill_search = Some(now);
        let want = held - part / 4 * 3;
        let mut resident = 0;
        let mut biggest: Option<&mut Queue> = None;
        for q in self.queues.values_mut() {
            resident += q.resident_bytes();
            if biggest
                .as_ref()
                .is_none_or(|b| q.resident_bytes() > b.resident_bytes())
            {
                biggest = Some(q);
            }
        }
        let Some(q) = biggest else {
            return;
        };
        // When the ids of messages on disk take half the part, bodies alone
        // cannot bring the shard back under it: every queue keeps a
        // read-ahead batch at its head, so one whose consumers keep up is
        // still served from memory.
        let ids_dominate = held.saturating_sub(resident) >= part / 2;
        let freed = q.spill(want, ids_dominate);
        if freed > 0 {
            tracing::debug!(queue = %q.name(), freed, "bodies moved out of memory past the budget");
        }
        self.backlog.spilled_bytes += freed;
    }

    /// Whether bodies in memory are under the shard's part of the memory
    /// budget (always, for in-memory queues: their publishes are refused
    /// past it instead).
    pub(super) fn has_body_room(&self) -> bool {
        self.settings
            .spill_bytes
            .is_none_or(|part| self.held.bodies() < part)
    }

    /// Asks again for the reads that waited for the memory budget, once
    /// bodies in memory are back under it.
    pub(super) fn wake_budget_waiting(&mut self) {
        if !self.has_body_room() {
            return;
        }
        for name in std::mem::take(&mut self.budget_waiting) {
            self.want_read(&name);
        }
    }
}
