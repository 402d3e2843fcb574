//! Real mounts, driven with `std::fs` from the test thread (the filesystem is
//! served by its own thread) and, where the crash matters, from a child
//! process that is killed.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ciphermq_faultfs::{
    skip_requested, Durability, FaultErrno, FaultFs, FaultOps, MountOptions, WriteBudget,
};

/// A mount on a fresh temporary directory; `fs` is declared first so it is
/// unmounted before the directory is removed.
struct Mounted {
    fs: FaultFs,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn path(&self, rel: &str) -> PathBuf {
        self.fs.path().join(rel)
    }
}

fn mount_with(options: MountOptions) -> Option<Mounted> {
    if skip_requested() {
        println!("skipped: FUSE test (CIPHERMQ_SKIP_FUSE=1)");
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let fs = FaultFs::mount_with(dir.path(), options)
        .unwrap_or_else(|e| panic!("cannot mount the fault-injecting FUSE filesystem: {e}"));
    Some(Mounted { fs, _dir: dir })
}

fn mount() -> Option<Mounted> {
    mount_with(MountOptions::default())
}

fn sync_dir(path: &Path) {
    File::open(path)
        .and_then(|d| d.sync_all())
        .expect("fsync directory");
}

/// Creates `rel` with `content`, fsyncs it and its directory: fully durable.
fn durable_file(m: &Mounted, rel: &str, content: &[u8]) {
    let path = m.path(rel);
    let mut f = File::create(&path).expect("create");
    f.write_all(content).expect("write");
    f.sync_all().expect("fsync");
    sync_dir(path.parent().expect("parent"));
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fsynced_write_survives_a_power_cut() {
    let Some(m) = mount() else { return };
    durable_file(&m, "log", b"acknowledged");
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"acknowledged");
    let s = m.fs.stats();
    assert!(s.writes >= 1 && s.fsyncs >= 1 && s.fsyncdirs >= 1, "{s:?}");
    assert_eq!(s.power_cuts, 1);
}

#[test]
fn unsynced_writes_are_lost_on_a_power_cut() {
    let Some(m) = mount() else { return };
    durable_file(&m, "log", b"old content");
    let f = OpenOptions::new().write(true).open(m.path("log")).unwrap();
    f.write_all_at(b"NEW", 0).unwrap();
    f.write_all_at(b" and an unsynced tail", 11).unwrap();
    assert_eq!(
        fs::read(m.path("log")).unwrap(),
        b"NEW content and an unsynced tail"
    );
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"old content");
    // A handle from before the cut belongs to a machine that is gone.
    let err = f.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    // Same size, so nothing but the filesystem itself can tell the kernel
    // that the page it just read is stale.
    let page = vec![b'o'; 4096];
    durable_file(&m, "page", &page);
    fs::write(m.path("page"), vec![b'n'; 4096]).unwrap();
    assert!(fs::read(m.path("page")).unwrap() == vec![b'n'; 4096]);
    m.fs.power_cut();
    let got = fs::read(m.path("page")).unwrap();
    let head = String::from_utf8_lossy(&got[..8]);
    assert!(got == page, "stale page after the power cut: {head}...");
    // A truncate without fsync is undone too.
    let f = OpenOptions::new().write(true).open(m.path("log")).unwrap();
    f.set_len(3).unwrap();
    drop(f);
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"old content");
}

#[test]
fn a_new_file_needs_its_directory_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("data")).unwrap();
    sync_dir(m.fs.path());
    for name in ["named", "unnamed"] {
        let mut f = File::create(m.path(&format!("data/{name}"))).unwrap();
        f.write_all(b"payload").unwrap();
        f.sync_all().unwrap();
        if name == "named" {
            sync_dir(&m.path("data"));
        }
    }
    fs::create_dir(m.path("data/sub")).unwrap();
    m.fs.power_cut();
    assert_eq!(names(&m.path("data")), ["named"]);
    assert_eq!(fs::read(m.path("data/named")).unwrap(), b"payload");
}

#[test]
fn a_new_directory_is_lost_with_its_files_unless_its_parent_is_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("d")).unwrap();
    durable_file(&m, "d/f", b"x"); // syncs d, not the root
    m.fs.power_cut();
    assert!(names(m.fs.path()).is_empty());
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"y").unwrap();
    m.fs.make_all_durable();
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("d/f")).unwrap(), b"y");
}

