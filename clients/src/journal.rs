//! The receiver's output file, `data/<queue>_received_messages.jsonl`, and the set
//! of messages already in it: the durable half of exactly-once processing.
//!
//! One JSON object per line: `message_id`, `sender_client_id` (when the message
//! named its sender), `content` (the decrypted text; a plaintext that is not UTF-8
//! is written as `content_base64` instead) and `timestamp` (Unix seconds when it
//! was written). Records are staged in memory and committed in batches: one
//! `write` and one `fdatasync` per batch. The receiver acknowledges a message only
//! after the batch holding it is committed, so every acknowledged message is on
//! disk, and a message redelivered after a crash is recognised and acknowledged
//! without being written twice.
//!
//! A message is known by its sender and its id (docs/PROTOCOL.md, "Authenticated
//! senders"): ids are chosen by senders, so two senders may use the same one, and
//! neither may get the other's message dropped as a duplicate. The broker vouches for
//! `sender_client_id` (it refuses one that is not the publisher's CN). Messages that
//! name no sender, and lines written before the sender was recorded, are known by
//! their id alone, as they always were: an old file keeps deduplicating the
//! redeliveries of what it holds.
//!
//! On open the file is read once to rebuild that set (memory grows with the
//! number of records). A torn last line, left by a crash in the middle of a write,
//! was never acknowledged and is cut off; its message will be redelivered.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// A journal I/O failure: the batch in question is not durable and must not be
/// acknowledged.
#[derive(Debug, thiserror::Error)]
#[error("output file {}: {error}", path.display())]
pub struct JournalError {
    /// The output file.
    pub path: PathBuf,
    /// The underlying error (in the message, not `source()`, so a chain is
    /// printed once).
    pub error: io::Error,
}

/// One line of the output file.
#[derive(Debug, Serialize)]
struct Record<'a> {
    /// The message id from the sender.
    message_id: &'a str,
    /// The sender, when the message named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    sender_client_id: Option<&'a str>,
    /// The decrypted text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    /// The decrypted bytes in standard base64, when they are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    content_base64: Option<String>,
    /// Unix seconds when the record was staged.
    timestamp: u64,
}

/// What the id scan reads of a line.
#[derive(Debug, Deserialize)]
struct IdOnly {
    /// The message id.
    message_id: String,
    /// Its sender; absent in lines of messages that named none, and in files
    /// written before senders were recorded.
    #[serde(default)]
    sender_client_id: Option<String>,
}

/// A set of (sender, message id) pairs, looked up without allocating: the
/// ids of each sender apart, and those of messages without a sender apart.
#[derive(Debug, Default)]
pub(crate) struct SeenSet {
    /// Ids of messages that named no sender.
    anonymous: HashSet<String>,
    /// Ids by sender.
    by_sender: HashMap<String, HashSet<String>>,
}

impl SeenSet {
    /// Whether (`sender`, `message_id`) is in the set.
    pub(crate) fn contains(&self, sender: Option<&str>, message_id: &str) -> bool {
        match sender {
            None => self.anonymous.contains(message_id),
            Some(s) => self
                .by_sender
                .get(s)
                .is_some_and(|ids| ids.contains(message_id)),
        }
    }

    /// Adds (`sender`, `message_id`); false when it was there.
    pub(crate) fn insert(&mut self, sender: Option<&str>, message_id: &str) -> bool {
        let ids = match sender {
            None => &mut self.anonymous,
            Some(s) => match self.by_sender.get_mut(s) {
                Some(ids) => ids,
                None => self.by_sender.entry(s.to_owned()).or_default(),
            },
        };
        ids.insert(message_id.to_owned())
    }

    /// Removes (`sender`, `message_id`).
    pub(crate) fn remove(&mut self, sender: Option<&str>, message_id: &str) {
        match sender {
            None => {
                self.anonymous.remove(message_id);
            }
            Some(s) => {
                if let Some(ids) = self.by_sender.get_mut(s) {
                    ids.remove(message_id);
                    if ids.is_empty() {
                        self.by_sender.remove(s);
                    }
                }
            }
        }
    }
}

