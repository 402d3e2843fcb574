//! The embedded public-key store: `{data_dir}/keys/{client_id}.key`, each key
//! sealed as in `crate::seal` (AES-256-GCM, fresh nonce, client id as
//! associated data).
//!
//! A file is `nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`, written to a
//! temp file, fsynced, renamed, and the directory fsynced: `Public key
//! registered` is only sent once the key is durable. Those fsyncs take
//! milliseconds, and registration is called on a shard, so they run on the
//! store's own writer thread; a full queue refuses at once rather than block.
//! All keys are loaded and opened at start, so a wrong `aes_key` fails there,
//! never later.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use aes_gcm::aead::KeyInit;
use aes_gcm::Aes256Gcm;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::oneshot;

use crate::keys::{
    check_client_id, resolved, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore,
    Registration, RegistrationResult,
};
use crate::seal::{open, seal, NONCE_BYTES, TAG_BYTES};

/// Registrations waiting for the writer thread. Registration is rare (once
/// per receiver start); a burst beyond this is refused, not queued without
/// bound.
const WRITE_QUEUE: usize = 256;

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
    /// The writer thread could not be started.
    #[error("cannot start the key writer thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// One registration for the writer thread.
struct WriteJob {
    client_id: String,
    key: PublicKey,
    reply: oneshot::Sender<RegistrationResult>,
}

/// Public keys sealed on disk, served from memory.
pub struct FileKeyStore {
    dir: PathBuf,
    /// What lookups are served from; the writer fills it after each fsync.
    memory: Arc<MemoryKeyStore>,
    /// To the writer thread; dropped first on drop so the thread ends.
    jobs: Option<Sender<WriteJob>>,
    /// Joined on drop, so queued registrations finish before the store goes.
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FileKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileKeyStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl FileKeyStore {
    /// Opens (creating) `dir`, decrypts every key in it with `aes_key`, and
    /// starts the writer thread.
    pub fn open(dir: &Path, aes_key: &[u8; 32]) -> Result<FileKeyStore, OpenError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let cipher = Aes256Gcm::new(aes_key.into());
        let memory = Arc::new(MemoryKeyStore::new());
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let Some(client) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".key"))
                .filter(|n| !n.starts_with('.'))
            else {
                continue;
            };
            let sealed = fs::read(&path).map_err(io(&path))?;
            let key = open_file(&cipher, client, &sealed)
                .ok_or_else(|| OpenError::WrongKey { path: path.clone() })?;
            memory.insert(client, key);
        }
        let (jobs, queue) = crossbeam_channel::bounded(WRITE_QUEUE);
        let writer = {
            let dir = dir.to_owned();
            let memory = memory.clone();
            std::thread::Builder::new()
                .name("ciphermq-keys".to_owned())
                .spawn(move || write_loop(&dir, &cipher, &memory, &queue))
                .map_err(OpenError::Thread)?
        };
        Ok(FileKeyStore {
            dir: dir.to_owned(),
            memory,
            jobs: Some(jobs),
            writer: Some(writer),
        })
    }
}

/// The writer thread: one durable write per job, then the memory map, then
/// the answer, so nobody looks up a key that is not on disk yet.
fn write_loop(dir: &Path, cipher: &Aes256Gcm, memory: &MemoryKeyStore, queue: &Receiver<WriteJob>) {
    for job in queue {
        let result = match write_file(dir, cipher, &job.client_id, &job.key) {
            Ok(()) => Ok(memory.insert(&job.client_id, job.key)),
            Err(e) => {
                tracing::error!(dir = %dir.display(), client_id = %job.client_id, error = %e, "storing a public key failed");
                Err(KeyStoreError::Unavailable(format!(
                    "{}: {e}",
                    dir.display()
                )))
            }
        };
        // The registrant may have gone away; the key is stored either way.
        let _ = job.reply.send(result);
    }
}

