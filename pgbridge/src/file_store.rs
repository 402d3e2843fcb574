//! The embedded public-key store: `{data_dir}/keys/{client_id}.key`, each key
//! sealed with AES-256-GCM under `encryption.aes_key` with a fresh 96-bit nonce
//! per write and the client id as associated data (a file renamed to another
//! client does not open).
//!
//! A file is `nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`, written to a
//! temp file, fsynced, renamed, and the directory fsynced: `Public key
//! registered` is only sent once the key is durable. All keys are loaded and
//! opened at start, so a wrong `aes_key` fails there, never later.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use rand::RngCore;

use crate::keys::{KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore};

const NONCE_BYTES: usize = 12;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The directory or a file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A key file does not open with the configured key.
    #[error(
        "{path}: does not decrypt with encryption.aes_key (wrong key, or the file is damaged)"
    )]
    WrongKey {
        /// The key file.
        path: PathBuf,
    },
}

/// Public keys sealed on disk, served from memory.
pub struct FileKeyStore {
    dir: PathBuf,
    cipher: Aes256Gcm,
    /// What lookups are served from.
    memory: MemoryKeyStore,
}

impl std::fmt::Debug for FileKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileKeyStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl FileKeyStore {
    /// Opens (creating) `dir` and decrypts every key in it with `aes_key`.
    pub fn open(dir: &Path, aes_key: &[u8; 32]) -> Result<FileKeyStore, OpenError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let cipher = Aes256Gcm::new(aes_key.into());
        let memory = MemoryKeyStore::new();
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let Some(client) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".key"))
            else {
                continue;
            };
            let sealed = fs::read(&path).map_err(io(&path))?;
            let key = open_sealed(&cipher, client, &sealed)
                .ok_or_else(|| OpenError::WrongKey { path: path.clone() })?;
            let _ = memory.put(client, key);
        }
        Ok(FileKeyStore {
            dir: dir.to_owned(),
            cipher,
            memory,
        })
    }

    fn write(&self, client_id: &str, key: &PublicKey) -> std::io::Result<()> {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::thread_rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: key,
                    aad: client_id.as_bytes(),
                },
            )
            .map_err(|_| std::io::Error::other("AES-GCM sealing failed"))?;
        let tmp = self.dir.join(format!(".{client_id}.key.tmp"));
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&nonce)?;
        file.write_all(&sealed)?;
        file.sync_all()?;
        fs::rename(&tmp, self.dir.join(format!("{client_id}.key")))?;
        fs::File::open(&self.dir)?.sync_all()
    }
}

fn open_sealed(cipher: &Aes256Gcm, client_id: &str, sealed: &[u8]) -> Option<PublicKey> {
    if sealed.len() < NONCE_BYTES {
        return None;
    }
    let (nonce, body) = sealed.split_at(NONCE_BYTES);
    let plain = cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: body,
                aad: client_id.as_bytes(),
            },
        )
        .ok()?;
    plain.try_into().ok()
}

impl PublicKeyStore for FileKeyStore {
    fn put(&self, client_id: &str, key: PublicKey) -> Result<Option<PublicKey>, KeyStoreError> {
        // Registration is rare; the write is small and synchronous.
        self.write(client_id, &key)
            .map_err(|e| KeyStoreError::Unavailable(format!("{}: {e}", self.dir.display())))?;
        self.memory.put(client_id, key)
    }

    fn get(&self, client_id: &str) -> Option<PublicKey> {
        self.memory.get(client_id)
    }

    fn len(&self) -> usize {
        self.memory.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_a_reopen_and_are_sealed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let aes = [7u8; 32];
        let store = FileKeyStore::open(dir.path(), &aes).unwrap();
        store.put("receiver_1", [9u8; 32]).unwrap();
        store.put("receiver_1", [8u8; 32]).unwrap();
        let raw = fs::read(dir.path().join("receiver_1.key")).unwrap();
        assert!(
            !raw.windows(32).any(|w| w == [8u8; 32]),
            "the key is not stored in clear"
        );
        let again = FileKeyStore::open(dir.path(), &aes).unwrap();
        assert_eq!(again.get("receiver_1"), Some([8u8; 32]));
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn a_wrong_aes_key_fails_at_open() {
        let dir = tempfile::tempdir().unwrap();
        FileKeyStore::open(dir.path(), &[1u8; 32])
            .unwrap()
            .put("r", [2u8; 32])
            .unwrap();
        let err = FileKeyStore::open(dir.path(), &[3u8; 32]).unwrap_err();
        assert!(
            err.to_string()
                .contains("does not decrypt with encryption.aes_key"),
            "{err}"
        );
    }

    #[test]
    fn a_file_moved_to_another_client_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        FileKeyStore::open(dir.path(), &[1u8; 32])
            .unwrap()
            .put("r1", [2u8; 32])
            .unwrap();
        fs::rename(dir.path().join("r1.key"), dir.path().join("r2.key")).unwrap();
        assert!(FileKeyStore::open(dir.path(), &[1u8; 32]).is_err());
    }
}
