//! `{data_dir}/topology.json`: the queues (name, owner) and exchanges (name,
//! type, bindings) a broker keeps between runs, read at start and written
//! by the topology store's saver thread through [`TopologyFile`], never on a
//! shard.
//!
//! Each save replaces the file atomically (see
//! [`ciphermq_datadir::write_atomic`]) and first keeps the version it
//! replaces as `topology.json.prev`, so a damaged or lost `topology.json`
//! costs at most the last change, not every queue: [`load`] falls back to
//! that copy, restores the file from it, keeps the damaged one as
//! `topology.json.corrupt-<unix-ms>` and says so. When neither can be used
//! the start stops ([`TopologyFileError::NoUsableCopy`]), naming both.
//!
//! The format is plain JSON, pretty-printed, sorted by name:
//! `{"queues": [{"name", "owner"}], "exchanges": [{"name", "kind", "owner"?,
//! "bindings": [{"queue", "key", "bound_by"?}]}], "deleting"?: ["<queue>"]}`.
//! Placement is not saved: it is recomputed from each owner for the shard
//! count of the run. `deleting` names queues `delete_queue` removed whose
//! log directory may still be on disk (absent when there are none): the
//! start removes those directories rather than adopting them, so a deleted
//! queue never comes back after a crash.
//!
//! An exchange's `owner` is the receiver CN that declared it first, absent
//! when no receiver owns it; a binding's `bound_by` is `"admin"` or
//! `{"receiver": "<cn>"}`. Files written before these were recorded lack
//! them and load as they are: their exchanges belong to no receiver, and
//! their bindings are judged by the broker's binding rule as bindings whose
//! maker is not known (see the ACL).

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};

use ciphermq_datadir::{self as data_dir, DataDirLock, StorageWarning};
use ciphermq_proto::ExchangeKind;
use ciphermq_shard::topology::Actor;
use ciphermq_shard::{Topology, TopologyChange, TopologySink};

/// The topology file's name inside the data directory.
pub(crate) const FILE_NAME: &str = "topology.json";

/// Why the saved topology could not be loaded; the start stops on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum TopologyFileError {
    /// A file could not be read or written (permissions, I/O): not something
    /// to work around by starting from another copy.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Neither `topology.json` nor its previous copy could be used: starting
    /// empty would silently drop every queue, so the start stops.
    #[error(
        "{}: {current}; {}: {previous}. Restore either file from a backup; or, to start \
         with an empty topology, move both out of the data directory (queue directories are \
         then adopted by the receiver CN that owns their name, and the start stops on any \
         other)",
        .path.display(),
        .prev_path.display()
    )]
    NoUsableCopy {
        /// `topology.json`.
        path: PathBuf,
        /// What is wrong with it.
        current: String,
        /// `topology.json.prev`.
        prev_path: PathBuf,
        /// What is wrong with that one.
        previous: String,
    },
}

/// The store's way to `topology.json`: the [`TopologySink`] the broker
/// hands the topology store, which calls it on its saver thread.
///
/// It holds the data directory's lock: the store keeps its sink until the
/// last shard has stopped and nothing can save any more, so that is how long
/// the directory stays locked.
#[derive(Debug)]
pub(crate) struct TopologyFile {
    path: PathBuf,
    _lock: DataDirLock,
}

impl TopologyFile {
    /// Saves to `path` (as [`save`] does), keeping `lock` for as long as it
    /// lives.
    pub(crate) fn new(path: PathBuf, lock: DataDirLock) -> TopologyFile {
        TopologyFile { path, _lock: lock }
    }

    /// `topology.json`.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl TopologySink for TopologyFile {
    fn save(&self, topology: &Topology) -> io::Result<()> {
        save(&self.path, topology)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))
    }
}

/// `topology.json.prev`, beside `path`.
pub(crate) fn prev_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".prev");
    PathBuf::from(name)
}

