//! The on-disk record format of a queue log.
//!
//! ```text
//! record  = len:u32 crc:u32 kind:u8 payload      (little-endian)
//! len     = 1 + payload length
//! crc     = CRC-32C over kind and payload
//! kind 4  Message   seq:u64 sent_at_ms:u64 sender_len:u16 sender id_len:u16 id
//!                   exchange_len:u16 exchange key_len:u16 routing_key body…
//! kind 2  Ack       seq:u64 acked_at_ms:u64
//! kind 5  Delivered seq:u64 count:u32 delivered_at_ms:u64
//! kind 6  Dedup     (key:u128 acked_at_ms:u64)…   ids acked within the dedup
//!                   window, carried over from segments about to be deleted
//! kind 1  Message without route or time (written by earlier versions; read only)
//! kind 3  Delivered without time (written by earlier versions; read only)
//! ```
//!
//! Times are Unix milliseconds: the metadata mirror reads them back from the
//! log, so a Postgres outage never needs a memory buffer.
//!
//! Decoding tells a torn tail (the record runs past the end of the data: a
//! crash during a write) from a corrupt record (its CRC does not match while
//! its length fits): the first is truncated on open, the second reported and
//! skipped, never served.

/// Bytes before the payload: length, CRC, kind.
pub const HEADER_BYTES: usize = 9;
/// Largest record accepted when reading (a length above it is corruption).
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;

const KIND_MESSAGE_V1: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_DELIVERED_V1: u8 = 3;
const KIND_MESSAGE: u8 = 4;
const KIND_DELIVERED: u8 = 5;
const KIND_DEDUP: u8 = 6;
/// Bytes of one entry of a dedup record.
pub const DEDUP_ENTRY_BYTES: usize = 24;

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
        /// The exchange it was published to (empty in kind-1 records).
        exchange: &'a str,
        /// Its routing key (empty in kind-1 records).
        routing_key: &'a str,
        /// When the broker accepted it, Unix ms (0 in kind-1 records).
        sent_at_ms: u64,
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
        /// When this delivery was made, Unix ms (0 in kind-3 records).
        delivered_at_ms: u64,
    },
    /// Dedup entries (sender/id hash, ack time) whose messages' segments are
    /// deleted: the dedup window outlives the segments.
    Dedup(DedupEntries<'a>),
}

/// The packed entries of a dedup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupEntries<'a>(&'a [u8]);

impl<'a> DedupEntries<'a> {
    /// Wraps packed entries; `None` unless whole entries.
    pub fn new(bytes: &'a [u8]) -> Option<DedupEntries<'a>> {
        bytes
            .len()
            .is_multiple_of(DEDUP_ENTRY_BYTES)
            .then_some(DedupEntries(bytes))
    }

    /// Packs `entries` (key, acked_at_ms) into `out`.
    pub fn pack(entries: &[(u128, u64)], out: &mut Vec<u8>) {
        for (key, at) in entries {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&at.to_le_bytes());
        }
    }

    /// The entries: (key, acked_at_ms).
    pub fn iter(&self) -> impl Iterator<Item = (u128, u64)> + 'a {
        self.0.chunks_exact(DEDUP_ENTRY_BYTES).map(|c| {
            let mut key = [0u8; 16];
            key.copy_from_slice(&c[..16]);
            let mut at = [0u8; 8];
            at.copy_from_slice(&c[16..]);
            (u128::from_le_bytes(key), u64::from_le_bytes(at))
        })
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.0.len() / DEDUP_ENTRY_BYTES
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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
            exchange,
            routing_key,
            sent_at_ms,
            body,
        } => {
            out.push(KIND_MESSAGE);
            put_u64(out, *seq);
            put_u64(out, *sent_at_ms);
            for field in [sender, message_id, exchange, routing_key] {
                put_u16(out, field.len() as u16);
                out.extend_from_slice(field.as_bytes());
            }
            out.extend_from_slice(body.as_bytes());
        }
        Record::Ack { seq, acked_at_ms } => {
            out.push(KIND_ACK);
            put_u64(out, *seq);
            put_u64(out, *acked_at_ms);
        }
        Record::Delivered {
            seq,
            count,
            delivered_at_ms,
        } => {
            out.push(KIND_DELIVERED);
            put_u64(out, *seq);
            put_u32(out, *count);
            put_u64(out, *delivered_at_ms);
        }
        Record::Dedup(entries) => {
            out.push(KIND_DEDUP);
            out.extend_from_slice(entries.0);
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
    /// A `u16` length and that many bytes of UTF-8.
    fn field(&mut self) -> Option<&'a str> {
        let n = self.u16()? as usize;
        self.str(n)
    }
    /// Everything left.
    fn rest_bytes(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    /// Everything left, as UTF-8.
    fn rest(&mut self) -> Option<&'a str> {
        let rest = std::mem::take(&mut self.buf);
        std::str::from_utf8(rest).ok()
    }
}

