//! Helpers shared by the fuzz targets and the seed generator
//! (`examples/seeds.rs`): how a `recovery` input is cut into the files of a
//! queue directory, and a scratch directory reused across runs.
//!
//! Nothing here is fuzzed itself; it only shapes raw bytes into what the code
//! under test reads.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use ciphermq_shard::dedup::file::dedup_path;
use ciphermq_shard::log::record::SYNC;
use ciphermq_shard::log::segment::FILE_HEADER;
use ciphermq_shard::log::segment_path;

/// Most segment files one `recovery` input makes.
pub const MAX_SEGMENTS: usize = 4;

/// The files of a queue directory, as one `recovery` input describes them.
///
/// ```text
/// input = flags:u8 file…
/// flags   bits 0-1: segments - 1; bit 2: a dedup file comes first;
///         bit 3: every file starts with the v2 file header (not part of
///         the input), so mutations go to the frames;
///         bit 4: a file's bytes are frame bodies to seal (below)
/// file    base_step:u8 len:u16le bytes[len]   (the last file: bytes to the end)
/// sealed  (n:u8 body[n])…: each body (kind and payload) becomes a v2 frame
///         with the right length and CRC, so mutations reach the fields
/// ```
///
/// A segment's base is the previous base plus `base_step` (at least 1 after
/// the first, so names never collide); a dedup file's number is its step.
/// Lengths past the end of the input are cut to it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueFiles {
    /// The dedup file's number and contents, if there is one.
    pub dedup: Option<(u64, Vec<u8>)>,
    /// Segments: (base, contents), bases increasing.
    pub segments: Vec<(u64, Vec<u8>)>,
}

impl QueueFiles {
    /// Cuts `data` into files (see the type's doc). Never fails: any input
    /// makes some directory, possibly of empty files.
    pub fn parse(data: &[u8]) -> QueueFiles {
        let Some((&flags, mut rest)) = data.split_first() else {
            return QueueFiles {
                dedup: None,
                segments: vec![(0, Vec::new())],
            };
        };
        let segments = usize::from(flags & 0b11) + 1;
        let with_dedup = flags & 0b100 != 0;
        let with_header = flags & 0b1000 != 0;
        let sealed = flags & 0b1_0000 != 0;
        let files = segments + usize::from(with_dedup);
        let mut out = QueueFiles::default();
        let mut base = 0u64;
        for index in 0..files {
            let last = index + 1 == files;
            let step = take(&mut rest, 1).first().copied().unwrap_or(0);
            let bytes = if last {
                std::mem::take(&mut rest)
            } else {
                let len = match take(&mut rest, 2) {
                    [a, b] => usize::from(u16::from_le_bytes([*a, *b])),
                    _ => 0,
                };
                take(&mut rest, len)
            };
            let mut contents = Vec::with_capacity(bytes.len() + FILE_HEADER.len());
            if with_header {
                contents.extend_from_slice(&FILE_HEADER);
            }
            if sealed {
                seal_frames(bytes, &mut contents);
            } else {
                contents.extend_from_slice(bytes);
            }
            if with_dedup && index == 0 {
                out.dedup = Some((u64::from(step), contents));
            } else {
                if !out.segments.is_empty() {
                    base += u64::from(step).max(1);
                } else {
                    base = u64::from(step);
                }
                out.segments.push((base, contents));
            }
        }
        out
    }

    /// The input that [`QueueFiles::parse`] reads back as `self` (flag bits 3
    /// and 4 unset: the contents are written as they are). `None`
    /// when there are no segments, more than [`MAX_SEGMENTS`], bases that do
    /// not increase by 1 to 255, or a file (but the last) over 64 KiB.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let n = self.segments.len();
        if n == 0 || n > MAX_SEGMENTS {
            return None;
        }
        let mut flags = (n - 1) as u8;
        if self.dedup.is_some() {
            flags |= 0b100;
        }
        let mut files: Vec<(u8, &[u8])> = Vec::new();
        if let Some((number, bytes)) = &self.dedup {
            files.push((u8::try_from(*number).ok()?, bytes));
        }
        let mut previous: Option<u64> = None;
        for (base, bytes) in &self.segments {
            let step = match previous {
                None => u8::try_from(*base).ok()?,
                Some(p) => u8::try_from(base.checked_sub(p)?).ok().filter(|s| *s > 0)?,
            };
            previous = Some(*base);
            files.push((step, bytes));
        }
        let mut out = vec![flags];
        let count = files.len();
        for (index, (step, bytes)) in files.into_iter().enumerate() {
            out.push(step);
            if index + 1 < count {
                out.extend_from_slice(&u16::try_from(bytes.len()).ok()?.to_le_bytes());
            }
            out.extend_from_slice(bytes);
        }
        Some(out)
    }

    /// Writes the files into `dir` (which should be empty).
    pub fn write_to(&self, dir: &Path) -> io::Result<()> {
        if let Some((number, bytes)) = &self.dedup {
            fs::write(dedup_path(dir, *number), bytes)?;
        }
        for (base, bytes) in &self.segments {
            fs::write(segment_path(dir, *base), bytes)?;
        }
        Ok(())
    }
}

