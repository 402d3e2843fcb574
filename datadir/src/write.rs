//! Replacing a file whole: either the old content or the new one survives a
//! crash, never a mix.

use std::fs::{DirBuilder, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use atomic_write_file::unix::OpenOptionsExt as _;

/// Mode of key material: readable by the broker's user only, from the moment
/// the file exists.
pub const SECRET_MODE: u32 = 0o600;

/// Mode of every other file the broker makes in its data directory: its
/// user's alone too. Logs hold who sent what to whom (sender and receiver
/// ids, message ids, routing keys), `topology.json` names every owner, and
/// the lock file names the broker's pid: nothing there is for other users.
/// Set at creation, so the process umask can only take bits away from it,
/// never give any to the group or others.
pub const FILE_MODE: u32 = 0o600;

/// Mode of every directory the broker makes in its data directory (the
/// directory itself when it makes it, `queues/`, each queue's, `keys/`).
pub const DIR_MODE: u32 = 0o700;

/// Replaces `path` with `contents`, or leaves it as it was: a temporary file
/// in the same directory, created with `mode` (so a secret is never
/// world-readable, even briefly), written, fsynced, renamed over `path`, and
/// the directory fsynced so the rename survives a power cut.
///
/// The mode of a file being replaced is not kept: `mode` is what the new one
/// gets (minus the umask), so a secret that was once left readable is
/// tightened on its next write.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let mut options = atomic_write_file::OpenOptions::new();
    options.mode(mode);
    options.preserve_mode(false);
    options.preserve_owner(false);
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    // Commit fsyncs the file, renames it over `path` and fsyncs the directory.
    // An error before the commit removes the temporary file when `file`
    // drops; one during the commit leaves it, so it is removed here (only
    // the holder of the data directory's lock writes these files, so no
    // other writer's temporary file can be taken for ours).
    file.commit().inspect_err(|_| remove_temporaries(path))
}

/// The file a temporary name was made for: `.{name}.XXXXXX` (six letters or
/// digits) is how [`write_atomic`] names the file it writes before the
/// rename. A crash can leave one behind; it never holds the only copy of
/// anything.
pub fn temporary_target(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix('.')?;
    let (target, suffix) = rest.rsplit_once('.')?;
    (!target.is_empty() && suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(target)
}

/// Removes what [`write_atomic`] may have left of writes to `path`, best
/// effort: leftovers waste space, they are never read.
pub fn remove_temporaries(path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent_dir(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        if file_name.to_str().and_then(temporary_target) == Some(name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Creates the directory `path` and every missing parent with [`DIR_MODE`],
/// whatever the umask allows (it can only take bits away); one that exists
/// is left as it is.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Fsyncs the directory `dir`, so renames and removals in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path` (`.` for a bare file name): where its
/// temporaries live and which directory to fsync after a rename.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_secret_is_written_0600_over_a_readable_file_and_no_temp_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aes.key");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"new", SECRET_MODE).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("aes.key")]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("f");
        assert!(write_atomic(&path, b"x", FILE_MODE).is_err());
        let path = dir.path().join("f");
        write_atomic(&path, b"one", FILE_MODE).unwrap();
        // A directory cannot be replaced by a file: the rename fails and
        // the temporary file is cleaned up.
        let blocked = dir.path().join("d");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), b"").unwrap();
        assert!(write_atomic(&blocked, b"two", FILE_MODE).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn temporary_names_are_recognised() {
        assert_eq!(temporary_target(".r1.key.aB3dE9"), Some("r1.key"));
        assert_eq!(
            temporary_target(".topology.json.000000"),
            Some("topology.json")
        );
        assert_eq!(temporary_target("r1.key"), None);
        assert_eq!(temporary_target(".r1.key.tmp"), None);
        assert_eq!(temporary_target("..abcdef"), None);
    }

    #[test]
    fn leftover_temporaries_of_one_file_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        for name in [
            ".topology.json.aB3dE9",
            ".topology.json.prev.000000",
            "topology.json",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        remove_temporaries(&path);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".topology.json.prev.000000", "topology.json"]);
    }

    #[test]
    fn directories_are_made_for_the_owner_alone() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(d)), 0o700, "{d}");
        }
        // Again: nothing to do, no error.
        create_dir_all(&deep).unwrap();
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("f")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/a/f")), Path::new("/a"));
    }
}