/// Loads the topology saved at `path` (empty if neither it nor its previous
/// copy exists), placing queues over `shards` shards, so a changed shard
/// count moves queues with their owners.
///
/// A missing or damaged `topology.json` is not fatal while
/// `topology.json.prev` is good: the load uses that copy, restores
/// `topology.json` from it, keeps the damaged file as
/// `topology.json.corrupt-<unix-ms>`, and returns a warning saying so (also
/// logged). When neither can be used it fails with
/// [`TopologyFileError::NoUsableCopy`], naming both files and moving nothing.
pub(crate) fn load(
    path: &Path,
    shards: usize,
) -> Result<(Topology, Vec<StorageWarning>), TopologyFileError> {
    let prev_path = prev_path(path);
    let fatal = |p: &Path, source: io::Error| TopologyFileError::Io {
        path: p.to_owned(),
        source,
    };
    let no_usable = |current: String, previous: String| TopologyFileError::NoUsableCopy {
        path: path.to_owned(),
        current,
        prev_path: prev_path.clone(),
        previous,
    };
    let mut warnings = Vec::new();
    // What a crash during a save may have left; never read.
    data_dir::remove_temporaries(path);
    data_dir::remove_temporaries(&prev_path);
    let loaded = match read(path, shards) {
        Ok(Some((t, _))) => t,
        Ok(None) => match read(&prev_path, shards) {
            Ok(None) => Topology::empty(shards),
            Ok(Some((t, bytes))) => {
                data_dir::write_atomic(path, &bytes, data_dir::FILE_MODE)
                    .map_err(|e| fatal(path, e))?;
                warnings.push(StorageWarning::new(
                    path,
                    format!(
                        "was missing; started from {} and restored it from there (the last \
                         topology change saved before the file was lost may be missing: \
                         declare it again)",
                        prev_path.display()
                    ),
                ));
                t
            }
            Err(Read::Damaged(why)) => {
                return Err(no_usable("missing".into(), format!("unusable: {why}")))
            }
            Err(Read::Io(e)) => return Err(fatal(&prev_path, e)),
        },
        Err(Read::Damaged(why)) => match read(&prev_path, shards) {
            Ok(Some((t, bytes))) => {
                let aside = data_dir::move_aside(path).map_err(|e| fatal(path, e))?;
                data_dir::write_atomic(path, &bytes, data_dir::FILE_MODE)
                    .map_err(|e| fatal(path, e))?;
                warnings.push(StorageWarning::new(
                    path,
                    format!(
                        "unusable ({why}); kept as {} and started from {} (the last \
                         topology change saved before the damage may be missing: declare \
                         it again)",
                        aside.display(),
                        prev_path.display()
                    ),
                ));
                t
            }
            Ok(None) => return Err(no_usable(format!("unusable: {why}"), "missing".into())),
            Err(Read::Damaged(prev_why)) => {
                return Err(no_usable(
                    format!("unusable: {why}"),
                    format!("unusable: {prev_why}"),
                ))
            }
            Err(Read::Io(e)) => return Err(fatal(&prev_path, e)),
        },
        Err(Read::Io(e)) => return Err(fatal(path, e)),
    };
    for w in &warnings {
        tracing::warn!(path = %w.path.display(), "{}", w.message);
    }
    Ok((loaded, warnings))
}

/// Writes `t` to `path` atomically (see [`ciphermq_datadir::write_atomic`]),
/// first keeping the version it replaces as `topology.json.prev`.
///
/// The previous version is kept by a hard link, so it costs no copy: it is
/// the file last written durably (or validated by [`load`]). The link is
/// renamed into place before the new file is, and the directory fsync that
/// makes the new file durable covers both renames; whatever a crash keeps,
/// both names hold a good topology.
pub(crate) fn save(path: &Path, t: &Topology) -> io::Result<()> {
    let mut queues: Vec<SavedQueue> = t
        .queues()
        .map(|q| SavedQueue {
            name: q.name.to_string(),
            owner: q.owner.to_string(),
        })
        .collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    let mut exchanges: Vec<SavedExchange> = t
        .exchanges()
        .map(|(name, ex)| SavedExchange {
            name: name.to_owned(),
            kind: ex.kind().as_str().to_owned(),
            owner: t.exchange_owner(name).map(str::to_owned),
            bindings: ex
                .bindings()
                .map(|(k, target)| SavedBinding {
                    queue: target.queue.to_string(),
                    key: k.to_owned(),
                    bound_by: t.binder(name, k, &target.queue).map(SavedActor::from),
                })
                .collect(),
        })
        .collect();
    exchanges.sort_by(|a, b| a.name.cmp(&b.name));
    let deleting = t.deleting().into_iter().map(str::to_owned).collect();
    let bytes = serde_json::to_vec_pretty(&SavedTopology {
        queues,
        exchanges,
        deleting,
    })
    .map_err(io::Error::other)?;
    keep_previous(path)?;
    data_dir::write_atomic(path, &bytes, data_dir::FILE_MODE)
}