#[test]
fn lenient_durability_commits_names_on_file_fsync() {
    let Some(m) = mount_with(MountOptions {
        durability: Durability::Lenient,
        ..MountOptions::default()
    }) else {
        return;
    };
    fs::create_dir(m.path("d")).unwrap();
    let mut f = File::create(m.path("d/f")).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_all().unwrap();
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("d/f")).unwrap(), b"x");
}

#[test]
fn rename_and_unlink_are_undone_without_a_directory_fsync() {
    let Some(m) = mount() else { return };
    durable_file(&m, "a.tmp", b"first");
    durable_file(&m, "gone", b"second");
    fs::rename(m.path("a.tmp"), m.path("a")).unwrap();
    fs::remove_file(m.path("gone")).unwrap();
    assert_eq!(names(m.fs.path()), ["a"]);
    m.fs.power_cut();
    assert_eq!(names(m.fs.path()), ["a.tmp", "gone"]);
    assert_eq!(fs::read(m.path("gone")).unwrap(), b"second");

    fs::rename(m.path("a.tmp"), m.path("a")).unwrap();
    sync_dir(m.fs.path());
    m.fs.power_cut();
    assert_eq!(names(m.fs.path()), ["a", "gone"]);
    assert_eq!(fs::read(m.path("a")).unwrap(), b"first");
}

#[test]
fn the_nth_write_fails_with_its_errno_and_changes_nothing() {
    let Some(m) = mount() else { return };
    let f = File::create(m.path("f")).unwrap();
    m.fs.fail_nth_write(2, FaultErrno::Eio);
    f.write_all_at(b"one", 0).unwrap();
    let err = f.write_all_at(b"TWO-and-longer", 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(fs::read(m.path("f")).unwrap(), b"one");
    f.write_all_at(b"three", 3).unwrap(); // one-shot: the next write works
    assert_eq!(fs::read(m.path("f")).unwrap(), b"onethree");

    m.fs.fail_nth_write(1, FaultErrno::Enospc);
    let err = f.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(m.fs.stats().injected_faults, 2);
}

#[test]
fn a_failed_fsync_drops_the_unsynced_changes() {
    let Some(m) = mount() else { return };
    durable_file(&m, "f", b"durable");
    let mut f = OpenOptions::new().append(true).open(m.path("f")).unwrap();
    f.write_all(b" pending").unwrap();
    m.fs.fail_nth_fsync(1, FaultErrno::Eio);
    let err = f.sync_data().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(fs::read(m.path("f")).unwrap(), b"durable");
    f.sync_data().unwrap();
}

#[test]
fn writes_fail_past_a_budget_until_cleared() {
    let Some(m) = mount() else { return };
    let f = File::create(m.path("f")).unwrap();
    m.fs.fail_writes_after(WriteBudget::Bytes(10), FaultErrno::Enospc);
    f.write_all_at(b"12345678", 0).unwrap();
    let err = f.write_all_at(b"abc", 8).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    f.write_all_at(b"90", 8).unwrap();
    m.fs.fail_writes_after(WriteBudget::Writes(1), FaultErrno::Eio);
    f.write_all_at(b"a", 0).unwrap();
    assert!(f.write_all_at(b"b", 0).is_err());
    assert!(f.write_all_at(b"c", 0).is_err());
    m.fs.clear_faults();
    f.write_all_at(b"d", 0).unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"d234567890");
}

fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail * st.f_frsize
}

