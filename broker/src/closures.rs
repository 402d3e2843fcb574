//! `close_connection <cn>`: an admin ends every connection a CN has open.
//!
//! Every connection takes a ticket when it opens. Closing a CN records the
//! next ticket as that CN's cutoff and moves a version number; each
//! connection compares that version once per turn (one atomic load, as for
//! a policy reload) and, when it moved, ends itself if its CN has a cutoff
//! above its ticket. Connections opened afterwards are not affected. The
//! shard watchers that wake connections on a reload wake them for this too,
//! so idle connections end promptly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The cutoffs `close_connection` set, by CN.
#[derive(Debug, Default)]
pub struct ConnectionClosures {
    /// Tickets handed to connections as they open.
    tickets: AtomicU64,
    /// Moves on every `close_connection`.
    version: AtomicU64,
    /// Per CN: connections with a lower ticket must end. One entry per CN
    /// ever closed (admins' commands only), replaced by each new closing.
    cutoffs: Mutex<HashMap<Box<str>, u64>>,
}

impl ConnectionClosures {
    /// A ticket for a connection opening now.
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// The current version (one atomic load).
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Marks every connection of `cn` open now for closing; the caller wakes
    /// the shards.
    pub(crate) fn close_all_of(&self, cn: &str) {
        let cutoff = self.tickets.load(Ordering::Relaxed);
        self.cutoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Box::from(cn), cutoff);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether the connection of `cn` holding `ticket` must end.
    pub fn must_close(&self, cn: &str, ticket: u64) -> bool {
        self.cutoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(cn)
            .is_some_and(|&cutoff| ticket < cutoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_open_at_the_closing_end() {
        let c = ConnectionClosures::default();
        let before = c.ticket();
        let other = c.ticket();
        let v = c.version();
        c.close_all_of("sender_1");
        assert_ne!(c.version(), v);
        let after = c.ticket();
        assert!(c.must_close("sender_1", before));
        assert!(!c.must_close("sender_1", after), "opened after the closing");
        assert!(!c.must_close("sender_2", other), "another CN");
    }
}