/// The output file and the ids it holds.
#[derive(Debug)]
pub struct Journal {
    /// The output file's path, for errors.
    path: PathBuf,
    /// Opened for appending.
    file: File,
    /// (Sender, id) of every message committed or staged.
    seen: SeenSet,
    /// (Sender, id) of the messages staged and not yet committed.
    staged_ids: Vec<(Option<String>, String)>,
    /// Serialized staged records.
    staged: Vec<u8>,
    /// Committed records (the file's lines).
    committed: u64,
    /// File length after the last commit, to cut a failed write back to.
    len: u64,
}

impl Journal {
    /// Opens (creating it and its directory if needed) and scans the output file.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let err = |error| JournalError {
            path: path.to_owned(),
            error,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir).map_err(err)?;
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(err)?;
        if created {
            // The new directory entry must survive a crash too.
            File::open(&dir).and_then(|d| d.sync_all()).map_err(err)?;
        }

        let mut seen = SeenSet::default();
        let mut committed = 0u64;
        let mut good_len = 0u64;
        let mut unreadable = 0u64;
        let mut reader = BufReader::with_capacity(1 << 20, &file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(err)?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') {
                break; // torn tail
            }
            good_len += n as u64;
            match serde_json::from_slice::<IdOnly>(&line) {
                Ok(rec) => {
                    seen.insert(rec.sender_client_id.as_deref(), &rec.message_id);
                    committed += 1;
                }
                Err(_) => unreadable += 1,
            }
        }
        let actual = file.metadata().map_err(err)?.len();
        if actual > good_len {
            tracing::warn!(
                path = %path.display(),
                bytes = actual - good_len,
                "cutting off a torn last record (written but never acknowledged; it will be redelivered)"
            );
            file.set_len(good_len).map_err(err)?;
            file.sync_all().map_err(err)?;
        }
        if unreadable > 0 {
            tracing::warn!(path = %path.display(), lines = unreadable, "lines without a readable message_id were kept but not deduplicated against");
        }
        Ok(Journal {
            path: path.to_owned(),
            file,
            seen,
            staged_ids: Vec::new(),
            staged: Vec::new(),
            committed,
            len: good_len,
        })
    }

    /// Whether the message `message_id` of `sender` (`None`: a message that
    /// named no sender) is committed or staged.
    pub fn contains(&self, sender: Option<&str>, message_id: &str) -> bool {
        self.seen.contains(sender, message_id)
    }

    /// Adds a record of `sender`'s message to the next commit. The caller
    /// checked [`Journal::contains`] first.
    pub fn stage(
        &mut self,
        sender: Option<&str>,
        message_id: &str,
        plaintext: &[u8],
        timestamp: u64,
    ) {
        let (content, content_base64) = match std::str::from_utf8(plaintext) {
            Ok(text) => (Some(text), None),
            Err(_) => (None, Some(BASE64.encode(plaintext))),
        };
        let record = Record {
            message_id,
            sender_client_id: sender,
            content,
            content_base64,
            timestamp,
        };
        // Serialising strings and an integer into a Vec cannot fail.
        if serde_json::to_writer(&mut self.staged, &record).is_ok() {
            self.staged.push(b'\n');
            self.seen.insert(sender, message_id);
            self.staged_ids
                .push((sender.map(str::to_owned), message_id.to_owned()));
        }
    }

    /// Records staged and not committed.
    pub fn staged(&self) -> usize {
        self.staged_ids.len()
    }

    /// Records committed (lines in the file).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// The output file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the staged records and fsyncs; returns how many were committed. On
    /// failure the file is cut back to its last committed length (best effort) and
    /// the staged records are dropped, so their messages stay unacknowledged and
    /// come back.
    pub fn commit(&mut self) -> Result<usize, JournalError> {
        if self.staged_ids.is_empty() {
            return Ok(0);
        }
        let result = self
            .file
            .write_all(&self.staged)
            .and_then(|()| self.file.sync_data());
        let n = self.staged_ids.len();
        match result {
            Ok(()) => {
                self.len += self.staged.len() as u64;
                self.committed += n as u64;
                self.staged.clear();
                self.staged_ids.clear();
                Ok(n)
            }
            Err(error) => {
                let _ = self.file.set_len(self.len);
                for (sender, id) in self.staged_ids.drain(..) {
                    self.seen.remove(sender.as_deref(), &id);
                }
                self.staged.clear();
                Err(JournalError {
                    path: self.path.clone(),
                    error,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn commits_and_remembers_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/q_received_messages.jsonl");
        let mut j = Journal::open(&path).unwrap();
        j.stage(None, "m1", b"hello", 1);
        j.stage(None, "m2", &[0xff, 0x00], 2);
        assert!(j.contains(None, "m1"));
        assert_eq!(j.staged(), 2);
        assert_eq!(fs::read(&path).unwrap().len(), 0, "nothing before commit");
        assert_eq!(j.commit().unwrap(), 2);
        assert_eq!(j.commit().unwrap(), 0);
        let got = lines(&path);
        assert_eq!(got[0]["message_id"], "m1");
        assert_eq!(got[0]["content"], "hello");
        assert_eq!(got[0]["timestamp"], 1);
        assert_eq!(got[1]["content_base64"], "/wA=");
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert!(j.contains(None, "m1") && j.contains(None, "m2") && !j.contains(None, "m3"));
        assert_eq!(j.committed(), 2);
    }

    #[test]
    fn cuts_a_torn_tail_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        fs::write(
            &path,
            "{\"message_id\":\"a\",\"content\":\"x\",\"timestamp\":1}\nnot json\n{\"message_id\":\"b\",\"con",
        )
        .unwrap();
        let mut j = Journal::open(&path).unwrap();
        assert!(j.contains(None, "a"));
        assert!(!j.contains(None, "b"));
        j.stage(None, "b", b"y", 2);
        j.commit().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.ends_with("\"timestamp\":2}\n"), "{text}");
    }

    #[test]
    fn the_same_id_from_two_senders_is_two_messages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let mut j = Journal::open(&path).unwrap();
        j.stage(Some("sender_2"), "sender_1-1-r", b"junk", 1);
        assert!(j.contains(Some("sender_2"), "sender_1-1-r"));
        assert!(!j.contains(Some("sender_1"), "sender_1-1-r"));
        assert!(!j.contains(None, "sender_1-1-r"));
        j.stage(Some("sender_1"), "sender_1-1-r", b"real", 2);
        j.commit().unwrap();
        let got = lines(&path);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["sender_client_id"], "sender_2");
        assert_eq!(got[1]["sender_client_id"], "sender_1");
        assert_eq!(got[1]["content"], "real");
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert!(j.contains(Some("sender_1"), "sender_1-1-r"));
        assert!(j.contains(Some("sender_2"), "sender_1-1-r"));
        assert!(!j.contains(Some("sender_3"), "sender_1-1-r"));
        assert!(!j.contains(None, "sender_1-1-r"));
    }

    #[test]
    fn a_file_without_senders_still_deduplicates_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        // As written before senders were recorded.
        fs::write(
            &path,
            "{\"message_id\":\"old\",\"content\":\"x\",\"timestamp\":1}\n",
        )
        .unwrap();
        let mut j = Journal::open(&path).unwrap();
        assert!(j.contains(None, "old"));
        assert!(!j.contains(Some("sender_1"), "old"));
        j.stage(None, "new", b"y", 2);
        j.stage(Some("sender_1"), "new", b"z", 3);
        j.commit().unwrap();
        let got = lines(&path);
        assert!(got[1].get("sender_client_id").is_none());
        assert_eq!(got[2]["sender_client_id"], "sender_1");
    }

    #[test]
    fn a_failed_commit_forgets_its_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let mut j = Journal::open(&path).unwrap();
        j.stage(Some("s"), "m", b"x", 1);
        j.stage(None, "m", b"x", 1);
        // Write to a file opened read-only: the commit fails.
        j.file = File::open(&path).unwrap();
        assert!(j.commit().is_err());
        assert!(!j.contains(Some("s"), "m") && !j.contains(None, "m"));
        assert_eq!(j.staged(), 0);
    }
}
