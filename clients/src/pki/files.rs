//! File plumbing of the PKI: atomic writes with the right mode, directories,
//! and I/O errors that name the path.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{FileAction, PkiError, PkiFile};

/// File mode of private keys and secrets.
pub(super) const SECRET_MODE: u32 = 0o600;

/// File mode of certificates and public keys.
pub(super) const PUBLIC_MODE: u32 = 0o644;

/// Mode of the CA directory: only its owner may list or enter it.
pub(super) const PRIVATE_DIR_MODE: u32 = 0o700;

/// Written into a CA directory the tool creates, so a `git add` of a checkout
/// where the PKI was made never picks up the CA's key.
const CA_DIR_GITIGNORE: &str =
    "# Written by ciphermq-pki: the CA's private key never belongs in version control.\n*\n";

/// Writes `contents` to `path` atomically (temp file created with its final mode,
/// fsync, rename, directory fsync) with mode 0600 for secrets and 0644 otherwise.
pub(super) fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<PkiFile, PkiError> {
    let action = if exists(path)? {
        FileAction::Replaced
    } else {
        FileAction::Created
    };
    let mode = if secret { SECRET_MODE } else { PUBLIC_MODE };
    crate::key_file::replace_file(path, contents, mode).map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })?;
    Ok(PkiFile {
        path: path.to_owned(),
        action,
        secret,
    })
}

/// Removes a file the run made obsolete (the CA key of the old layout once a new CA
/// is written elsewhere).
pub(super) fn remove_file(path: &Path, secret: bool) -> Result<PkiFile, PkiError> {
    fs::remove_file(path).map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })?;
    Ok(PkiFile {
        path: path.to_owned(),
        action: FileAction::Removed,
        secret,
    })
}

/// `create_dir_all` with the path in the error.
pub(super) fn create_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|error| PkiError::Io {
        path: dir.to_owned(),
        error,
    })
}

/// Creates the CA directory with mode 0700 (its parents as usual) and a
/// `.gitignore` that ignores everything in it. An existing directory is left as
/// it is; a warning is returned if others may read it.
pub(super) fn create_ca_dir(
    dir: &Path,
    files: &mut Vec<PkiFile>,
) -> Result<Option<String>, PkiError> {
    let io_err = |error| PkiError::Io {
        path: dir.to_owned(),
        error,
    };
    if exists(dir)? {
        return loose_ca_dir_warning(dir);
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
        .map_err(io_err)?;
    // The process umask may have removed bits, never added any; set it exactly.
    fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE)).map_err(io_err)?;
    files.push(write_file(
        &dir.join(".gitignore"),
        CA_DIR_GITIGNORE.as_bytes(),
        false,
    )?);
    Ok(None)
}

/// A warning if others may enter the CA directory.
pub(super) fn loose_ca_dir_warning(dir: &Path) -> Result<Option<String>, PkiError> {
    let mode = fs::metadata(dir)
        .map_err(|error| PkiError::Io {
            path: dir.to_owned(),
            error,
        })?
        .permissions()
        .mode()
        & 0o777;
    Ok((mode & 0o077 != 0).then(|| {
        format!(
            "the CA directory {} has mode {mode:04o}: other users may reach the CA key; run `chmod 700 {}`",
            dir.display(),
            dir.display()
        )
    }))
}

/// A warning if a secret file may be read by others.
pub(super) fn loose_secret_warning(path: &Path) -> Result<Option<String>, PkiError> {
    let mode = fs::metadata(path)
        .map_err(|error| PkiError::Io {
            path: path.to_owned(),
            error,
        })?
        .permissions()
        .mode()
        & 0o777;
    Ok((mode & 0o077 != 0).then(|| {
        format!(
            "{} has mode {mode:04o}: other users may read it; run `chmod 600 {}`",
            path.display(),
            path.display()
        )
    }))
}

/// `Path::try_exists` with the path in the error (a permission problem is an error,
/// not "missing").
pub(super) fn exists(path: &Path) -> Result<bool, PkiError> {
    path.try_exists().map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })
}

/// `fs::read_to_string` with the path in the error.
pub(super) fn read_to_string(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })
}

/// The names of the regular files in `dir`, sorted; an absent directory has none.
pub(super) fn file_names(dir: &Path) -> Result<Vec<String>, PkiError> {
    let io_err = |error| PkiError::Io {
        path: dir.to_owned(),
        error,
    };
    if !exists(dir)? {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        if entry.file_type().map_err(io_err)?.is_file() {
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
    }
    names.sort();
    Ok(names)
}

/// `stem` plus `.ext`, even when the stem contains dots (`receiver.eu` →
/// `receiver.eu.crt`, where `Path::with_extension` would drop `.eu`).
pub(super) fn with_extension(stem: &Path, ext: &str) -> PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    PathBuf::from(name)
}

/// A report entry for a file left as it was.
pub(super) fn kept(path: &Path, secret: bool) -> PkiFile {
    PkiFile {
        path: path.to_owned(),
        action: FileAction::Kept,
        secret,
    }
}

/// Whether two directories are the same: the same path, or (when both exist) the
/// same directory on disk.
pub(super) fn same_dir(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
