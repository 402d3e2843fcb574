//! Log files on disk, in one place: the file header, how a file's bytes are
//! walked record by record, how damage is told from a torn end, and which
//! files of a queue's directory are segments. Recovery, the committer and
//! the metadata mirror's reader all go through here.
//!
//! ```text
//! file = header:"CipherMQ log v2\n" frame…      (frames: see `record`)
//! ```
//!
//! Files without the header were written by earlier versions (v1 frames, no
//! sync marker); they are read, never appended to.
//!
//! Walking a file ([`step`]) sorts every byte into one of three kinds:
//! - a record: a frame whose CRC checks;
//! - damage: bytes that are not a valid frame but are followed by one (a
//!   flipped bit, a bad sector, a damaged length). They are skipped, and
//!   recovery moves them to a quarantine file;
//! - the end: nothing valid follows. Only an incomplete frame (a plausible
//!   header whose length runs past the end of the file) or bytes that are all
//!   zero count as a torn tail, the trace of a write a crash cut short, never
//!   acknowledged. Anything else at the end is damage too.
//!
//! A complete frame that fails its CRC is damage, never an end: that is what
//! keeps one bad byte from costing every record after it.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::dedup::file::dedup_number;
use crate::log::crc;
use crate::log::record::{decode, Decoded, Framing, Record, HEADER_BYTES, SYNC};

/// The first bytes of every log file this version writes.
pub const FILE_HEADER: [u8; 16] = *b"CipherMQ log v2\n";
/// Bytes of [`FILE_HEADER`]: the offset of a file's first frame.
pub const FILE_HEADER_BYTES: u64 = FILE_HEADER.len() as u64;

/// Mode of every log, dedup and quarantine file the broker creates: its
/// user's alone (logs say who sent what to whom), set at creation so the
/// umask can only take bits away (as `ciphermq_datadir::FILE_MODE`).
pub const FILE_MODE: u32 = 0o600;

/// How every log, dedup and quarantine file is opened, at recovery and by
/// the committer: never through a symbolic link (`O_NOFOLLOW`: a link
/// planted under a log file's name fails the open with `ELOOP` instead of
/// letting the broker read, cut or pad the file it points to), and created
/// with [`FILE_MODE`]. The caller adds read, write, create.
pub fn open_options() -> fs::OpenOptions {
    let mut options = fs::OpenOptions::new();
    options.mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW);
    options
}

/// How a file's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The framing of its records.
    pub framing: Framing,
    /// Where the first frame starts.
    pub start: usize,
    /// The file header is damaged (the frames after it are v2 all the same).
    pub header_damaged: bool,
}

/// Tells a file's framing from its first bytes (`data` may be a prefix).
pub fn layout(data: &[u8]) -> Layout {
    let v2 = |header_damaged| Layout {
        framing: Framing::V2,
        start: FILE_HEADER.len().min(data.len()),
        header_damaged,
    };
    if data.starts_with(&FILE_HEADER) {
        return v2(false);
    }
    // A file cut short inside its header: new, never holding a record.
    if data.len() <= FILE_HEADER.len()
        && (FILE_HEADER.starts_with(data) || data.iter().all(|b| *b == 0))
    {
        return v2(false);
    }
    // v1 frames carry no sync marker: one in the file means v2 frames
    // behind a damaged header.
    if memchr::memmem::find(data, &SYNC).is_some() {
        return v2(true);
    }
    Layout {
        framing: Framing::V1,
        start: 0,
        header_damaged: false,
    }
}

/// What lies at a position of a file.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// A record of `len` bytes.
    Record(Record<'a>, usize),
    /// `len` damaged bytes, followed by a valid frame.
    Damaged {
        /// How many bytes to skip.
        len: usize,
        /// What was wrong at the first of them.
        why: &'static str,
    },
    /// Nothing valid from here to the end of the data.
    End(End),
    /// Not decidable from the bytes at hand: read further and ask again
    /// (only when the data does not reach the end of the file).
    NeedMore,
}

/// How the data ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Exactly at a frame boundary.
    Clean,
    /// `len` bytes of an incomplete frame or zeros: a write cut short.
    Torn {
        /// Bytes to the end.
        len: usize,
    },
    /// `len` bytes to the end that are neither records nor a torn write.
    Damaged {
        /// Bytes to the end.
        len: usize,
        /// What was wrong at the first of them.
        why: &'static str,
    },
}