#[test]
fn capacity_limits_writes_and_shows_in_statvfs() {
    let Some(m) = mount() else { return };
    // Sizes stay under 128 KiB per write(2): one FUSE request even on kernels
    // with a small max_write, so a refused write is refused whole.
    m.fs.set_capacity(Some(256 << 10));
    assert_eq!(free_bytes(m.fs.path()), 256 << 10);
    let f = File::create(m.path("a")).unwrap();
    f.write_all_at(&[7; 100 << 10], 0).unwrap();
    f.write_all_at(&[7; 100 << 10], 100 << 10).unwrap();
    assert_eq!(free_bytes(m.fs.path()), 56 << 10);
    // Growing past the capacity fails whole and leaves the file as it was.
    let g = File::create(m.path("b")).unwrap();
    let err = g.write_all_at(&[1; 100 << 10], 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(fs::metadata(m.path("b")).unwrap().len(), 0);
    // Overwriting in place needs no space.
    f.write_all_at(&[8; 4096], 0).unwrap();
    assert_eq!(m.fs.stats().capacity_rejections, 1);
    // Unsynced content counts, and deleting frees it.
    drop(f);
    fs::remove_file(m.path("a")).unwrap();
    assert_eq!(free_bytes(m.fs.path()), 256 << 10);
    g.write_all_at(&[1; 100 << 10], 0).unwrap();
    assert_eq!(m.fs.used_bytes(), 100 << 10);
}

#[test]
fn flipped_bits_are_read_back_and_survive_a_power_cut() {
    let Some(m) = mount() else { return };
    durable_file(&m, "seg", &[0u8; 64]);
    m.fs.flip_bit("seg", 10, 3).unwrap();
    let bytes = fs::read(m.path("seg")).unwrap();
    assert_eq!(bytes[10], 0b1000);
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("seg")).unwrap()[10], 0b1000);
    assert!(m.fs.flip_bit("seg", 64, 0).is_err());
    assert!(m.fs.flip_bit("nope", 0, 0).is_err());

    durable_file(&m, "other", &[0u8; 64]);
    let flips =
        m.fs.flip_random_bits(9, 5, |p| p == Path::new("other"))
            .unwrap();
    assert_eq!(flips.len(), 5);
    let mut expected = vec![0u8; 64];
    for flip in &flips {
        assert_eq!(flip.path, Path::new("other"));
        expected[flip.offset as usize] ^= 1 << flip.bit;
    }
    assert_eq!(fs::read(m.path("other")).unwrap(), expected);
}

#[test]
fn random_faults_are_deterministic_for_a_seed() {
    let Some(m) = mount() else { return };
    let f = File::create(m.path("f")).unwrap();
    let run = |seed| {
        m.fs.random_faults(seed, 0.3, FaultOps::Writes, FaultErrno::Eio);
        let failed: Vec<bool> = (0..100).map(|i| f.write_all_at(b"x", i).is_err()).collect();
        m.fs.clear_faults();
        failed
    };
    let first = run(42);
    assert_eq!(first, run(42));
    assert_ne!(first, run(43));
    let hits = first.iter().filter(|&&x| x).count();
    assert!((10..60).contains(&hits), "{hits} of 100 failed at p=0.3");
}

fn mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

#[test]
fn dropping_the_handle_unmounts() {
    let Some(m) = mount() else { return };
    let root = m.fs.path().to_path_buf();
    durable_file(&m, "f", b"x");
    assert!(mounted(&root));
    // Even with a file still open, the mountpoint is released.
    let open = File::open(m.path("f")).unwrap();
    let Mounted { fs, _dir } = m;
    drop(fs);
    assert!(!mounted(&root));
    assert!(fs::metadata(&root).unwrap().is_dir());
    assert!(names(&root).is_empty());
    drop(open);
}

#[test]
fn a_killed_process_loses_what_it_did_not_sync() {
    let Some(m) = mount() else { return };
    // The child syncs "durable" and the directory, then appends without a
    // sync and hangs, holding the file open, until it is killed.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("printf durable > log && sync log . && printf ' lost' >> log && echo ready && exec sleep 60")
        .current_dir(m.fs.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let mut ready = [0u8; 6];
    child.stdout.take().unwrap().read_exact(&mut ready).unwrap();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"durable lost");
    child.kill().unwrap();
    child.wait().unwrap();
    m.fs.power_cut();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"durable");
}

#[test]
fn faults_in_one_directory_leave_the_others_alone() {
    let Some(m) = mount() else { return };
    fs::create_dir_all(m.path("queues/a")).unwrap();
    fs::create_dir_all(m.path("queues/b")).unwrap();
    let mut a = File::create(m.path("queues/a/log")).unwrap();
    let mut b = File::create(m.path("queues/b/log")).unwrap();
    m.fs.fail_in_dir("b", FaultErrno::Eacces);
    a.write_all(b"fine").unwrap();
    a.sync_all().unwrap();
    let e = b.write_all(b"refused").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert_eq!(b.sync_all().unwrap_err().raw_os_error(), Some(libc::EACCES));
    m.fs.clear_faults();
    b.write_all(b"stored").unwrap();
    b.sync_all().unwrap();
    assert_eq!(fs::read(m.path("queues/b/log")).unwrap(), b"stored");
    assert_eq!(m.fs.stats().injected_faults, 2);
}
