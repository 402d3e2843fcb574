//! `ciphermq-broker --check-config`: what start-up would check, short of
//! binding a port or taking the data directory's lock, so that it can run
//! beside the broker it is about to restart (before `systemctl restart`,
//! or as `ExecStartPre=`) and prints nothing but its verdict.
//!
//! [`check`] goes on from a loaded config ([`Config::load`] has parsed it,
//! checked every value and that the TLS, password and AES key files exist):
//! the TLS material is loaded as the listener would load it (certificates
//! parse, the key matches the certificate, the CA can verify clients), and
//! the data directory (durable mode) must be a directory this process may
//! write, or one it may create. What would let the broker start but serve
//! badly is a warning: a certificate that expired or expires within
//! [`EXPIRY_WARNING`], less free disk than `storage.min_free_mb`, a JSON
//! log directory it cannot write, io_uring blocked here.
//!
//! Not checked: whether the ports are free (the broker's own port is in use
//! while it runs), whether another broker holds the data directory, what
//! the logs hold (recovery reads them), and PostgreSQL (not contacted).

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::{Config, ConfigError, StorageMode};
use crate::tls::material::TlsError;

/// A certificate that expires within this is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why the broker would not start with this config; names the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A value or a file named by the config is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The certificates or the key cannot serve mutual TLS.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A directory the broker must write cannot be used.
    #[error("{key}: {reason}")]
    Unusable {
        /// The config key naming it.
        key: &'static str,
        /// What is wrong, with the path.
        reason: String,
    },
}

/// Checks `config` as the module documentation says: `Ok` with the
/// warnings (each `key: what`), or why the broker would not start.
pub fn check(config: &Config) -> Result<Vec<String>, CheckError> {
    config.validate()?;
    config.validate_files()?;
    let mut warnings = Vec::new();
    // Everything the listener would load: certificate, key, CAs, CRLs.
    let material = crate::tls::material::load(&config.tls)?;
    for (key, path, expiry) in [
        (
            "tls.cert_path",
            &config.tls.cert_path,
            material.expiries.server,
        ),
        (
            "tls.ca_cert_path",
            &config.tls.ca_cert_path,
            material.expiries.ca,
        ),
    ] {
        let warning = expiry.and_then(|e| expiry_warning(key, path, e, SystemTime::now()));
        warnings.extend(warning);
    }
    if config.storage.mode == StorageMode::Durable {
        let dir = &config.storage.data_dir;
        check_data_dir(dir)?;
        let min_free = config.storage.min_free_mb.saturating_mul(1 << 20);
        let existing = nearest_existing(dir);
        if let Ok(free) = crate::runtime::sys::available_bytes(&existing) {
            if min_free > 0 && free < min_free {
                warnings.push(format!(
                    "storage.min_free_mb: {} has {} MiB free, below the {} MiB kept free: \
                     publishes would be refused with disk_full",
                    existing.display(),
                    free >> 20,
                    config.storage.min_free_mb
                ));
            }
        }
    }
    if config.logging.json_files {
        if let Err(reason) = writable_or_creatable(&config.logging.dir) {
            warnings.push(format!(
                "logging.dir: {reason}: the broker would run without its JSON log files"
            ));
        }
    }
    if let Err(e) = crate::runtime::sys::probe_io_uring() {
        warnings.push(format!("the broker cannot start in this environment: {e}"));
    }
    Ok(warnings)
}

/// A warning for a certificate in `path` that expires at `expiry` (Unix
/// seconds), when it has expired or will within [`EXPIRY_WARNING`].
fn expiry_warning(key: &str, path: &Path, expiry: i64, now: SystemTime) -> Option<String> {
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs() as i64;
    let days = |secs: i64| secs / (24 * 3600);
    if expiry <= now {
        Some(format!(
            "{key}: a certificate in {} expired {} day(s) ago: clients will refuse it",
            path.display(),
            days(now - expiry)
        ))
    } else if expiry - now < EXPIRY_WARNING.as_secs() as i64 {
        Some(format!(
            "{key}: a certificate in {} expires in {} day(s)",
            path.display(),
            days(expiry - now)
        ))
    } else {
        None
    }
}

