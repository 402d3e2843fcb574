//! The on-disk record format of a queue log.
//!
//! ```text
//! record  = len:u32 crc:u32 kind:u8 payload      (little-endian)
//! len     = 1 + payload length
//! crc     = CRC-32C over kind and payload
//! kind 1  Message   seq:u64 sender_len:u16 sender id_len:u16 id body…
//! kind 2  Ack       seq:u64 acked_at_ms:u64
//! kind 3  Delivered seq:u64 count:u32
//! ```
//!
//! Decoding tells a torn tail (the record runs past the end of the data: a
//! crash during a write) from a corrupt record (its CRC does not match while
//! its length fits): the first is truncated on open, the second reported and
//! skipped, never served.

/// Bytes before the payload: length, CRC, kind.
pub const HEADER_BYTES: usize = 9;
/// Largest record accepted when reading (a length above it is corruption).
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;

const KIND_MESSAGE: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_DELIVERED: u8 = 3;

/// One decoded record, borrowing from the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A stored message.
    Message {
        /// Position in the queue.
        seq: u64,
        /// Publisher CN.
        sender: &'a str,
        /// Message id.
        message_id: &'a str,
        /// JSON body.
        body: &'a str,
    },
    /// The message `seq` was acked (or dead-lettered) at `acked_at_ms` (Unix ms).
    Ack {
        /// Position in the queue.
        seq: u64,
        /// When, for the dedup window.
        acked_at_ms: u64,
    },
    /// The message `seq` has been delivered `count` times.
    Delivered {
        /// Position in the queue.
        seq: u64,
        /// Deliveries so far.
        count: u32,
    },
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid record of `len` bytes.
    Record(Record<'a>, usize),
    /// The buffer ends inside a record (or is empty).
    Torn,
    /// `len` bytes that are not a valid record (bad CRC, unknown kind, bad
    /// fields); reading may continue after them.
    Corrupt(usize, &'static str),
    /// The header's length is impossible: nothing after it can be trusted.
    BadLength,
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `record` to `out`.
pub fn encode(record: &Record<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 8]);
    match record {
        Record::Message {
            seq,
            sender,
            message_id,
            body,
        } => {
            out.push(KIND_MESSAGE);
            put_u64(out, *seq);
            put_u16(out, sender.len() as u16);
            out.extend_from_slice(sender.as_bytes());
            put_u16(out, message_id.len() as u16);
            out.extend_from_slice(message_id.as_bytes());
            out.extend_from_slice(body.as_bytes());
        }
        Record::Ack { seq, acked_at_ms } => {
            out.push(KIND_ACK);
            put_u64(out, *seq);
            put_u64(out, *acked_at_ms);
        }
        Record::Delivered { seq, count } => {
            out.push(KIND_DELIVERED);
            put_u64(out, *seq);
            put_u32(out, *count);
        }
    }
    let len = (out.len() - start - 8) as u32;
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self, n: usize) -> Option<&'a str> {
        std::str::from_utf8(self.take(n)?).ok()
    }
}

fn fields(kind: u8, payload: &[u8]) -> Option<Record<'_>> {
    let mut c = Cursor { buf: payload };
    let record = match kind {
        KIND_MESSAGE => {
            let seq = c.u64()?;
            let sender_len = c.u16()? as usize;
            let sender = c.str(sender_len)?;
            let id_len = c.u16()? as usize;
            let message_id = c.str(id_len)?;
            let body = std::str::from_utf8(c.buf).ok()?;
            c.buf = &[];
            Record::Message {
                seq,
                sender,
                message_id,
                body,
            }
        }
        KIND_ACK => Record::Ack {
            seq: c.u64()?,
            acked_at_ms: c.u64()?,
        },
        KIND_DELIVERED => Record::Delivered {
            seq: c.u64()?,
            count: c.u32()?,
        },
        _ => return None,
    };
    c.buf.is_empty().then_some(record)
}

/// Decodes the record at the start of `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < HEADER_BYTES {
        return Decoded::Torn;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 || len > MAX_RECORD_BYTES {
        return Decoded::BadLength;
    }
    let total = 8 + len;
    if buf.len() < total {
        return Decoded::Torn;
    }
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let body = &buf[8..total];
    if crc32c::crc32c(body) != crc {
        return Decoded::Corrupt(total, "CRC mismatch");
    }
    match fields(body[0], &body[1..]) {
        Some(record) => Decoded::Record(record, total),
        None => Decoded::Corrupt(total, "malformed fields"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record<'static>> {
        vec![
            Record::Message {
                seq: 7,
                sender: "sender_1",
                message_id: "m-7",
                body: "{\"a\": \"b c\"}",
            },
            Record::Ack {
                seq: 7,
                acked_at_ms: 1_700_000_000_000,
            },
            Record::Delivered { seq: 7, count: 3 },
        ]
    }

    #[test]
    fn round_trips_every_kind() {
        let mut buf = Vec::new();
        for r in samples() {
            encode(&r, &mut buf);
        }
        let mut rest = &buf[..];
        for expected in samples() {
            match decode(rest) {
                Decoded::Record(r, n) => {
                    assert_eq!(r, expected);
                    rest = &rest[n..];
                }
                other => panic!("expected a record, got {other:?}"),
            }
        }
        assert_eq!(decode(rest), Decoded::Torn);
    }

    #[test]
    fn a_cut_record_is_torn() {
        let mut buf = Vec::new();
        encode(&samples()[0], &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(decode(&buf[..cut]), Decoded::Torn, "cut at {cut}");
        }
    }

    #[test]
    fn a_flipped_bit_is_corrupt_not_served() {
        let mut buf = Vec::new();
        encode(&samples()[0], &mut buf);
        let total = buf.len();
        for byte in 8..total {
            let mut bad = buf.clone();
            bad[byte] ^= 0x10;
            assert!(
                matches!(decode(&bad), Decoded::Corrupt(n, _) if n == total),
                "byte {byte}"
            );
        }
        let mut bad_len = buf.clone();
        bad_len[3] = 0xff;
        assert_eq!(decode(&bad_len), Decoded::BadLength);
    }
}
