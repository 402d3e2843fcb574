//! The embedded public-key store: `{data_dir}/keys/{client_id}.key`, each key
//! sealed as in `crate::seal` (AES-256-GCM, fresh nonce, client id as
//! associated data).
//!
//! A file is `nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`, mode 0600,
//! replaced atomically (temp file, fsync, rename, directory fsync):
//! `Public key registered` is only sent once the key is durable. Those fsyncs
//! take milliseconds, and registration is called on a shard, so they run on
//! the store's own writer thread; a full queue refuses at once rather than
//! block.
//!
//! All keys are loaded and opened at start. A file that does not open (too
//! short, or its tag does not authenticate) costs only that receiver's key:
//! it is moved to `{file}.corrupt-<unix-ms>` beside the others, reported as a
//! warning, and the receiver registers again. A wrong `aes_key` is told
//! apart from damage by `aes_key.check`, a known value sealed beside the
//! keys: if the keys do not open because the key is wrong, the start stops
//! and no file is moved.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use aes_gcm::aead::KeyInit;
use aes_gcm::Aes256Gcm;
use ciphermq_datadir::{self as data_dir, StorageWarning};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::oneshot;

use crate::keys::{
    check_client_id, resolved, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore,
    Registration, RegistrationResult,
};
use crate::seal::{open, seal, Sealed, NONCE_BYTES, TAG_BYTES};

/// Registrations waiting for the writer thread. Registration is rare (once
/// per receiver start); a burst beyond this is refused, not queued without
/// bound.
const WRITE_QUEUE: usize = 256;

/// The file beside the keys that holds [`CHECK_VALUE`] sealed under the
/// configured key. Its name does not end in `.key`, so it is never taken for
/// a client's key.
pub const CHECK_FILE: &str = "aes_key.check";
/// Associated data of the check value: not a client id (it has spaces), so no
/// client's sealed key can pass for it.
const CHECK_LABEL: &str = "ciphermq aes_key check";
/// What the check file seals.
const CHECK_VALUE: PublicKey = [0u8; 32];

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
    /// No key file opens with the configured key, and nothing shows the key
    /// is right: moving every key aside would lose them all to a typo.
    #[error(
        "{}: none of the {count} sealed public keys here opens with the configured AES key \
         (for one, {}). It is not the key they were sealed under: configure that one \
         (encryption.aes_key, encryption.aes_key_file or CIPHERMQ_AES_KEY, or restore aes.key in \
         the data directory). If the files are damaged instead, move them out of this directory; \
         receivers then register again.",
        .dir.display(),
        .example.display()
    )]
    WrongKey {
        /// The keys directory.
        dir: PathBuf,
        /// One of the key files.
        example: PathBuf,
        /// How many key files there are.
        count: usize,
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

/// A key file that did not open, and why.
struct Unopened {
    path: PathBuf,
    client: String,
    why: String,
}

impl FileKeyStore {
    /// Opens (creating) `dir`, decrypts every key in it with `aes_key`, and
    /// starts the writer thread.
    ///
    /// Key files that cannot be opened are moved aside and returned as
    /// warnings (also logged), so one damaged file costs one receiver a
    /// re-registration, not the broker its start. Fails when the key
    /// itself looks wrong ([`OpenError::WrongKey`]) or a file cannot be read.
    pub fn open(
        dir: &Path,
        aes_key: &[u8; 32],
    ) -> Result<(FileKeyStore, Vec<StorageWarning>), OpenError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        // For the broker's user alone, as every directory of the data
        // directory.
        data_dir::create_dir_all(dir).map_err(io(dir))?;
        let cipher = Aes256Gcm::new(aes_key.into());
        let memory = Arc::new(MemoryKeyStore::new());
        let mut unopened = Vec::new();
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if data_dir::temporary_target(name).is_some() {
                // Left by a crash during a write; the file it was for is
                // either absent (never registered) or intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(client) = name.strip_suffix(".key").filter(|n| !n.starts_with('.')) else {
                continue;
            };
            let sealed = fs::read(&path).map_err(io(&path))?;
            match open_file(&cipher, client, &sealed) {
                Ok(key) => {
                    memory.insert(client, key);
                }
                Err(why) => unopened.push(Unopened {
                    client: client.to_owned(),
                    path,
                    why,
                }),
            }
        }
        let mut warnings = Vec::new();
        let check = dir.join(CHECK_FILE);
        let key_is_right = match fs::read(&check) {
            Ok(bytes) => Some(open_file(&cipher, CHECK_LABEL, &bytes) == Ok(CHECK_VALUE)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&check)(e)),
        };
        match key_is_right {
            Some(true) => {}
            _ if memory.len() == 0 && !unopened.is_empty() => {
                return Err(OpenError::WrongKey {
                    dir: dir.to_owned(),
                    example: unopened[0].path.clone(),
                    count: unopened.len(),
                })
            }
            Some(false) => {
                write_check(&cipher, &check).map_err(io(&check))?;
                warnings.push(StorageWarning::new(
                    &check,
                    format!(
                        "did not open with the configured AES key while {} sealed key(s) did: it \
                         was damaged, and has been written again",
                        memory.len()
                    ),
                ));
            }
            None => write_check(&cipher, &check).map_err(io(&check))?,
        }
        for bad in unopened {
            let aside = data_dir::move_aside(&bad.path).map_err(io(&bad.path))?;
            warnings.push(StorageWarning::new(
                &bad.path,
                format!(
                    "the sealed public key of {} cannot be opened ({}); moved to {}. Senders \
                     cannot fetch it until {} registers its key again (the receiver does so when \
                     it starts)",
                    bad.client,
                    bad.why,
                    aside.display(),
                    bad.client
                ),
            ));
        }
        for w in &warnings {
            tracing::warn!(path = %w.path.display(), "{}", w.message);
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
        let store = FileKeyStore {
            dir: dir.to_owned(),
            memory,
            jobs: Some(jobs),
            writer: Some(writer),
        };
        Ok((store, warnings))
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

/// The bytes of a key file.
fn file_bytes(sealed: &Sealed) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(NONCE_BYTES + sealed.ciphertext.len() + TAG_BYTES);
    bytes.extend_from_slice(&sealed.nonce);
    bytes.extend_from_slice(&sealed.ciphertext);
    bytes.extend_from_slice(&sealed.tag);
    bytes
}

