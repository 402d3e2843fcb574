//! The shared directory's fencing, on a real disk: a holder fenced by a
//! later one can no longer acknowledge, whatever it does next, and the
//! later one reads exactly what it may have acknowledged.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use ciphermq_cluster::shared_storage::{SharedStorageError, SharedStore, Tenure, FENCED_FILE};

fn tenure(epoch: u64, incarnation: u64) -> Tenure {
    Tenure { epoch, incarnation }
}

/// Appends `bytes` to the log file at `path` through `file` and syncs it,
/// as a commit round does.
fn append(file: &File, bytes: &[u8]) {
    let at = file.metadata().unwrap().len();
    file.write_all_at(bytes, at).unwrap();
    file.sync_data().unwrap();
}

fn open_log(dir: &Path) -> File {
    std::fs::create_dir_all(dir).unwrap();
    OpenOptions::new()
        .create(true)
        .append(false)
        .write(true)
        .read(true)
        .truncate(false)
        .open(dir.join("00000000000000000001.log"))
        .unwrap()
}

#[test]
fn a_holder_fenced_by_a_later_one_can_no_longer_acknowledge_and_its_later_bytes_are_never_read() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    let old = store.create_epoch_dir("receiver_1", tenure(1, 7)).unwrap();
    let log = open_log(&old.queue_dir("receiver_1_queue"));
    append(&log, b"acked-1;");
    assert!(old.still_in_place().unwrap(), "nobody fenced it yet");

    let fenced = store.fence_older("receiver_1", tenure(2, 3)).unwrap();
    assert_eq!(fenced.len(), 1);
    assert_eq!(fenced[0].tenure(), tenure(1, 7));
    assert_eq!(fenced[0].queues(), vec!["receiver_1_queue".to_owned()]);

    // The old holder wakes: its open file still takes writes, but its
    // check after the fsync fails, so it acknowledges none of them.
    append(&log, b"never-acked;");
    assert!(!old.still_in_place().unwrap());
    // Its path-based opens fail: the directory is no longer there.
    assert!(File::open(
        old.queue_dir("receiver_1_queue")
            .join("00000000000000000001.log")
    )
    .is_err());

    let staging = tempfile::tempdir().unwrap();
    let copied = fenced[0].stage_into(&staging.path().join("in")).unwrap();
    assert_eq!(copied, 8);
    let staged = std::fs::read(
        staging
            .path()
            .join("in/receiver_1_queue/00000000000000000001.log"),
    )
    .unwrap();
    assert_eq!(staged, b"acked-1;", "only what the lengths cover is read");
}

#[test]
fn a_directory_made_again_under_the_fenced_name_is_not_taken_for_the_holders_own() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    let old = store.create_epoch_dir("receiver_1", tenure(1, 1)).unwrap();
    open_log(&old.queue_dir("q"));
    store.fence_older("receiver_1", tenure(2, 1)).unwrap();
    // A queue's first write makes its directory, and with it the epoch
    // directory's name again: a new inode, not the one made.
    let again = open_log(&old.queue_dir("q"));
    append(&again, b"written-after-the-fence;");
    assert!(old.path().is_dir());
    assert!(
        !old.still_in_place().unwrap(),
        "a directory made again at the old path must not pass the check"
    );
}

#[test]
fn a_stale_holder_cannot_make_or_fence_below_a_later_tenure() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    store.create_epoch_dir("receiver_1", tenure(3, 1)).unwrap();
    for result in [
        store
            .create_epoch_dir("receiver_1", tenure(2, 9))
            .map(|_| ()),
        store.fence_older("receiver_1", tenure(2, 9)).map(|_| ()),
    ] {
        match result {
            Err(SharedStorageError::Superseded { newer, mine, .. }) => {
                assert_eq!(newer, tenure(3, 1));
                assert_eq!(mine, tenure(2, 9));
            }
            other => panic!("expected Superseded, got {other:?}"),
        }
    }
    // Nothing of the later holder was touched.
    let tenures = store.tenures("receiver_1").unwrap();
    assert_eq!(tenures, vec![(tenure(3, 1), false)]);
    // Never over an existing directory of its own tenure either.
    assert!(store.create_epoch_dir("receiver_1", tenure(3, 1)).is_err());
}

#[test]
fn an_heir_killed_mid_adoption_leaves_both_copies_for_the_next_holder_in_tenure_order() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    let first = store.create_epoch_dir("receiver_1", tenure(1, 1)).unwrap();
    let first_log = open_log(&first.queue_dir("q"));
    append(&first_log, b"one;");
    // The second holder fences the first, records its lengths, starts its
    // own copy, and is killed before it removes the first.
    store.fence_older("receiver_1", tenure(2, 4)).unwrap();
    let second = store.create_epoch_dir("receiver_1", tenure(2, 4)).unwrap();
    append(&open_log(&second.queue_dir("q")), b"two;");
    // The first holder writes on through its open file meanwhile.
    append(&first_log, b"late;");

    let fenced = store.fence_older("receiver_1", tenure(3, 2)).unwrap();
    let order: Vec<Tenure> = fenced.iter().map(|f| f.tenure()).collect();
    assert_eq!(order, vec![tenure(1, 1), tenure(2, 4)], "oldest first");
    // The first record stands: the bytes written after it are not read.
    let first_len: u64 = fenced[0].lengths().values().sum();
    assert_eq!(first_len, 4);
    assert!(!second.still_in_place().unwrap());
    // Once both are stored again, they go.
    for f in fenced {
        f.remove().unwrap();
    }
    assert!(store.tenures("receiver_1").unwrap().is_empty());
}

#[test]
fn a_restart_in_the_same_epoch_fences_the_previous_incarnation() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    let before = store.create_epoch_dir("receiver_1", tenure(1, 1)).unwrap();
    append(&open_log(&before.queue_dir("q")), b"kept;");
    let fenced = store.fence_older("receiver_1", tenure(1, 2)).unwrap();
    assert_eq!(fenced.len(), 1);
    let now = store.create_epoch_dir("receiver_1", tenure(1, 2)).unwrap();
    assert!(now.still_in_place().unwrap());
    assert!(!before.still_in_place().unwrap());
}

#[test]
fn a_damaged_or_escaping_record_is_refused_naming_the_file() {
    let shared = tempfile::tempdir().unwrap();
    let store = SharedStore::open(shared.path()).unwrap();
    let old = store.create_epoch_dir("receiver_1", tenure(1, 1)).unwrap();
    open_log(&old.queue_dir("q"));
    let fenced = store.fence_older("receiver_1", tenure(2, 1)).unwrap();
    let record = fenced[0].path().join(FENCED_FILE);
    for text in [
        "garbage\n",
        "ciphermq fenced v1\nby x\n5 ../../etc/passwd\n",
        "ciphermq fenced v1\nby x\nfive q/log\n",
    ] {
        std::fs::write(&record, text).unwrap();
        match store.fence_older("receiver_1", tenure(2, 1)) {
            Err(e @ SharedStorageError::BadRecord { .. }) => {
                assert!(e.to_string().contains(FENCED_FILE), "{e}");
            }
            other => panic!("expected BadRecord, got {other:?}"),
        }
    }
}

#[test]
fn the_shared_directory_must_exist_and_be_a_directory() {
    let shared = tempfile::tempdir().unwrap();
    let missing = shared.path().join("not-mounted");
    let e = SharedStore::open(&missing).unwrap_err();
    assert!(e.to_string().contains("not-mounted"), "{e}");
    let file = shared.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let e = SharedStore::open(&file).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}
