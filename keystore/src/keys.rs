//! The public-key directory: receivers register their X25519 key, senders look
//! it up to encrypt for them.
//!
//! Registration runs on a broker shard, so it never blocks: a store starts the
//! write and hands back a [`Registration`] that resolves once the key is
//! durable. Lookups are served from memory and see a key only once it is
//! durable, so a sender never encrypts for a key that a crash could forget.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use tokio::sync::oneshot;

/// A raw X25519 public key.
pub type PublicKey = [u8; 32];

/// What a registration ends with: the key it replaced, or why it failed.
pub type RegistrationResult = Result<Option<PublicKey>, KeyStoreError>;

/// Resolves once the key is durable in the store (or failed). `Ok(previous)`
/// carries the key it replaced.
///
/// A tokio oneshot needs no tokio runtime: the broker polls it from a glommio
/// task. A receiver that ends without an answer (the store stopped) means the
/// key was not registered.
pub type Registration = oneshot::Receiver<RegistrationResult>;

/// Why a key could not be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyStoreError {
    /// The backing store failed or is busy; the key is not registered and the
    /// client may retry.
    #[error("key store unavailable: {0}")]
    Unavailable(String),
    /// The client id cannot name a stored key (empty, a NUL byte, or a path
    /// separator or leading dot that would escape the key directory).
    #[error("client id {0:?} cannot be stored as a key name")]
    InvalidClientId(String),
}

/// A directory of public keys by client id (the receiver's CN).
///
/// Shared by every shard, so implementations are `Send + Sync`; nothing here
/// may block the caller, which is a shard's reactor thread.
pub trait PublicKeyStore: Send + Sync {
    /// Starts storing (or replacing: key rotation) `client_id`'s key; never
    /// blocks the caller. Lookups see the new key only once it is durable.
    fn register(&self, client_id: &str, key: PublicKey) -> Registration;

    /// The key of `client_id`, if registered; from memory, no I/O.
    fn get(&self, client_id: &str) -> Option<PublicKey>;

    /// How many keys are registered.
    fn len(&self) -> usize;

    /// Whether no key is registered.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registration that is already decided (a store that needs no I/O, or a
/// request refused before any I/O).
pub fn resolved(result: RegistrationResult) -> Registration {
    let (tx, rx) = oneshot::channel();
    // The receiver is alive: it is returned below.
    let _ = tx.send(result);
    rx
}

/// Registers and waits for the outcome on the calling thread.
///
/// For tools and tests only: it blocks, so never call it from a shard or from
/// inside an async runtime (tokio panics there).
pub fn register_and_wait(
    store: &dyn PublicKeyStore,
    client_id: &str,
    key: PublicKey,
) -> RegistrationResult {
    store
        .register(client_id, key)
        .blocking_recv()
        .unwrap_or_else(|_| {
            Err(KeyStoreError::Unavailable(
                "the key store stopped before answering".to_owned(),
            ))
        })
}

/// Checks that `client_id` can name a stored key in every backend: file
/// names (no separators, no leading dot, which would also collide with temp
/// files) and PostgreSQL text (no NUL).
pub fn check_client_id(client_id: &str) -> Result<(), KeyStoreError> {
    let bad =
        client_id.is_empty() || client_id.starts_with('.') || client_id.contains(['/', '\\', '\0']);
    if bad {
        return Err(KeyStoreError::InvalidClientId(client_id.to_owned()));
    }
    Ok(())
}

/// Keys in memory only: lost on restart. For tests and transient brokers, and
/// the lookup side of the durable stores.
#[derive(Debug, Default)]
pub struct MemoryKeyStore {
    keys: RwLock<HashMap<String, PublicKey>>,
}

impl MemoryKeyStore {
    /// An empty directory.
    pub fn new() -> MemoryKeyStore {
        MemoryKeyStore::default()
    }

    /// Stores `key` now and returns the one it replaced. Durable stores call
    /// it once their write has landed.
    pub fn insert(&self, client_id: &str, key: PublicKey) -> Option<PublicKey> {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        keys.insert(client_id.to_owned(), key)
    }

    /// Looks `client_id` up.
    fn lookup(&self, client_id: &str) -> Option<PublicKey> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(client_id)
            .copied()
    }

    /// How many keys are held.
    fn count(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl PublicKeyStore for MemoryKeyStore {
    fn register(&self, client_id: &str, key: PublicKey) -> Registration {
        // Refuse what a durable backend would refuse, so a client that works
        // against a test broker works in production too.
        resolved(check_client_id(client_id).map(|()| self.insert(client_id, key)))
    }

    fn get(&self, client_id: &str) -> Option<PublicKey> {
        self.lookup(client_id)
    }

    fn len(&self) -> usize {
        self.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_replaces_and_looks_up() {
        let store = MemoryKeyStore::new();
        assert!(store.get("r1").is_none());
        assert_eq!(register_and_wait(&store, "r1", [1; 32]).unwrap(), None);
        assert_eq!(
            register_and_wait(&store, "r1", [2; 32]).unwrap(),
            Some([1; 32])
        );
        assert_eq!(store.get("r1"), Some([2; 32]));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_memory_registration_is_decided_at_once() {
        let store = MemoryKeyStore::new();
        let mut reg = store.register("r1", [1; 32]);
        assert_eq!(reg.try_recv().unwrap(), Ok(None));
    }

    #[test]
    fn client_ids_that_escape_a_directory_are_refused() {
        for bad in ["", ".hidden", "a/b", "..", "a\\b", "a\0b"] {
            assert!(check_client_id(bad).is_err(), "{bad:?}");
        }
        for good in ["receiver_1", "r.1", "CN with spaces"] {
            assert!(check_client_id(good).is_ok(), "{good:?}");
        }
    }
}