fn write_file(
    dir: &Path,
    cipher: &Aes256Gcm,
    client_id: &str,
    key: &PublicKey,
) -> std::io::Result<()> {
    let sealed = seal(cipher, client_id, key)
        .ok_or_else(|| std::io::Error::other("AES-GCM sealing failed"))?;
    let tmp = dir.join(format!(".{client_id}.key.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(&sealed.nonce)?;
    file.write_all(&sealed.ciphertext)?;
    file.write_all(&sealed.tag)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(format!("{client_id}.key")))?;
    fs::File::open(dir)?.sync_all()
}

/// Opens a key file's content: nonce ‖ ciphertext ‖ tag.
fn open_file(cipher: &Aes256Gcm, client_id: &str, sealed: &[u8]) -> Option<PublicKey> {
    if sealed.len() < NONCE_BYTES + TAG_BYTES {
        return None;
    }
    let (nonce, rest) = sealed.split_at(NONCE_BYTES);
    let (ciphertext, tag) = rest.split_at(rest.len() - TAG_BYTES);
    open(cipher, client_id, nonce, ciphertext, tag)
}

impl PublicKeyStore for FileKeyStore {
    fn register(&self, client_id: &str, key: PublicKey) -> Registration {
        if let Err(e) = check_client_id(client_id) {
            return resolved(Err(e));
        }
        let Some(jobs) = &self.jobs else {
            return resolved(Err(KeyStoreError::Unavailable(
                "key store closed".to_owned(),
            )));
        };
        let (reply, registration) = oneshot::channel();
        let job = WriteJob {
            client_id: client_id.to_owned(),
            key,
            reply,
        };
        match jobs.try_send(job) {
            Ok(()) => registration,
            Err(TrySendError::Full(_)) => {
                resolved(Err(KeyStoreError::Unavailable("key store busy".to_owned())))
            }
            Err(TrySendError::Disconnected(_)) => resolved(Err(KeyStoreError::Unavailable(
                "key store writer stopped".to_owned(),
            ))),
        }
    }

    fn get(&self, client_id: &str) -> Option<PublicKey> {
        self.memory.get(client_id)
    }

    fn len(&self) -> usize {
        self.memory.len()
    }
}

impl Drop for FileKeyStore {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has written what is queued.
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::register_and_wait;

    #[test]
    fn keys_survive_a_reopen_and_are_sealed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let aes = [7u8; 32];
        let store = FileKeyStore::open(dir.path(), &aes).unwrap();
        assert_eq!(
            register_and_wait(&store, "receiver_1", [9u8; 32]).unwrap(),
            None
        );
        assert_eq!(
            register_and_wait(&store, "receiver_1", [8u8; 32]).unwrap(),
            Some([9u8; 32])
        );
        let raw = fs::read(dir.path().join("receiver_1.key")).unwrap();
        assert_eq!(raw.len(), NONCE_BYTES + 32 + TAG_BYTES);
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
        let store = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        register_and_wait(&store, "r", [2u8; 32]).unwrap();
        drop(store);
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
        let store = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        register_and_wait(&store, "r1", [2u8; 32]).unwrap();
        drop(store);
        fs::rename(dir.path().join("r1.key"), dir.path().join("r2.key")).unwrap();
        assert!(FileKeyStore::open(dir.path(), &[1u8; 32]).is_err());
    }

    #[test]
    fn a_key_is_served_only_once_it_is_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        let registration = store.register("r1", [5u8; 32]);
        // Whenever the lookup sees the key, its file must already exist.
        if store.get("r1").is_some() {
            assert!(dir.path().join("r1.key").exists());
        }
        assert_eq!(registration.blocking_recv().unwrap(), Ok(None));
        assert!(dir.path().join("r1.key").exists());
        assert_eq!(store.get("r1"), Some([5u8; 32]));
    }

    #[test]
    fn a_client_id_that_would_escape_the_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileKeyStore::open(&dir.path().join("keys"), &[1u8; 32]).unwrap();
        let err = register_and_wait(&store, "../escape", [5u8; 32]).unwrap_err();
        assert_eq!(err, KeyStoreError::InvalidClientId("../escape".to_owned()));
        assert!(!dir.path().join("escape.key").exists());
    }

    #[test]
    fn registrations_queued_before_drop_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        let pending: Vec<_> = (0..20)
            .map(|i| store.register(&format!("r{i}"), [i as u8; 32]))
            .collect();
        drop(store);
        for registration in pending {
            assert!(registration.blocking_recv().unwrap().is_ok());
        }
        let again = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        assert_eq!(again.len(), 20);
    }
}