/// What lies at `data[pos..]`. `at_eof`: `data` ends where the file ends
/// (when it does not, a frame cut by the end of `data` asks for more).
pub fn step(data: &[u8], pos: usize, framing: Framing, at_eof: bool) -> Step<'_> {
    let rest = &data[pos.min(data.len())..];
    if rest.is_empty() {
        return Step::End(End::Clean);
    }
    let why = match decode(framing, rest) {
        Decoded::Record(record, len) => return Step::Record(record, len),
        // The CRC checks, so the length is right: skip exactly the frame.
        Decoded::Malformed(len, why) => return Step::Damaged { len, why },
        // Cut short by the end of the data, or its length is damaged: a
        // valid frame inside the claimed length tells which.
        Decoded::Incomplete => None,
        Decoded::Damaged(why) => Some(why),
    };
    match resync(data, pos + 1, framing, at_eof) {
        Resync::Found(next) => Step::Damaged {
            len: next - pos,
            why: why.unwrap_or("length runs past the next record"),
        },
        Resync::NeedMore => Step::NeedMore,
        Resync::None if !at_eof => Step::NeedMore,
        Resync::None => {
            let len = rest.len();
            match why {
                None if framing == Framing::V2 && length_alone_damaged(rest) => {
                    Step::End(End::Damaged {
                        len,
                        why: "damaged length",
                    })
                }
                None => Step::End(End::Torn { len }),
                Some(_) if rest.iter().all(|b| *b == 0) => Step::End(End::Torn { len }),
                Some(why) => Step::End(End::Damaged { len, why }),
            }
        }
    }
}

/// Whether `rest`, a v2 frame claiming to run past the end of the file, is
/// whole but for its length: its CRC checks with the length it would need.
/// Then the length was damaged after the write, which no crash does.
fn length_alone_damaged(rest: &[u8]) -> bool {
    if rest.len() <= HEADER_BYTES {
        return false;
    }
    let would_be = ((rest.len() - 12) as u32).to_le_bytes();
    let crc = crc::crc32c_of_two(&would_be, &rest[12..]);
    crc.to_le_bytes() == rest[8..12]
}

enum Resync {
    Found(usize),
    None,
    NeedMore,
}

/// The first position at or after `from` where a frame starts: one that
/// checks, or, at the end of the file, a plausible frame cut short (the
/// next step calls it a torn tail).
fn resync(data: &[u8], from: usize, framing: Framing, at_eof: bool) -> Resync {
    if from >= data.len() {
        return Resync::None;
    }
    match framing {
        Framing::V2 => {
            for hit in memchr::memmem::find_iter(&data[from..], &SYNC) {
                let at = from + hit;
                match decode(framing, &data[at..]) {
                    Decoded::Record(..) | Decoded::Malformed(..) => return Resync::Found(at),
                    Decoded::Incomplete if at_eof => return Resync::Found(at),
                    Decoded::Incomplete => return Resync::NeedMore,
                    Decoded::Damaged(_) => {}
                }
            }
            // A marker cut by the end of the data may start a frame.
            let tail = data.len().saturating_sub(SYNC.len() - 1).max(from);
            if !at_eof && (tail..data.len()).any(|at| SYNC.starts_with(&data[at..])) {
                return Resync::NeedMore;
            }
            Resync::None
        }
        // Without a marker every offset is a candidate; most fail on their
        // length at once.
        Framing::V1 => (from..data.len())
            .find(|&at| {
                matches!(
                    decode(framing, &data[at..]),
                    Decoded::Record(..) | Decoded::Malformed(..)
                )
            })
            .map_or(Resync::None, Resync::Found),
    }
}

/// A queue directory's log files, oldest first.
#[derive(Debug, Default, Clone)]
pub struct Listing {
    /// Segments: (base, path).
    pub segments: Vec<(u64, PathBuf)>,
    /// Dedup files: (number, path).
    pub dedup_files: Vec<(u64, PathBuf)>,
    /// Fully acked files whose deletion was under way (see
    /// [`freeing_path`]): never read, only deleted.
    pub freeing: Vec<PathBuf>,
}

impl Listing {
    /// Whether the segment at `base` is finished: the broker starts a new
    /// segment only after its last write to the previous one, so every
    /// segment but the newest in a listing has its final length.
    pub fn is_complete(&self, base: u64) -> bool {
        self.segments
            .last()
            .is_some_and(|(newest, _)| base < *newest)
    }

    /// The segment bases, oldest first.
    pub fn bases(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments.iter().map(|(base, _)| *base)
    }
}

