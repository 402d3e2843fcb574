//! The public-key directory: receivers register their X25519 key, senders look
//! it up to encrypt for them.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

/// A raw X25519 public key.
pub type PublicKey = [u8; 32];

/// Why a key could not be stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyStoreError {
    /// The backing store failed; the key is not registered.
    #[error("key store unavailable: {0}")]
    Unavailable(String),
}

/// A directory of public keys by client id (the receiver's CN).
///
/// Shared by every shard, so implementations are `Send + Sync`; `get` is on
/// the request path and must not do I/O.
pub trait PublicKeyStore: Send + Sync {
    /// Stores (or replaces: key rotation) `client_id`'s key; `Ok` only once it
    /// is as durable as the store promises. Returns the key it replaced.
    fn put(&self, client_id: &str, key: PublicKey) -> Result<Option<PublicKey>, KeyStoreError>;

    /// The key of `client_id`, if registered.
    fn get(&self, client_id: &str) -> Option<PublicKey>;

    /// How many keys are registered.
    fn len(&self) -> usize;

    /// Whether no key is registered.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keys in memory only: lost on restart. For tests and transient brokers.
#[derive(Debug, Default)]
pub struct MemoryKeyStore {
    keys: RwLock<HashMap<String, PublicKey>>,
}

impl MemoryKeyStore {
    /// An empty directory.
    pub fn new() -> MemoryKeyStore {
        MemoryKeyStore::default()
    }
}

impl PublicKeyStore for MemoryKeyStore {
    fn put(&self, client_id: &str, key: PublicKey) -> Result<Option<PublicKey>, KeyStoreError> {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        Ok(keys.insert(client_id.to_owned(), key))
    }

    fn get(&self, client_id: &str) -> Option<PublicKey> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(client_id)
            .copied()
    }

    fn len(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_replaces_and_looks_up() {
        let store = MemoryKeyStore::new();
        assert!(store.get("r1").is_none());
        assert_eq!(store.put("r1", [1; 32]).unwrap(), None);
        assert_eq!(store.put("r1", [2; 32]).unwrap(), Some([1; 32]));
        assert_eq!(store.get("r1"), Some([2; 32]));
        assert_eq!(store.len(), 1);
    }
}
