//! Damaged files are kept, not deleted.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::write::{parent_dir, sync_dir};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Moves a damaged file out of the way, to `{path}.corrupt-{unix-ms}` in the
/// same directory (with a `-N` suffix should that name exist), and makes the
/// move durable. Returns the new path, for the warning that names it.
///
/// Damaged files are kept rather than deleted: they may still hold what a
/// person can recover, and they show what went wrong.
pub fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let stem = format!("{name}.corrupt-{}", unix_ms());
    let dir = parent_dir(path);
    let mut target = dir.join(&stem);
    let mut n = 1u32;
    while target.symlink_metadata().is_ok() {
        target = dir.join(format!("{stem}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &target)?;
    sync_dir(dir)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_aside_files_never_overwrite_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        std::fs::write(&path, b"first").unwrap();
        let a = move_aside(&path).unwrap();
        std::fs::write(&path, b"second").unwrap();
        let b = move_aside(&path).unwrap();
        assert_ne!(a, b);
        assert!(!path.exists());
        assert_eq!(std::fs::read(&a).unwrap(), b"first");
        assert_eq!(std::fs::read(&b).unwrap(), b"second");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("topology.json.corrupt-"), "{name}");
    }

    #[test]
    fn a_missing_file_is_an_error_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(move_aside(&dir.path().join("absent")).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