/// Lists the log files of the queue directory `dir` (none if it does not
/// exist). Something that only looks like a log file (a device, a
/// directory) is an error naming it: files are read whole, and the log may
/// write to that name again. So is a symbolic link, whatever it points to,
/// under a log file's name or as the queue directory itself: the broker
/// never reads or writes through one (the file it points to may be any
/// file of the broker's user).
pub fn list(dir: &Path) -> io::Result<Listing> {
    let mut out = Listing::default();
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => return Err(symlink_error(dir)),
        _ => {}
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name
            .strip_suffix(FREEING_SUFFIX)
            .is_some_and(|log| segment_base(log).is_some() || dedup_number(log).is_some())
        {
            out.freeing.push(entry.path());
            continue;
        }
        let (list, number) = match (segment_base(name), dedup_number(name)) {
            (Some(base), _) => (&mut out.segments, base),
            (_, Some(number)) => (&mut out.dedup_files, number),
            _ => continue,
        };
        // The entry itself, not what a link points to.
        let file_type = entry.file_type()?;
        if file_type.is_symlink() {
            return Err(symlink_error(&entry.path()));
        }
        if !file_type.is_file() {
            return Err(io::Error::other(format!(
                "{}: not a regular file; move it out of the data directory",
                entry.path().display()
            )));
        }
        list.push((number, entry.path()));
    }
    out.segments.sort();
    out.dedup_files.sort();
    Ok(out)
}

/// The error for a symbolic link found where a queue's directory or log file
/// should be: it names the link and where it points.
fn symlink_error(path: &Path) -> io::Error {
    let target = fs::read_link(path)
        .map(|t| t.display().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    tracing::error!(path = %path.display(), points_to = %target, "a symbolic link in the data directory; neither read nor followed");
    io::Error::other(format!(
        "{}: a symbolic link (to {target}); the broker never reads or writes through a \
         link in its data directory: move it out",
        path.display()
    ))
}

/// Ends the name a log file takes while it is being deleted.
const FREEING_SUFFIX: &str = ".freeing";

/// The name a fully acked log file takes before it is given back to the
/// filesystem a few megabytes at a time (the broker's deleter): from then on
/// it is never read, so a crash halfway through leaves a file that recovery
/// deletes, not a shortened log that would bring acked messages back.
pub fn freeing_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(FREEING_SUFFIX);
    file.with_file_name(name)
}

/// The file of the segment starting at `base`.
pub fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("segment-{base:020}.log"))
}

