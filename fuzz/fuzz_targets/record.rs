//! `record`: the bytes of a log file, as `record::decode` and `segment::step`
//! read them.
//!
//! ```text
//! input = mode:u8 bytes…
//! mode bit 0: v1 framing (else v2)
//!      bit 1: the bytes are a frame body (kind and payload): wrap them in a
//!             frame with the right length and CRC first, so mutations reach
//!             the field decoding behind the CRC
//! ```
//!
//! Checked besides the absence of panics:
//! - `decode`: a record or a malformed frame has a length above 0 that stays
//!   within the data; a sealed frame is never damage; a record re-encodes to
//!   a frame that decodes to the same record;
//! - `step`, walking the whole data from its layout's start to its end, with
//!   the data both as a whole file (`at_eof`) and as a chunk of a longer one:
//!   every step's length is above 0 and within the data, an end covers all
//!   the bytes left, a whole file never asks for more, and the walk ends.

#![no_main]

use ciphermq_shard::log::record::{decode, encode, Decoded, Framing, Record, MAX_RECORD_BYTES};
use ciphermq_shard::log::segment::{layout, step, End, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let framing = if mode & 1 == 0 {
        Framing::V2
    } else {
        Framing::V1
    };
    if mode & 2 != 0 && !bytes.is_empty() {
        let frame = seal(framing, bytes);
        match decode(framing, &frame) {
            Decoded::Record(record, len) => {
                assert_eq!(len, frame.len());
                round_trip(&record);
            }
            Decoded::Malformed(len, _) => assert_eq!(len, frame.len()),
            other => panic!("a sealed frame decoded as {other:?}"),
        }
        walk(&frame, framing, 0);
        return;
    }
    check_decode(framing, bytes);
    walk(bytes, framing, 0);
    // The same bytes as a file: the framing its header tells.
    let found = layout(bytes);
    walk(bytes, found.framing, found.start);
});

/// `body` (kind and payload) in a frame of `framing` with a length and CRC
/// that check.
fn seal(framing: Framing, body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u32).to_le_bytes();
    let mut out = Vec::with_capacity(body.len() + 12);
    match framing {
        Framing::V2 => {
            out.extend_from_slice(&ciphermq_shard::log::record::SYNC);
            out.extend_from_slice(&len);
            let crc = crc32c::crc32c_append(crc32c::crc32c(&len), body);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        Framing::V1 => {
            out.extend_from_slice(&len);
            out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        }
    }
    out.extend_from_slice(body);
    out
}

/// Decodes at the start of `bytes` and checks the lengths it claims.
fn check_decode(framing: Framing, bytes: &[u8]) {
    match decode(framing, bytes) {
        Decoded::Record(record, len) => {
            assert!(len > 0 && len <= bytes.len() && len <= MAX_RECORD_BYTES + 12);
            round_trip(&record);
        }
        Decoded::Malformed(len, _) => assert!(len > 0 && len <= bytes.len()),
        Decoded::Incomplete | Decoded::Damaged(_) => {}
    }
}

/// A decoded record encodes to a v2 frame that decodes to it again.
fn round_trip(record: &Record<'_>) {
    let mut buf = Vec::new();
    encode(record, &mut buf);
    match decode(Framing::V2, &buf) {
        Decoded::Record(again, len) => {
            assert_eq!(&again, record);
            assert_eq!(len, buf.len());
        }
        other => panic!("{record:?} re-encoded decodes as {other:?}"),
    }
}

/// Walks `data` from `start` to its end, as a whole file and as a chunk.
fn walk(data: &[u8], framing: Framing, start: usize) {
    walk_once(data, framing, start, true);
    walk_once(data, framing, start, false);
}

/// One walk of `data` from `start`; `at_eof` as [`step`] takes it.
fn walk_once(data: &[u8], framing: Framing, start: usize, at_eof: bool) {
    let mut pos = start;
    // Every step moves on by at least one byte, so this bounds the walk.
    for _ in 0..=data.len() + 1 {
        match step(data, pos, framing, at_eof) {
            Step::Record(_, len) | Step::Damaged { len, .. } => {
                assert!(len > 0, "a step of 0 bytes at {pos}");
                assert!(pos + len <= data.len(), "a step past the data at {pos}");
                pos += len;
            }
            Step::End(end) => {
                let left = data.len().saturating_sub(pos);
                match end {
                    End::Clean => assert_eq!(left, 0, "a clean end with bytes left"),
                    End::Torn { len } | End::Damaged { len, .. } => {
                        assert!(len > 0 && len == left, "an end of {len} with {left} left")
                    }
                }
                return;
            }
            Step::NeedMore => {
                assert!(!at_eof, "a whole file asked for more at {pos}");
                return;
            }
        }
    }
    panic!("the walk never ended");
}