fn fields(kind: u8, payload: &[u8]) -> Option<Record<'_>> {
    let mut c = Cursor { buf: payload };
    let record = match kind {
        KIND_MESSAGE => {
            let seq = c.u64()?;
            let sent_at_ms = c.u64()?;
            let sender = c.field()?;
            let message_id = c.field()?;
            let exchange = c.field()?;
            let routing_key = c.field()?;
            Record::Message {
                seq,
                sender,
                message_id,
                exchange,
                routing_key,
                sent_at_ms,
                body: c.rest()?,
            }
        }
        KIND_MESSAGE_V1 => {
            let seq = c.u64()?;
            let sender = c.field()?;
            let message_id = c.field()?;
            Record::Message {
                seq,
                sender,
                message_id,
                exchange: "",
                routing_key: "",
                sent_at_ms: 0,
                body: c.rest()?,
            }
        }
        KIND_ACK => Record::Ack {
            seq: c.u64()?,
            acked_at_ms: c.u64()?,
        },
        KIND_DELIVERED => Record::Delivered {
            seq: c.u64()?,
            count: c.u32()?,
            delivered_at_ms: c.u64()?,
        },
        KIND_DEDUP => Record::Dedup(DedupEntries::new(c.rest_bytes())?),
        KIND_DELIVERED_V1 => Record::Delivered {
            seq: c.u64()?,
            count: c.u32()?,
            delivered_at_ms: 0,
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
                exchange: "orders",
                routing_key: "eu.new",
                sent_at_ms: 1_699_999_999_000,
                body: "{\"a\": \"b c\"}",
            },
            Record::Ack {
                seq: 7,
                acked_at_ms: 1_700_000_000_000,
            },
            Record::Delivered {
                seq: 7,
                count: 3,
                delivered_at_ms: 1_699_999_999_500,
            },
            Record::Dedup(DedupEntries(&DEDUP_SAMPLE)),
        ]
    }

    const DEDUP_SAMPLE: [u8; 48] = {
        let mut b = [0u8; 48];
        b[0] = 1;
        b[16] = 2;
        b[24] = 3;
        b[40] = 4;
        b
    };

    #[test]
    fn dedup_entries_pack_and_unpack() {
        let mut buf = Vec::new();
        DedupEntries::pack(&[(1, 2), (u128::MAX, 7)], &mut buf);
        let e = DedupEntries::new(&buf).unwrap();
        assert_eq!(e.iter().collect::<Vec<_>>(), vec![(1, 2), (u128::MAX, 7)]);
        assert!(DedupEntries::new(&buf[1..]).is_none());
    }

    /// A record as earlier versions wrote it, built by hand.
    fn legacy(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![kind];
        body.extend_from_slice(payload);
        let mut out = Vec::new();
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn reads_records_of_earlier_versions() {
        let mut payload = 9u64.to_le_bytes().to_vec();
        payload.extend_from_slice(&2u16.to_le_bytes());
        payload.extend_from_slice(b"s1");
        payload.extend_from_slice(&2u16.to_le_bytes());
        payload.extend_from_slice(b"m9");
        payload.extend_from_slice(b"{}");
        let buf = legacy(KIND_MESSAGE_V1, &payload);
        let expected = Record::Message {
            seq: 9,
            sender: "s1",
            message_id: "m9",
            exchange: "",
            routing_key: "",
            sent_at_ms: 0,
            body: "{}",
        };
        assert_eq!(decode(&buf), Decoded::Record(expected, buf.len()));
        let mut payload = 9u64.to_le_bytes().to_vec();
        payload.extend_from_slice(&4u32.to_le_bytes());
        let buf = legacy(KIND_DELIVERED_V1, &payload);
        let expected = Record::Delivered {
            seq: 9,
            count: 4,
            delivered_at_ms: 0,
        };
        assert_eq!(decode(&buf), Decoded::Record(expected, buf.len()));
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