/// The base of a segment file name, if it is one.
pub fn segment_base(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix("segment-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// Where recovery keeps the damaged bytes found at `offset` of `file`:
/// beside it, named after both, never mistaken for a log file.
pub fn quarantine_path(file: &Path, offset: u64) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{offset:020}.quarantined"));
    file.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::record::encode;

    fn msg(seq: u64) -> Record<'static> {
        Record::Message {
            seq,
            sender: "s1",
            message_id: "m",
            exchange: "e",
            routing_key: "k",
            sent_at_ms: 1,
            body: "{\"ciphertext\":\"abc\"}",
        }
    }

    /// A v2 file of `n` messages, and where each frame starts.
    fn file(n: u64) -> (Vec<u8>, Vec<usize>) {
        let mut data = FILE_HEADER.to_vec();
        let mut starts = Vec::new();
        for seq in 0..n {
            starts.push(data.len());
            encode(&msg(seq), &mut data);
        }
        (data, starts)
    }

    /// Walks `data` to its end: the seqs read, the damaged ranges, the end.
    fn walk(data: &[u8]) -> (Vec<u64>, Vec<(usize, usize)>, End) {
        let layout = layout(data);
        let mut pos = layout.start;
        let (mut seqs, mut damaged) = (Vec::new(), Vec::new());
        loop {
            match step(data, pos, layout.framing, true) {
                Step::Record(Record::Message { seq, .. }, n) => {
                    seqs.push(seq);
                    pos += n;
                }
                Step::Record(_, n) => pos += n,
                Step::Damaged { len, .. } => {
                    damaged.push((pos, len));
                    pos += len;
                }
                Step::End(end) => return (seqs, damaged, end),
                Step::NeedMore => panic!("NeedMore at the end of the file"),
            }
        }
    }

    #[test]
    fn a_damaged_length_costs_only_its_record() {
        let (mut data, starts) = file(10);
        // The length of the 4th record now runs past the end of the file.
        data[starts[3] + 7] = 0x7f;
        let (seqs, damaged, end) = walk(&data);
        assert_eq!(seqs, [0, 1, 2, 4, 5, 6, 7, 8, 9]);
        assert_eq!(damaged, [(starts[3], starts[4] - starts[3])]);
        assert_eq!(end, End::Clean);
    }

    #[test]
    fn any_single_flipped_byte_costs_at_most_its_own_record() {
        let (data, starts) = file(6);
        for at in FILE_HEADER.len()..data.len() {
            let mut bad = data.clone();
            bad[at] ^= 0x5a;
            let (seqs, damaged, end) = walk(&bad);
            let hit = starts.iter().rposition(|s| *s <= at).unwrap() as u64;
            let expected: Vec<u64> = (0..6).filter(|s| *s != hit).collect();
            assert_eq!(seqs, expected, "byte {at}");
            // Reported either way: as a damaged range, or, in the last
            // record, as damage running to the end (never a torn tail).
            let at_end = matches!(end, End::Damaged { .. });
            assert_eq!(damaged.len() + usize::from(at_end), 1, "byte {at}");
        }
    }

    #[test]
    fn an_incomplete_or_zeroed_end_is_torn_and_anything_else_damage() {
        let (data, starts) = file(3);
        for cut in starts[2] + 1..data.len() {
            let (seqs, damaged, end) = walk(&data[..cut]);
            assert_eq!((seqs, damaged), (vec![0, 1], vec![]), "cut at {cut}");
            assert_eq!(
                end,
                End::Torn {
                    len: cut - starts[2]
                }
            );
        }
        let mut zeroed = data.clone();
        zeroed.extend_from_slice(&[0u8; 4096]);
        assert_eq!(walk(&zeroed).2, End::Torn { len: 4096 });
        // The last frame complete but failing its CRC: damage, not an end.
        let mut flipped = data.clone();
        let last = data.len() - 1;
        flipped[last] ^= 1;
        let (seqs, _, end) = walk(&flipped);
        assert_eq!(seqs, [0, 1]);
        assert!(matches!(end, End::Damaged { len, .. } if len == data.len() - starts[2]));
    }

    #[test]
    fn a_chunk_cut_inside_a_frame_or_damage_asks_for_more() {
        let (mut data, starts) = file(4);
        let cut = starts[1] + 5;
        assert_eq!(
            step(&data[..cut], starts[1], Framing::V2, false),
            Step::NeedMore
        );
        data[starts[1] + 20] ^= 1;
        // The damage is decided only once the next frame is in the chunk.
        assert_eq!(
            step(&data[..starts[2] + 2], starts[1], Framing::V2, false),
            Step::NeedMore
        );
        assert!(matches!(
            step(&data, starts[1], Framing::V2, false),
            Step::Damaged { len, .. } if len == starts[2] - starts[1]
        ));
    }

    #[test]
    fn files_of_earlier_versions_are_read_and_resynchronised() {
        // v1 frames: length, CRC over kind and payload, kind, payload.
        let mut data = Vec::new();
        let mut starts = Vec::new();
        for seq in 0..5u64 {
            let mut v2 = Vec::new();
            encode(&msg(seq), &mut v2);
            let body = &v2[12..];
            starts.push(data.len());
            data.extend_from_slice(&(body.len() as u32).to_le_bytes());
            data.extend_from_slice(&crc::crc32c(body).to_le_bytes());
            data.extend_from_slice(body);
        }
        assert_eq!(layout(&data).framing, Framing::V1);
        data[starts[2] + 1] = 0x40;
        let (seqs, damaged, end) = walk(&data);
        assert_eq!(seqs, [0, 1, 3, 4]);
        assert_eq!(damaged, [(starts[2], starts[3] - starts[2])]);
        assert_eq!(end, End::Clean);
    }

    #[test]
    fn a_damaged_file_header_still_reads_as_v2() {
        let (mut data, _) = file(3);
        data[2] ^= 0xff;
        let l = layout(&data);
        assert!(l.header_damaged && l.framing == Framing::V2);
        assert_eq!(walk(&data).0, [0, 1, 2]);
        for n in 0..FILE_HEADER.len() {
            assert_eq!(layout(&FILE_HEADER[..n]).framing, Framing::V2);
        }
    }

    #[test]
    fn listing_sorts_and_tells_complete_segments() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "segment-00000000000000000007.log",
            "segment-00000000000000000000.log",
            "dedup-00000000000000000001.log",
            "segment-00000000000000000000.log.00000000000000000016.quarantined",
            "segment-00000000000000000003.log.freeing",
            "dedup-00000000000000000000.log.freeing",
            "notes.freeing",
        ] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        let l = list(dir.path()).unwrap();
        assert_eq!(l.bases().collect::<Vec<_>>(), [0, 7]);
        assert_eq!(l.dedup_files.len(), 1);
        let mut freeing = l.freeing.clone();
        freeing.sort();
        assert_eq!(
            freeing,
            [
                freeing_path(&dir.path().join("dedup-00000000000000000000.log")),
                freeing_path(&segment_path(dir.path(), 3)),
            ]
        );
        assert!(l.is_complete(0) && !l.is_complete(7));
        assert!(list(&dir.path().join("missing"))
            .unwrap()
            .segments
            .is_empty());
    }

    #[test]
    fn quarantine_names_are_not_log_names() {
        let q = quarantine_path(Path::new("/d/segment-00000000000000000003.log"), 42);
        let name = q.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            name,
            "segment-00000000000000000003.log.00000000000000000042.quarantined"
        );
        assert!(segment_base(name).is_none() && dedup_number(name).is_none());
    }
}