/// Makes `topology.json.prev` the current `topology.json` (if there is one):
/// a hard link under a temporary name, renamed over the old `.prev`. Where
/// the file system has no hard links, a copy written atomically instead.
fn keep_previous(path: &Path) -> io::Result<()> {
    let prev = prev_path(path);
    let dir = data_dir::parent_dir(path);
    let tmp = dir.join(".topology.json.prev.tmp");
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match std::fs::hard_link(path, &tmp) {
        Ok(()) => std::fs::rename(&tmp, &prev),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => match std::fs::read(path) {
            Ok(bytes) => data_dir::write_atomic(&prev, &bytes, data_dir::FILE_MODE),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        },
    }
}

/// The saved form of the topology.
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedTopology {
    queues: Vec<SavedQueue>,
    exchanges: Vec<SavedExchange>,
    /// Deleted queues whose log directories may remain; absent when none
    /// (and in older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deleting: Vec<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedQueue {
    name: String,
    owner: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedExchange {
    name: String,
    kind: String,
    /// The receiver owning it; absent when none does (and in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    bindings: Vec<SavedBinding>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedBinding {
    queue: String,
    key: String,
    /// Who made it; absent when that is not known (older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bound_by: Option<SavedActor>,
}

/// [`Actor`] as saved: `"admin"` or `{"receiver": "<cn>"}`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum SavedActor {
    Admin,
    Receiver(String),
}

impl From<&Actor> for SavedActor {
    fn from(a: &Actor) -> SavedActor {
        match a {
            Actor::Admin => SavedActor::Admin,
            Actor::Receiver(cn) => SavedActor::Receiver(cn.to_string()),
        }
    }
}

/// Why a saved topology could not be read.
enum Read {
    /// The file could not be read (permissions, I/O): not something to work
    /// around by starting from another copy.
    Io(io::Error),
    /// The file was read but is not a topology this broker wrote.
    Damaged(String),
}

/// Reads and validates the topology at `path`: `None` when there is no file,
/// else the topology with the bytes it came from.
fn read(path: &Path, shards: usize) -> Result<Option<(Topology, Vec<u8>)>, Read> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Read::Io(e)),
    };
    let saved: SavedTopology = serde_json::from_slice(&bytes)
        .map_err(|e| Read::Damaged(format!("not a saved topology: {e}")))?;
    let t = validate(saved, shards).map_err(Read::Damaged)?;
    Ok(Some((t, bytes)))
}

