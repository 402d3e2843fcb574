//! Connections ended from outside: `close_connection <cn>` (an admin ends
//! every connection a CN has open) and a reloaded CRL (the connections of
//! the certificates it revokes end).
//!
//! Every connection takes a ticket when it opens. Closing a CN records the
//! next ticket as that CN's cutoff and moves a version number; each
//! connection compares that version once per turn (one atomic load, as for
//! a policy reload) and, when it moved, ends itself if its CN has a cutoff
//! above its ticket, or if its certificate is among the revoked ones.
//! Connections opened afterwards are not affected by a closing (and a
//! revoked certificate cannot open one). The shard watchers that wake
//! connections on a reload wake them for this too, so idle connections end
//! promptly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::access::identity::CertId;
use crate::tls::crl::Revocations;

/// The cutoffs `close_connection` set, by CN.
#[derive(Debug, Default)]
pub(crate) struct ConnectionClosures {
    /// Tickets handed to connections as they open.
    tickets: AtomicU64,
    /// Moves on every `close_connection`.
    version: AtomicU64,
    /// Per CN: connections with a lower ticket must end. One entry per CN
    /// ever closed (admins' commands only), replaced by each new closing.
    cutoffs: Mutex<HashMap<Box<str>, u64>>,
    /// The certificates the CRLs in force revoke: a connection holding one
    /// ends at its next look (read only when the version moved).
    revoked: Mutex<Arc<Revocations>>,
}

impl ConnectionClosures {
    /// A ticket for a connection opening now.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// The current version (one atomic load).
    #[inline]
    pub(crate) fn version(&self) -> u64 {
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

    /// Makes `revoked` the certificates connections may not hold. When it
    /// holds one the previous set did not, moves the version, so the
    /// connections holding one end at their next turn, and returns true
    /// (the caller wakes the shards); a set that only shrank or stayed
    /// moves nothing.
    pub(crate) fn revoke(&self, revoked: Arc<Revocations>) -> bool {
        let mut current = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
        let newly = revoked.adds_to(&current);
        *current = revoked;
        drop(current);
        if newly {
            self.version.fetch_add(1, Ordering::AcqRel);
        }
        newly
    }

    /// Whether `cert` is revoked by the CRLs last given to [`Self::revoke`].
    pub(crate) fn is_revoked(&self, cert: &CertId) -> bool {
        self.revoked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(cert)
    }

    /// Whether the connection of `cn` holding `ticket` must end.
    pub(crate) fn must_close(&self, cn: &str, ticket: u64) -> bool {
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

    #[test]
    fn a_revocation_moves_the_version_and_names_certificates() {
        let c = ConnectionClosures::default();
        let revoked = CertId::new(b"ca", &[1]);
        let kept = CertId::new(b"ca", &[2]);
        assert!(!c.is_revoked(&revoked));
        let v = c.version();
        assert!(c.revoke(Arc::new([revoked.clone()].into_iter().collect())));
        assert_ne!(c.version(), v);
        assert!(c.is_revoked(&revoked));
        assert!(!c.is_revoked(&kept));
        assert!(!c.is_revoked(&CertId::new(b"other ca", &[1])));
        // The same list again, or a shorter one: nothing new to close.
        let v = c.version();
        assert!(!c.revoke(Arc::new([revoked.clone()].into_iter().collect())));
        assert!(!c.revoke(Arc::default()));
        assert_eq!(c.version(), v);
        assert!(!c.is_revoked(&revoked), "taken back");
    }
}