/// Appends the frame bodies in `bytes` (`(n:u8 body[n])…`, the last one cut
/// at the end) to `out` as v2 frames whose length and CRC check. An empty
/// body makes an empty frame, which the reader takes for damage.
pub fn seal_frames(mut bytes: &[u8], out: &mut Vec<u8>) {
    while let Some((&n, rest)) = bytes.split_first() {
        bytes = rest;
        let body = take(&mut bytes, usize::from(n));
        let len = (body.len() as u32).to_le_bytes();
        out.extend_from_slice(&SYNC);
        out.extend_from_slice(&len);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&len), body);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
    }
}

/// Splits off the first `n` bytes of `rest` (fewer if it is shorter).
fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = rest.split_at(n.min(rest.len()));
    *rest = tail;
    head
}

/// A directory for one run's files, emptied before each run and kept for the
/// life of the process (a static holds it, so it outlives the process:
/// scripts/fuzz.sh points `TMPDIR` at a directory of its own and removes
/// that). Under `TMPDIR` when it is set, else on `/dev/shm` when there is
/// one (no disk writes, and the syncs recovery makes cost nothing), else in
/// the system temp dir.
pub struct Scratch {
    _root: tempfile::TempDir,
    dir: PathBuf,
}

impl Scratch {
    /// A new, empty scratch directory.
    pub fn new() -> Scratch {
        let shm = Path::new("/dev/shm");
        let parent = match std::env::var_os("TMPDIR") {
            Some(dir) => PathBuf::from(dir),
            None if shm.is_dir() => shm.to_path_buf(),
            None => std::env::temp_dir(),
        };
        let root = tempfile::Builder::new()
            .prefix("ciphermq-fuzz-")
            .tempdir_in(parent)
            .expect("a scratch directory");
        let dir = root.path().join("q");
        Scratch { _root: root, dir }
    }

    /// The directory, emptied (created if it is not there).
    pub fn fresh(&self) -> &Path {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot empty {}: {e}", self.dir.display()),
        }
        fs::create_dir(&self.dir).expect("scratch dir");
        &self.dir
    }

    /// The directory as it is.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_and_parse_agree() {
        let files = QueueFiles {
            dedup: Some((3, b"abc".to_vec())),
            segments: vec![(0, b"one".to_vec()), (7, b"two".to_vec()), (8, Vec::new())],
        };
        assert_eq!(QueueFiles::parse(&files.encode().unwrap()), files);
        let one = QueueFiles {
            dedup: None,
            segments: vec![(5, b"x".to_vec())],
        };
        assert_eq!(QueueFiles::parse(&one.encode().unwrap()), one);
    }

    #[test]
    fn sealed_bodies_become_frames_that_decode() {
        use ciphermq_shard::log::record::{decode, encode, Decoded, Framing, Record};
        let ack = Record::Ack {
            seq: 3,
            acked_at_ms: 4,
            key: Some(5),
        };
        let mut frame = Vec::new();
        encode(&ack, &mut frame);
        let body = &frame[12..];
        let input = [&[0b1_0000u8, 0, body.len() as u8][..], body].concat();
        let files = QueueFiles::parse(&input);
        assert_eq!(files.segments, [(0, frame.clone())]);
        assert_eq!(
            decode(Framing::V2, &files.segments[0].1),
            Decoded::Record(ack, frame.len())
        );
    }

    #[test]
    fn any_input_makes_a_directory() {
        for data in [&b""[..], b"\x0f", b"\x0f\x00\xff\xff", b"\x03\x01"] {
            let files = QueueFiles::parse(data);
            assert!(!files.segments.is_empty() && files.segments.len() <= MAX_SEGMENTS);
            assert!(files.segments.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}