/// Whether `name` can be a queue's directory under `queues/`: one plain path
/// component, so a damaged file cannot point recovery outside the data
/// directory.
fn is_queue_dir_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Builds the topology a saved file describes, refusing what the broker
/// never writes (a name that is not a plain file name, an empty owner or
/// binder, a name twice, an unknown exchange type). A binding to a queue the
/// file does not list is dropped, as the broker never routes to one.
fn validate(saved: SavedTopology, shards: usize) -> Result<Topology, String> {
    fn apply(t: &mut Topology, change: TopologyChange) -> Result<bool, String> {
        t.apply(&change)
            .map_err(|e| format!("cannot be rebuilt: {e}"))
    }
    let mut t = Topology::empty(shards);
    for name in &saved.deleting {
        if !is_queue_dir_name(name) {
            return Err(format!("deleted queue name {name:?} is not a valid name"));
        }
        if saved.queues.iter().any(|q| q.name == *name) {
            return Err(format!(
                "queue {name} is listed as both declared and deleted"
            ));
        }
        t.mark_deleting(name);
    }
    for q in saved.queues {
        if !is_queue_dir_name(&q.name) {
            return Err(format!("queue name {:?} is not a valid name", q.name));
        }
        if q.owner.is_empty() {
            return Err(format!("queue {} has no owner", q.name));
        }
        if t.queue(&q.name).is_some() {
            return Err(format!("queue {} is listed twice", q.name));
        }
        apply(
            &mut t,
            TopologyChange::DeclareQueue {
                name: q.name,
                owner: q.owner,
                by: None,
            },
        )?;
    }
    let mut exchanges = HashSet::new();
    for e in saved.exchanges {
        if e.name.is_empty() {
            return Err("an exchange has an empty name".into());
        }
        let kind = ExchangeKind::parse(&e.kind)
            .ok_or_else(|| format!("exchange {} has unknown type {}", e.name, e.kind))?;
        if !exchanges.insert(e.name.clone()) {
            return Err(format!("exchange {} is listed twice", e.name));
        }
        if e.owner.as_deref() == Some("") {
            return Err(format!("exchange {} has an empty owner", e.name));
        }
        apply(
            &mut t,
            TopologyChange::DeclareExchange {
                name: e.name.clone(),
                kind,
                owner: e.owner,
            },
        )?;
        for b in e.bindings {
            let by = match b.bound_by {
                None => None,
                Some(SavedActor::Admin) => Some(Actor::Admin),
                Some(SavedActor::Receiver(cn)) if cn.is_empty() => {
                    return Err(format!(
                        "a binding of exchange {} has an empty receiver",
                        e.name
                    ))
                }
                Some(SavedActor::Receiver(cn)) => Some(Actor::receiver(&cn)),
            };
            if t.queue(&b.queue).is_some() {
                apply(
                    &mut t,
                    TopologyChange::Bind {
                        queue: b.queue,
                        exchange: e.name.clone(),
                        key: b.key,
                        by,
                    },
                )?;
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciphermq_shard::{shard_of, TopologyStore};

    fn queue(name: &str, owner: &str) -> TopologyChange {
        TopologyChange::DeclareQueue {
            name: name.into(),
            owner: owner.into(),
            by: None,
        }
    }

    /// `dir/topology.json` after two saves: queue `q1`, then `q2`.
    fn two_saves(dir: &Path) -> PathBuf {
        let path = dir.join(FILE_NAME);
        let (mut t, _) = load(&path, 1).unwrap();
        t.apply(&queue("q1", "r")).unwrap();
        save(&path, &t).unwrap();
        t.apply(&queue("q2", "r")).unwrap();
        save(&path, &t).unwrap();
        path
    }

    fn queue_names(t: &Topology) -> Vec<String> {
        let mut names: Vec<String> = t.queues().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    fn corrupt_copies(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("topology.json.corrupt-"))
            .collect()
    }

    fn wait<T>(mut p: ciphermq_shard::pending::Pending<T>) -> T {
        for _ in 0..2000 {
            if let Some(v) = p.try_take() {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("the saver never answered");
    }

    #[test]
    fn a_store_saves_clients_changes_to_the_file_before_answering() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let (loaded, _) = load(&path, 1).unwrap();
        let store =
            TopologyStore::persisted(loaded, TopologyFile::new(path.clone(), lock)).unwrap();
        let changes = [
            queue("q", "r"),
            TopologyChange::DeclareExchange {
                name: "ex".into(),
                kind: ExchangeKind::Direct,
                owner: None,
            },
            TopologyChange::Bind {
                queue: "q".into(),
                exchange: "ex".into(),
                key: "k".into(),
                by: Some(Actor::Admin),
            },
        ];
        let pending: Vec<_> = changes.into_iter().map(|c| store.submit(c)).collect();
        for p in pending {
            assert_eq!(wait(p), Ok(()));
        }
        let saved = std::fs::read_to_string(&path).unwrap();
        assert!(
            saved.contains("\"q\"") && saved.contains("\"k\""),
            "{saved}"
        );
        // The lock lives with the store's sink, and goes with it.
        let lock_file = std::fs::canonicalize(dir.path()).unwrap().join("lock");
        let other = std::fs::File::open(&lock_file).unwrap();
        assert!(other.try_lock().is_err(), "locked while the store lives");
        drop(store);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while other.try_lock().is_err() {
            assert!(std::time::Instant::now() < deadline, "never unlocked");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_failed_save_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let path = dir.path().join("gone").join(FILE_NAME);
        let file = TopologyFile::new(path.clone(), lock);
        assert_eq!(file.path(), path);
        let err = TopologySink::save(&file, &Topology::empty(1)).unwrap_err();
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }

    #[test]
    fn survives_a_reload_with_another_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut t = Topology::empty(2);
        t.apply(&queue("receiver_1_queue", "receiver_1")).unwrap();
        t.apply(&TopologyChange::DeclareExchange {
            name: "ex".into(),
            kind: ExchangeKind::Topic,
            owner: Some("receiver_1".into()),
        })
        .unwrap();
        t.apply(&TopologyChange::Bind {
            queue: "receiver_1_queue".into(),
            exchange: "ex".into(),
            key: "receiver_1.#".into(),
            by: Some(Actor::receiver("receiver_1")),
        })
        .unwrap();
        save(&path, &t).unwrap();
        let (t, warnings) = load(&path, 3).unwrap();
        assert_eq!(t.exchange_owner("ex"), Some("receiver_1"));
        assert_eq!(
            t.binder("ex", "receiver_1.#", "receiver_1_queue"),
            Some(&Actor::receiver("receiver_1"))
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            t.queue("receiver_1_queue").unwrap().shard,
            shard_of("receiver_1", 3)
        );
        let mut out = Vec::new();
        assert!(t.route("ex", "receiver_1.a.b", &mut out));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shard, shard_of("receiver_1", 3));
    }

    #[test]
    fn a_file_written_by_earlier_builds_loads_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let text = r#"{
  "queues": [
    {
      "name": "orders",
      "owner": "admin"
    },
    {
      "name": "receiver_1_queue",
      "owner": "receiver_1"
    }
  ],
  "exchanges": [
    {
      "name": "ex",
      "kind": "direct",
      "bindings": [
        {
          "queue": "receiver_1_queue",
          "key": "receiver_1"
        },
        {
          "queue": "forgotten",
          "key": "x"
        }
      ]
    },
    {
      "name": "fan",
      "kind": "fanout",
      "bindings": []
    }
  ]
}"#;
        std::fs::write(&path, text).unwrap();
        let (t, warnings) = load(&path, 2).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(queue_names(&t), ["orders", "receiver_1_queue"]);
        assert_eq!(&*t.queue("orders").unwrap().owner, "admin");
        assert_eq!(t.exchange("fan").unwrap().kind(), ExchangeKind::Fanout);
        // Nothing recorded an owner or a binder: none is made up.
        assert_eq!(t.exchange_owner("fan"), None);
        assert_eq!(t.exchange_owner("ex"), None);
        assert_eq!(t.binder("ex", "receiver_1", "receiver_1_queue"), None);
        let mut out = Vec::new();
        assert!(t.route("ex", "receiver_1", &mut out));
        assert_eq!(out.len(), 1);
        // Saved again, it is the same text but for the binding to a queue
        // the file never listed.
        save(&path, &t).unwrap();
        let again = std::fs::read_to_string(&path).unwrap();
        let expected = text.replace(
            r#",
        {
          "queue": "forgotten",
          "key": "x"
        }"#,
            "",
        );
        assert_eq!(again, expected);
    }

    #[test]
    fn each_save_keeps_the_version_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let current = std::fs::read_to_string(&path).unwrap();
        let prev = std::fs::read_to_string(prev_path(&path)).unwrap();
        assert!(current.contains("\"q2\""), "{current}");
        assert!(
            prev.contains("\"q1\"") && !prev.contains("\"q2\""),
            "{prev}"
        );
        // No temporary name is left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["topology.json", "topology.json.prev"]);
    }

    #[test]
    fn a_damaged_file_falls_back_to_the_previous_copy_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::write(&path, b"{\"queues\": [{\"name\": \"q1\"").unwrap();
        let (t, warnings) = load(&path, 1).unwrap();
        assert_eq!(queue_names(&t), ["q1"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, path);
        assert!(
            warnings[0].message.contains("topology.json.prev"),
            "{}",
            warnings[0]
        );
        let aside = corrupt_copies(dir.path());
        assert_eq!(aside.len(), 1);
        assert!(warnings[0].message.contains(&*aside[0].to_string_lossy()));
        assert_eq!(
            std::fs::read(&aside[0]).unwrap(),
            b"{\"queues\": [{\"name\": \"q1\""
        );
        // topology.json is good again: the next load has nothing to say.
        let (t, warnings) = load(&path, 1).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(queue_names(&t), ["q1"]);
    }

    #[test]
    fn a_missing_file_is_restored_from_the_previous_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::remove_file(&path).unwrap();
        let (t, warnings) = load(&path, 1).unwrap();
        assert_eq!(queue_names(&t), ["q1"]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].message.contains("missing"), "{}", warnings[0]);
        assert!(path.exists());
    }

    #[test]
    fn a_name_that_would_leave_the_queues_directory_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let bad = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"q2\"", "\"..\"");
        std::fs::write(&path, bad).unwrap();
        let (t, warnings) = load(&path, 1).unwrap();
        assert_eq!(queue_names(&t), ["q1"]);
        assert!(
            warnings[0].message.contains("not a valid name"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn a_name_listed_twice_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let bad = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"q2\"", "\"q1\"");
        std::fs::write(&path, bad).unwrap();
        let (t, warnings) = load(&path, 1).unwrap();
        assert_eq!(queue_names(&t), ["q1"]);
        assert!(
            warnings[0].message.contains("queue q1 is listed twice"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn with_no_usable_copy_the_start_stops_naming_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        std::fs::write(&path, b"garbage").unwrap();
        std::fs::write(prev_path(&path), b"{}").unwrap();
        let err = load(&path, 1).unwrap_err();
        assert!(
            matches!(err, TopologyFileError::NoUsableCopy { .. }),
            "{err:?}"
        );
        let shown = err.to_string();
        assert!(
            shown.contains(&*path.to_string_lossy())
                && shown.contains(&*prev_path(&path).to_string_lossy())
                && shown.contains("Restore"),
            "{shown}"
        );
        // Nothing was moved or rewritten.
        assert_eq!(std::fs::read(&path).unwrap(), b"garbage");
        assert!(corrupt_copies(dir.path()).is_empty());
        // A missing file and a damaged copy stop the start too.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            load(&path, 1),
            Err(TopologyFileError::NoUsableCopy { .. })
        ));
    }

    #[test]
    fn nothing_saved_is_an_empty_topology_without_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let (t, warnings) = load(&dir.path().join(FILE_NAME), 1).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(t.queues().count(), 0);
        // Loading wrote nothing.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn leftovers_of_a_crashed_save_are_removed_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let leftover = dir.path().join(".topology.json.Ab12Cd");
        std::fs::write(&leftover, b"half").unwrap();
        let (t, warnings) = load(&path, 1).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(queue_names(&t), ["q1", "q2"]);
        assert!(!leftover.exists());
    }

    #[test]
    fn owners_and_binders_are_saved_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut t = Topology::empty(1);
        t.apply(&queue("receiver_1_queue", "receiver_1")).unwrap();
        for (name, owner) in [("admins", None), ("mine", Some("receiver_1"))] {
            t.apply(&TopologyChange::DeclareExchange {
                name: name.into(),
                kind: ExchangeKind::Fanout,
                owner: owner.map(str::to_owned),
            })
            .unwrap();
        }
        for (exchange, by) in [
            ("admins", Some(Actor::Admin)),
            ("mine", Some(Actor::receiver("receiver_1"))),
        ] {
            t.apply(&TopologyChange::Bind {
                queue: "receiver_1_queue".into(),
                exchange: exchange.into(),
                key: "receiver_1".into(),
                by,
            })
            .unwrap();
        }
        save(&path, &t).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""owner": "receiver_1""#), "{text}");
        assert!(text.contains(r#""bound_by": "admin""#), "{text}");
        assert!(text.contains(r#""receiver": "receiver_1""#), "{text}");
        let (back, warnings) = load(&path, 1).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back.exchange_owner("mine"), Some("receiver_1"));
        assert_eq!(back.exchange_owner("admins"), None);
        assert_eq!(
            back.binder("admins", "receiver_1", "receiver_1_queue"),
            Some(&Actor::Admin)
        );
        assert_eq!(
            back.binder("mine", "receiver_1", "receiver_1_queue"),
            Some(&Actor::receiver("receiver_1"))
        );
        // The same file again, byte for byte.
        save(&path, &back).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn an_empty_owner_or_binder_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = two_saves(dir.path());
        let good = std::fs::read_to_string(&path).unwrap();
        for bad in [
            r#"[{"name": "ex", "kind": "direct", "owner": "", "bindings": []}]"#,
            r#"[{"name": "ex", "kind": "direct", "bindings": [{"queue": "q1", "key": "k", "bound_by": {"receiver": ""}}]}]"#,
            r#"[{"name": "ex", "kind": "direct", "bindings": [{"queue": "q1", "key": "k", "bound_by": "nobody"}]}]"#,
        ] {
            let text = good.replace(r#""exchanges": []"#, &format!(r#""exchanges": {bad}"#));
            assert_ne!(text, good);
            std::fs::write(&path, &text).unwrap();
            let (t, warnings) = load(&path, 1).unwrap();
            assert_eq!(warnings.len(), 1, "{bad}: {warnings:?}");
            assert!(t.exchange("ex").is_none(), "{bad}");
            std::fs::write(&path, &good).unwrap();
        }
    }
}