fn write_file(
    dir: &Path,
    cipher: &Aes256Gcm,
    client_id: &str,
    key: &PublicKey,
) -> std::io::Result<()> {
    let sealed = seal(cipher, client_id, key)
        .ok_or_else(|| std::io::Error::other("AES-GCM sealing failed"))?;
    data_dir::write_atomic(
        &dir.join(format!("{client_id}.key")),
        &file_bytes(&sealed),
        data_dir::SECRET_MODE,
    )
}

/// Writes the check file: [`CHECK_VALUE`] sealed under the configured key.
fn write_check(cipher: &Aes256Gcm, path: &Path) -> std::io::Result<()> {
    let sealed = seal(cipher, CHECK_LABEL, &CHECK_VALUE)
        .ok_or_else(|| std::io::Error::other("AES-GCM sealing failed"))?;
    data_dir::write_atomic(path, &file_bytes(&sealed), data_dir::SECRET_MODE)
}

/// Opens a key file's content: nonce ‖ ciphertext ‖ tag; the error says why
/// not, for the warning.
fn open_file(cipher: &Aes256Gcm, client_id: &str, sealed: &[u8]) -> Result<PublicKey, String> {
    let expected = NONCE_BYTES + CHECK_VALUE.len() + TAG_BYTES;
    if sealed.len() != expected {
        return Err(format!(
            "{} bytes, where a sealed key has {expected}",
            sealed.len()
        ));
    }
    let (nonce, rest) = sealed.split_at(NONCE_BYTES);
    let (ciphertext, tag) = rest.split_at(rest.len() - TAG_BYTES);
    open(cipher, client_id, nonce, ciphertext, tag).ok_or_else(|| {
        "it does not authenticate under the configured AES key: damaged, or sealed for another \
         client"
            .to_owned()
    })
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
    use std::os::unix::fs::PermissionsExt;

    /// Opens a store that must open without warnings.
    fn open_clean(dir: &Path, aes: &[u8; 32]) -> FileKeyStore {
        let (store, warnings) = FileKeyStore::open(dir, aes).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        store
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn keys_survive_a_reopen_and_are_sealed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let aes = [7u8; 32];
        let store = open_clean(dir.path(), &aes);
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
        let again = open_clean(dir.path(), &aes);
        assert_eq!(again.get("receiver_1"), Some([8u8; 32]));
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn a_wrong_aes_key_fails_at_open_and_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        register_and_wait(&store, "r", [2u8; 32]).unwrap();
        register_and_wait(&store, "s", [3u8; 32]).unwrap();
        drop(store);
        let before = names(dir.path());
        let err = FileKeyStore::open(dir.path(), &[3u8; 32]).unwrap_err();
        assert!(
            matches!(err, OpenError::WrongKey { count: 2, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("opens with the configured AES key"),
            "{err}"
        );
        assert_eq!(names(dir.path()), before);
        // The right key still opens everything.
        assert_eq!(open_clean(dir.path(), &[1u8; 32]).len(), 2);
    }

    #[test]
    fn without_a_check_file_keys_that_all_fail_stop_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        register_and_wait(&store, "r", [2u8; 32]).unwrap();
        drop(store);
        fs::remove_file(dir.path().join(CHECK_FILE)).unwrap();
        assert!(matches!(
            FileKeyStore::open(dir.path(), &[3u8; 32]),
            Err(OpenError::WrongKey { count: 1, .. })
        ));
        assert!(dir.path().join("r.key").exists());
    }

    #[test]
    fn a_damaged_key_file_is_moved_aside_and_the_others_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let aes = [1u8; 32];
        let store = open_clean(dir.path(), &aes);
        register_and_wait(&store, "r1", [2u8; 32]).unwrap();
        register_and_wait(&store, "r2", [3u8; 32]).unwrap();
        register_and_wait(&store, "r3", [4u8; 32]).unwrap();
        drop(store);
        // r1: one bit flipped; r2: cut short.
        let r1 = dir.path().join("r1.key");
        let mut bytes = fs::read(&r1).unwrap();
        bytes[20] ^= 1;
        fs::write(&r1, &bytes).unwrap();
        let r2 = dir.path().join("r2.key");
        fs::write(&r2, b"short").unwrap();
        let (store, warnings) = FileKeyStore::open(dir.path(), &aes).unwrap();
        assert_eq!(store.get("r3"), Some([4u8; 32]));
        assert_eq!(store.get("r1"), None);
        assert_eq!(store.get("r2"), None);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        let paths: Vec<_> = warnings.iter().map(|w| w.path.clone()).collect();
        assert!(paths.contains(&r1) && paths.contains(&r2), "{paths:?}");
        assert!(warnings.iter().all(|w| w.message.contains("register")));
        let listed = names(dir.path());
        assert!(!r1.exists() && !r2.exists(), "{listed:?}");
        assert!(
            listed.iter().any(|n| n.starts_with("r1.key.corrupt-"))
                && listed.iter().any(|n| n.starts_with("r2.key.corrupt-")),
            "{listed:?}"
        );
        // The receiver registers again, and that sticks.
        register_and_wait(&store, "r1", [5u8; 32]).unwrap();
        drop(store);
        let again = open_clean(dir.path(), &aes);
        assert_eq!(again.get("r1"), Some([5u8; 32]));
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn a_damaged_check_file_is_written_again_when_keys_open() {
        let dir = tempfile::tempdir().unwrap();
        let aes = [1u8; 32];
        let store = open_clean(dir.path(), &aes);
        register_and_wait(&store, "r1", [2u8; 32]).unwrap();
        drop(store);
        fs::write(dir.path().join(CHECK_FILE), b"x").unwrap();
        let (store, warnings) = FileKeyStore::open(dir.path(), &aes).unwrap();
        assert_eq!(store.get("r1"), Some([2u8; 32]));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        drop(store);
        open_clean(dir.path(), &aes);
    }

    #[test]
    fn key_files_are_private_and_crash_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        register_and_wait(&store, "r1", [2u8; 32]).unwrap();
        drop(store);
        for name in ["r1.key", CHECK_FILE] {
            let mode = fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        fs::write(dir.path().join(".r9.key.Ab12Cd"), b"half").unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        assert_eq!(store.len(), 1);
        assert_eq!(names(dir.path()), [CHECK_FILE, "r1.key"]);
    }

    #[test]
    fn a_file_moved_to_another_client_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        register_and_wait(&store, "r1", [2u8; 32]).unwrap();
        register_and_wait(&store, "r3", [2u8; 32]).unwrap();
        drop(store);
        fs::rename(dir.path().join("r1.key"), dir.path().join("r2.key")).unwrap();
        let (store, warnings) = FileKeyStore::open(dir.path(), &[1u8; 32]).unwrap();
        assert_eq!(store.get("r2"), None);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, dir.path().join("r2.key"));
    }

    #[test]
    fn a_key_is_served_only_once_it_is_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
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
        let store = open_clean(&dir.path().join("keys"), &[1u8; 32]);
        let err = register_and_wait(&store, "../escape", [5u8; 32]).unwrap_err();
        assert_eq!(err, KeyStoreError::InvalidClientId("../escape".to_owned()));
        assert!(!dir.path().join("escape.key").exists());
    }

    #[test]
    fn registrations_queued_before_drop_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_clean(dir.path(), &[1u8; 32]);
        let pending: Vec<_> = (0..20)
            .map(|i| store.register(&format!("r{i}"), [i as u8; 32]))
            .collect();
        drop(store);
        for registration in pending {
            assert!(registration.blocking_recv().unwrap().is_ok());
        }
        let again = open_clean(dir.path(), &[1u8; 32]);
        assert_eq!(again.len(), 20);
    }
}
