//! Receivers' public keys pinned on first use (trust on first use, like SSH's
//! `known_hosts`).
//!
//! A sender learns a receiver's X25519 key from the broker (`get_public_key`).
//! The broker cannot read payloads, but it could hand out a key of its own and
//! read what is then sealed for it. Pinning bounds that: the first key seen for a
//! receiver is stored, and a different key later is refused
//! ([`PublishError::KeyChanged`](crate::PublishError::KeyChanged)) until the
//! application accepts it explicitly. A substitution from the very first use on
//! is not detected; to close that gap too, pin keys obtained out of band
//! (`ciphermq-pki` writes `keys/<cn>_public.key`) with [`KeyPins::pin`] before
//! publishing.
//!
//! [`MemoryPins`] keeps pins for the life of the process; [`FilePins`] keeps them
//! in a file. Both are behind [`KeyPins`], so an application may keep pins
//! wherever it keeps its own state.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::error::PinStoreError;
use crate::crypto::{self, PublicKey};

/// Where pinned receiver keys live. Implementations must be cheap to call from
/// async code (a small file, a map); they are called once per receiver per key
/// check, not per message.
pub trait KeyPins: Send + Sync + fmt::Debug + 'static {
    /// The key pinned for `receiver`, if any.
    fn pinned(&self, receiver: &str) -> Result<Option<PublicKey>, PinStoreError>;

    /// Pins `key` for `receiver`, replacing any earlier pin.
    fn pin(&self, receiver: &str, key: &PublicKey) -> Result<(), PinStoreError>;
}

/// Pins in memory, shared by clones; gone with the process.
#[derive(Debug, Clone, Default)]
pub struct MemoryPins {
    /// Receiver id → pinned key.
    map: Arc<Mutex<HashMap<String, PublicKey>>>,
}

impl MemoryPins {
    /// An empty store.
    pub fn new() -> MemoryPins {
        MemoryPins::default()
    }
}

impl KeyPins for MemoryPins {
    fn pinned(&self, receiver: &str) -> Result<Option<PublicKey>, PinStoreError> {
        Ok(lock(&self.map).get(receiver).cloned())
    }

    fn pin(&self, receiver: &str, key: &PublicKey) -> Result<(), PinStoreError> {
        lock(&self.map).insert(receiver.to_owned(), key.clone());
        Ok(())
    }
}

/// Pins in a text file, one `<receiver_id> <base64 public key>` line per receiver
/// (`#` starts a comment line), sorted by receiver id. The file is created when
/// the first key is pinned and replaced atomically at each change (temporary
/// file, fsync, rename). Each [`KeyPins::pin`] reads the file again before
/// writing, so processes sharing the file do not drop each other's pins; a
/// receiver pinned by two processes at once keeps the last writer's key.
///
/// To accept a rotated key by hand, delete the receiver's line.
#[derive(Debug, Clone)]
pub struct FilePins {
    /// The file.
    path: PathBuf,
    /// The pins as last read or written; the file is the truth.
    map: Arc<Mutex<BTreeMap<String, PublicKey>>>,
}

impl FilePins {
    /// Opens the pin file at `path`; a missing file is an empty store, a
    /// malformed line an error naming it.
    pub fn open(path: &Path) -> Result<FilePins, PinStoreError> {
        let map = read_pins(path)?;
        Ok(FilePins {
            path: path.to_owned(),
            map: Arc::new(Mutex::new(map)),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl KeyPins for FilePins {
    fn pinned(&self, receiver: &str) -> Result<Option<PublicKey>, PinStoreError> {
        Ok(lock(&self.map).get(receiver).cloned())
    }

    fn pin(&self, receiver: &str, key: &PublicKey) -> Result<(), PinStoreError> {
        let mut map = lock(&self.map);
        let mut on_disk = read_pins(&self.path)?;
        on_disk.insert(receiver.to_owned(), key.clone());
        let mut text = String::from(
            "# Receivers' X25519 public keys pinned on first use by CipherMQ senders.\n\
             # A key the broker offers later that differs is refused; delete a line\n\
             # to accept that receiver's next key.\n",
        );
        for (id, key) in &on_disk {
            text.push_str(id);
            text.push(' ');
            text.push_str(&crypto::public_key_to_base64(key));
            text.push('\n');
        }
        crate::key_file::replace_file(&self.path, text.as_bytes(), 0o644).map_err(|error| {
            PinStoreError::Io {
                path: self.path.clone(),
                error: Arc::new(error),
            }
        })?;
        *map = on_disk;
        Ok(())
    }
}

/// Reads a pin file; missing is empty.
fn read_pins(path: &Path) -> Result<BTreeMap<String, PublicKey>, PinStoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(error) => {
            return Err(PinStoreError::Io {
                path: path.to_owned(),
                error: Arc::new(error),
            })
        }
    };
    let mut map = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let malformed = |reason: String| PinStoreError::Malformed {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        let mut words = line.split_whitespace();
        let (Some(id), Some(b64), None) = (words.next(), words.next(), words.next()) else {
            return Err(malformed("not two words".to_owned()));
        };
        if !ciphermq_proto::is_valid_name(id) {
            return Err(malformed(format!("{id:?} is not a client id")));
        }
        let key = crypto::public_key_from_base64(b64).map_err(|e| malformed(e.to_string()))?;
        if map.insert(id.to_owned(), key).is_some() {
            return Err(malformed(format!("{id} is pinned twice")));
        }
    }
    Ok(map)
}

/// Locks a map, recovering it from a panic elsewhere (the map stays consistent:
/// every update is one insert).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PublicKey {
        crypto::generate_secret_key().public_key()
    }

    #[test]
    fn memory_pins_are_shared_by_clones() {
        let pins = MemoryPins::new();
        let other = pins.clone();
        let k = key();
        pins.pin("receiver_1", &k).unwrap();
        assert_eq!(other.pinned("receiver_1").unwrap(), Some(k));
        assert_eq!(other.pinned("receiver_2").unwrap(), None);
    }

    #[test]
    fn file_pins_survive_reopening_and_keep_other_writers_pins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/known_receivers");
        let a = FilePins::open(&path).unwrap();
        assert_eq!(a.pinned("receiver_1").unwrap(), None);
        assert!(!path.exists(), "nothing written before a pin");
        let b = FilePins::open(&path).unwrap();
        let (k1, k2) = (key(), key());
        a.pin("receiver_1", &k1).unwrap();
        // `b` opened before `a` wrote; its pin keeps `a`'s.
        b.pin("receiver_2", &k2).unwrap();
        let c = FilePins::open(&path).unwrap();
        assert_eq!(c.pinned("receiver_1").unwrap(), Some(k1));
        assert_eq!(c.pinned("receiver_2").unwrap(), Some(k2.clone()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&format!(
            "receiver_2 {}\n",
            crypto::public_key_to_base64(&k2)
        )));
    }

    #[test]
    fn malformed_pin_files_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_receivers");
        let good = crypto::public_key_to_base64(&key());
        for (text, line) in [
            (format!("# c\nreceiver_1 {good}\nreceiver_2\n"), 3),
            ("receiver_1 QUFB\n".to_owned(), 1),
            (format!("bad/name {good}\n"), 1),
            (format!("r {good}\n\nr {good}\n"), 3),
        ] {
            std::fs::write(&path, text).unwrap();
            match FilePins::open(&path) {
                Err(PinStoreError::Malformed { line: l, .. }) => assert_eq!(l, line),
                other => panic!("expected a malformed line {line}, got {other:?}"),
            }
        }
    }
}