/// The data directory must be a directory this process may write (with
/// its `queues/` and `keys/` when present, and readable metadata files), or
/// not exist yet under a directory it may write (start-up creates it).
fn check_data_dir(dir: &Path) -> Result<(), CheckError> {
    let unusable = |reason: String| CheckError::Unusable {
        key: "storage.data_dir",
        reason,
    };
    match fs::metadata(dir) {
        // Not there, or a part of the path is a file: start-up would try
        // to create it.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return writable_or_creatable(dir).map_err(unusable);
        }
        Err(e) => return Err(unusable(format!("cannot access {}: {e}", dir.display()))),
        Ok(meta) if !meta.is_dir() => {
            return Err(unusable(format!("{} is not a directory", dir.display())));
        }
        Ok(_) => writable(dir).map_err(unusable)?,
    }
    for sub in ["queues", "keys"] {
        let path = dir.join(sub);
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => writable(&path).map_err(unusable)?,
            Ok(_) => return Err(unusable(format!("{} is not a directory", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(unusable(format!("cannot access {}: {e}", path.display()))),
        }
    }
    for file in ["topology.json", "dedup.key", "aes.key"] {
        let path = dir.join(file);
        match fs::File::open(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(unusable(format!("cannot read {}: {e}", path.display()))),
        }
    }
    Ok(())
}

/// `dir` may be written, or created: its nearest existing ancestor is a
/// directory that may be written.
fn writable_or_creatable(dir: &Path) -> Result<(), String> {
    let existing = nearest_existing(dir);
    match fs::metadata(&existing) {
        Ok(meta) if meta.is_dir() => writable(&existing),
        Ok(_) => Err(format!(
            "cannot create {}: {} is not a directory",
            dir.display(),
            existing.display()
        )),
        Err(e) => Err(format!("cannot access {}: {e}", existing.display())),
    }
}

/// `dir`, or its nearest ancestor that exists (`.` for a relative path
/// none of whose parts exists).
fn nearest_existing(dir: &Path) -> std::path::PathBuf {
    let mut path = dir;
    loop {
        if path.as_os_str().is_empty() {
            return Path::new(".").to_path_buf();
        }
        if fs::symlink_metadata(path).is_ok() {
            return path.to_path_buf();
        }
        match path.parent() {
            Some(parent) => path = parent,
            None => return path.to_path_buf(),
        }
    }
}

fn writable(dir: &Path) -> Result<(), String> {
    crate::runtime::sys::check_dir_writable(dir)
        .map_err(|e| format!("cannot write in {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_warned_about_a_month_ahead_and_after() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let at = |days: i64| 1_000_000_000 + days * 24 * 3600;
        let path = Path::new("certs/server.crt");
        assert_eq!(expiry_warning("tls.cert_path", path, at(31), now), None);
        let soon = expiry_warning("tls.cert_path", path, at(3), now).unwrap();
        assert_eq!(
            soon,
            "tls.cert_path: a certificate in certs/server.crt expires in 3 day(s)"
        );
        let gone = expiry_warning("tls.ca_cert_path", path, at(-2), now).unwrap();
        assert!(
            gone.starts_with(
                "tls.ca_cert_path: a certificate in certs/server.crt expired 2 day(s) ago"
            ),
            "{gone}"
        );
    }

    #[test]
    fn a_data_dir_is_a_writable_directory_or_can_be_made() {
        let dir = tempfile::tempdir().unwrap();
        check_data_dir(dir.path()).unwrap();
        check_data_dir(&dir.path().join("new/deeper")).unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "x").unwrap();
        let e = check_data_dir(&file).unwrap_err().to_string();
        assert!(
            e.starts_with("storage.data_dir: ") && e.ends_with("is not a directory"),
            "{e}"
        );
        let e = check_data_dir(&file.join("data")).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
        fs::create_dir(dir.path().join("d")).unwrap();
        fs::write(dir.path().join("d/queues"), "x").unwrap();
        let e = check_data_dir(&dir.path().join("d"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("queues is not a directory"), "{e}");
    }

    #[test]
    fn a_relative_path_with_no_existing_part_starts_from_the_working_directory() {
        assert_eq!(
            nearest_existing(Path::new("no-such-dir-here/data")),
            Path::new(".")
        );
    }
}
