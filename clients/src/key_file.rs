//! X25519 key files as `ciphermq-pki` writes them: `keys/{cn}_private.key` and
//! `keys/{cn}_public.key`, each one line of standard padded base64 of 32 bytes.
//!
//! Receivers read their private key; senders cache receivers' public keys in the
//! same form (`keys/<receiver_id>_public.key`) so that a key the broker no longer
//! holds (its key store is in memory in this build) can still be used. Writes are
//! atomic (temporary file, fsync, rename, directory fsync) and private keys are
//! created with mode 0600, so a crash never leaves half a key.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::crypto::{self, CryptoError, PublicKey, SecretKey};

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("cannot access key file {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// The file does not hold the base64 of 32 bytes.
    #[error("key file {} is not a key: {error} (expected one line of standard base64 of 32 bytes, as ciphermq-pki writes)", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: CryptoError,
    },
}

/// The file name `ciphermq-pki` gives `cn`'s private key inside a keys directory.
pub fn private_key_path(keys_dir: &Path, cn: &str) -> PathBuf {
    keys_dir.join(format!("{cn}_private.key"))
}

/// The file name of `cn`'s public key inside a keys directory (written by
/// `ciphermq-pki` for receivers, and by senders as their cache).
pub fn public_key_path(keys_dir: &Path, cn: &str) -> PathBuf {
    keys_dir.join(format!("{cn}_public.key"))
}

/// Reads a receiver's X25519 private key.
pub fn read_secret_key(path: &Path) -> Result<SecretKey, KeyFileError> {
    let text = Zeroizing::new(read(path)?);
    let bytes = Zeroizing::new(crypto::key32_from_base64("private key", &text).map_err(
        |error| KeyFileError::Malformed {
            path: path.to_owned(),
            error,
        },
    )?);
    Ok(SecretKey::from_bytes(*bytes))
}

/// Reads an X25519 public key.
pub fn read_public_key(path: &Path) -> Result<PublicKey, KeyFileError> {
    let text = read(path)?;
    crypto::public_key_from_base64(&text).map_err(|error| KeyFileError::Malformed {
        path: path.to_owned(),
        error,
    })
}

/// Writes a public key atomically (mode 0644), replacing any previous one.
pub fn write_public_key(path: &Path, key: &PublicKey) -> Result<(), KeyFileError> {
    let mut line = crypto::public_key_to_base64(key);
    line.push('\n');
    write_atomic(path, line.as_bytes(), 0o644)
}

/// Writes a private key atomically with mode 0600, replacing any previous one (for
/// tests and tools; `ciphermq-pki` is the usual way to make one).
pub fn write_secret_key(path: &Path, key: &SecretKey) -> Result<(), KeyFileError> {
    let bytes = Zeroizing::new(key.to_bytes());
    let line = Zeroizing::new(base64_line(bytes.as_ref()));
    write_atomic(path, line.as_bytes(), 0o600)
}

/// Standard padded base64 and a newline.
fn base64_line(bytes: &[u8]) -> String {
    use base64::Engine as _;
    let mut line = base64::engine::general_purpose::STANDARD.encode(bytes);
    line.push('\n');
    line
}

/// The whole file as text.
fn read(path: &Path) -> Result<String, KeyFileError> {
    fs::read_to_string(path).map_err(|error| KeyFileError::Io {
        path: path.to_owned(),
        error,
    })
}

/// Writes a key file atomically with the error naming it; the parent
/// directory is created if missing.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), KeyFileError> {
    replace_file(path, contents, mode).map_err(|error| KeyFileError::Io {
        path: path.to_owned(),
        error,
    })
}

/// Replaces `path` with `contents` or leaves it as it was, for every file the
/// client tools write, through the data directory's one atomic writer
/// (temporary file created with `mode`, fsynced, renamed, directory
/// fsynced); the parent directory is created if missing.
pub(crate) fn replace_file(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    ciphermq_datadir::write_atomic(path, contents, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trips_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sk = crypto::generate_secret_key();
        let sk_path = private_key_path(dir.path(), "receiver_1");
        let pk_path = public_key_path(dir.path(), "receiver_1");
        write_secret_key(&sk_path, &sk).unwrap();
        write_public_key(&pk_path, &sk.public_key()).unwrap();
        assert_eq!(read_secret_key(&sk_path).unwrap(), sk);
        assert_eq!(read_public_key(&pk_path).unwrap(), sk.public_key());
        let mode = fs::metadata(&sk_path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Replacing works and leaves no temporary file behind.
        write_public_key(&pk_path, &sk.public_key()).unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[cfg(feature = "tools")]
    #[test]
    fn reads_what_ciphermq_pki_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts =
            crate::pki::PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
        opts.client_cns = vec!["receiver_1".into()];
        opts.receiver_cns = vec!["receiver_1".into()];
        crate::pki::generate(&opts).unwrap();
        let sk = read_secret_key(&private_key_path(&opts.keys_dir, "receiver_1")).unwrap();
        let pk = read_public_key(&public_key_path(&opts.keys_dir, "receiver_1")).unwrap();
        assert_eq!(sk.public_key(), pk);
    }

    #[test]
    fn malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.key");
        fs::write(&path, "QUFB\n").unwrap();
        let err = read_public_key(&path).unwrap_err();
        assert!(err.to_string().contains("bad.key"), "{err}");
        assert!(matches!(err, KeyFileError::Malformed { .. }));
        let err = read_secret_key(&dir.path().join("missing.key")).unwrap_err();
        assert!(matches!(err, KeyFileError::Io { .. }));
    }
}
