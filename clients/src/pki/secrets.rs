//! The raw keys: receivers' X25519 pairs (a receiver's identity for senders) and
//! the broker's AES key (it opens the sealed key store). Both are kept once made;
//! checking happens before anything is written.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Serialize;

use super::files::{exists, kept, read_to_string, write_file};
use super::{PkiError, PkiFile};

/// What a run does with a receiver's X25519 pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PairPlan {
    /// Both files exist and match.
    Keep,
    /// The private key exists; its public key file is missing and is derived.
    DerivePublic([u8; 32]),
    /// Neither exists: a new pair.
    Create,
}

/// Which of a CN's X25519 files exist (for `list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum X25519Keys {
    /// Neither file.
    None,
    /// `{cn}_private.key` and `{cn}_public.key`: a receiver that can decrypt.
    Pair,
    /// The private key alone (the public key is derived on the next run).
    PrivateOnly,
    /// The public key alone: a sender's cached copy of a receiver elsewhere.
    PublicOnly,
}

impl X25519Keys {
    /// What is in `keys_dir` for `cn`.
    pub(super) fn of(keys_dir: &Path, cn: &str) -> Result<Self, PkiError> {
        let (private, public) = pair_paths(keys_dir, cn);
        Ok(match (exists(&private)?, exists(&public)?) {
            (true, true) => X25519Keys::Pair,
            (true, false) => X25519Keys::PrivateOnly,
            (false, true) => X25519Keys::PublicOnly,
            (false, false) => X25519Keys::None,
        })
    }

    /// A short word for tables.
    pub fn as_str(self) -> &'static str {
        match self {
            X25519Keys::None => "-",
            X25519Keys::Pair => "pair",
            X25519Keys::PrivateOnly => "private only",
            X25519Keys::PublicOnly => "public only",
        }
    }
}

/// `{keys_dir}/{cn}_private.key` and `{cn}_public.key`.
pub(super) fn pair_paths(keys_dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
    (
        crate::key_file::private_key_path(keys_dir, cn),
        crate::key_file::public_key_path(keys_dir, cn),
    )
}

/// Decides what to do with `cn`'s pair: an existing private key is kept and its
/// public key must match it; a public key without its private key is refused.
pub(super) fn plan_pair(keys_dir: &Path, cn: &str) -> Result<PairPlan, PkiError> {
    let (private, public) = pair_paths(keys_dir, cn);
    match (exists(&private)?, exists(&public)?) {
        (true, public_exists) => {
            let secret = crypto_box::SecretKey::from_bytes(read_key32(&private)?);
            let derived = secret.public_key().to_bytes();
            if !public_exists {
                return Ok(PairPlan::DerivePublic(derived));
            }
            if read_key32(&public)? != derived {
                return Err(PkiError::BadKeyFile {
                    path: public,
                    reason: format!(
                        "does not match the public key of {}; delete the wrong one",
                        private.display()
                    ),
                });
            }
            Ok(PairPlan::Keep)
        }
        (false, true) => Err(PkiError::OrphanPublicKey { public, private }),
        (false, false) => Ok(PairPlan::Create),
    }
}

/// Carries out a [`PairPlan`].
pub(super) fn write_pair(
    keys_dir: &Path,
    cn: &str,
    plan: &PairPlan,
    files: &mut Vec<PkiFile>,
) -> Result<(), PkiError> {
    let (private, public) = pair_paths(keys_dir, cn);
    match plan {
        PairPlan::Keep => {
            files.push(kept(&private, true));
            files.push(kept(&public, false));
        }
        PairPlan::DerivePublic(derived) => {
            files.push(kept(&private, true));
            files.push(write_file(&public, encode_line(derived).as_bytes(), false)?);
        }
        PairPlan::Create => {
            let mut bytes = [0u8; 32];
            OsRng.fill_bytes(&mut bytes);
            let secret = crypto_box::SecretKey::from_bytes(bytes);
            files.push(write_file(
                &private,
                encode_line(&secret.to_bytes()).as_bytes(),
                true,
            )?);
            files.push(write_file(
                &public,
                encode_line(secret.public_key().as_bytes()).as_bytes(),
                false,
            )?);
        }
    }
    Ok(())
}

/// Checks an existing AES key; returns whether one exists.
pub(super) fn check_aes_key(path: &Path) -> Result<bool, PkiError> {
    if exists(path)? {
        read_key32(path)?;
        Ok(true)
    } else {
        Ok(false)
    }
}

/// Writes the broker's 256-bit AES key unless one exists.
pub(super) fn write_aes_key(
    path: &Path,
    existing: bool,
    files: &mut Vec<PkiFile>,
) -> Result<(), PkiError> {
    if existing {
        files.push(kept(path, true));
    } else {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        files.push(write_file(path, encode_line(&key).as_bytes(), true)?);
    }
    Ok(())
}

/// Reads a file holding the standard padded base64 of exactly 32 bytes.
fn read_key32(path: &Path) -> Result<[u8; 32], PkiError> {
    let text = read_to_string(path)?;
    let bad = |reason: String| PkiError::BadKeyFile {
        path: path.to_owned(),
        reason,
    };
    let bytes = BASE64
        .decode(text.trim())
        .map_err(|e| bad(format!("not standard base64: {e}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| bad(format!("holds {} bytes, expected 32", bytes.len())))
}

/// Base64 of `bytes` followed by a newline, the on-disk form of every raw key.
fn encode_line(bytes: &[u8]) -> String {
    let mut line = BASE64.encode(bytes);
    line.push('\n');
    line
}
