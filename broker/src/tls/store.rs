//! The `[tls]` in force, swapped whole by a reload.
//!
//! A handshake reads it once, when it starts: each shard keeps the version
//! it last used ([`crate::runtime::context::ShardLocal::tls`]) and compares one
//! version number per accept (an atomic load), taking the lock only after a
//! reload. A session keeps the configuration it was made with, so a reload
//! never touches open connections (except for the CRL's revocations, see
//! [`crate::access::forced_close`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::tls::material::TlsMaterial;

/// The current [`TlsMaterial`] and its version.
#[derive(Debug)]
pub(crate) struct TlsStore {
    current: RwLock<(u64, Arc<TlsMaterial>)>,
    version: AtomicU64,
}

impl TlsStore {
    /// A store holding `material` as version 0.
    pub(crate) fn new(material: TlsMaterial) -> TlsStore {
        TlsStore {
            current: RwLock::new((0, Arc::new(material))),
            version: AtomicU64::new(0),
        }
    }

    /// The current version (one atomic load).
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current material and its version.
    pub(crate) fn current(&self) -> (u64, Arc<TlsMaterial>) {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes `material` current for every handshake that starts from now
    /// on; returns the one it replaces.
    pub(crate) fn replace(&self, material: TlsMaterial) -> Arc<TlsMaterial> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let version = current.0 + 1;
        let old = std::mem::replace(&mut *current, (version, Arc::new(material)));
        self.version.store(version, Ordering::Release);
        old.1
    }
}
