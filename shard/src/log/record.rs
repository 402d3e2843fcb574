//! The records of a queue log and their framing.
//!
//! ```text
//! frame v2 = sync:[FF 43 4D FE] len:u32 crc:u32 kind:u8 payload   (little-endian)
//! frame v1 = len:u32 crc:u32 kind:u8 payload                       (read only)
//! len      = 1 + payload length
//! crc v2   = CRC-32C over len (4 bytes), kind and payload
//! crc v1   = CRC-32C over kind and payload
//! kind 4  Message   seq:u64 sent_at_ms:u64 sender_len:u16 sender id_len:u16 id
//!                   exchange_len:u16 exchange key_len:u16 routing_key body…
//! kind 2  Ack       seq:u64 acked_at_ms:u64           (read only: earlier versions)
//! kind 8  Ack       seq:u64 acked_at_ms:u64 key:u128  the acked id's dedup key,
//!                   so a restart restores the dedup window without reading
//!                   the message's record (its body may be far behind)
//! kind 5  Delivered seq:u64 count:u32 delivered_at_ms:u64
//! kind 6  Dedup     (key:u128 acked_at_ms:u64)…   ids acked within the dedup
//!                   window, carried over from segments about to be deleted
//! kind 7  Padding   zeros: stands where recovery moved damaged bytes out
//! kind 9  Purge     upto:u64 (kept:u64)…   `purge_queue`: every message
//!                   below `upto` not acked and not in `kept` (the deliveries
//!                   owed then) left the queue, whether or not its ack record
//!                   follows yet (bodies on disk are settled as they are read)
//! kind 1  Message without route or time (written by earlier versions; read only)
//! kind 3  Delivered without time (written by earlier versions; read only)
//! ```
//!
//! The sync marker holds `FF` and `FE`, bytes that never occur in UTF-8, so it
//! cannot appear inside the text fields and bodies that make up nearly all of
//! a log: after damage, the next frame is found by searching for it and
//! checking the CRC there ([`super::segment`] does the scanning). Covering
//! the length by the CRC means a damaged length is caught, not trusted.
//!
//! Times are Unix milliseconds: the metadata mirror reads them back from the
//! log, so a Postgres outage never needs a memory buffer.

use crate::log::crc;

/// Bytes before the payload of a v2 frame: sync, length, CRC, kind.
pub const HEADER_BYTES: usize = 13;
/// Bytes before the payload of a v1 frame: length, CRC, kind.
pub const V1_HEADER_BYTES: usize = 9;
/// The marker every v2 frame starts with.
pub const SYNC: [u8; 4] = [0xFF, 0x43, 0x4D, 0xFE];
/// Largest record accepted when reading (a length above it is damage).
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;
/// Bytes a message record's length counts besides its body, at most: the
/// kind, seq and time, and four names of at most 255 bytes behind u16
/// lengths.
pub const MESSAGE_OVERHEAD_BYTES: usize = 1 + 16 + 4 * (2 + 255);
/// The largest body a message record can hold.
pub const MAX_BODY_BYTES: usize = MAX_RECORD_BYTES - MESSAGE_OVERHEAD_BYTES;

const KIND_MESSAGE_V1: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_DELIVERED_V1: u8 = 3;
const KIND_MESSAGE: u8 = 4;
const KIND_DELIVERED: u8 = 5;
const KIND_DEDUP: u8 = 6;
const KIND_PADDING: u8 = 7;
const KIND_ACK_KEYED: u8 = 8;
const KIND_PURGE: u8 = 9;
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
        /// The acked id's dedup key (`None` in kind-2 records).
        key: Option<u128>,
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
    /// Filler where damaged bytes were moved out: nothing to read.
    Padding,
    /// A `purge_queue`: the messages below `upto` that were neither acked
    /// nor owed to a consumer (`kept`) left the queue. Their ack records
    /// come later, as the purge settles them (in memory a slice at a time,
    /// on disk as their records are read through); until then this record
    /// is what keeps a restart from bringing them back.
    Purge {
        /// The queue's next sequence number when it was purged.
        upto: u64,
        /// Sequence numbers below `upto` delivered and owed then, ascending.
        kept: PackedSeqs<'a>,
    },
}

/// Sequence numbers packed as little-endian `u64`s, borrowed from a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedSeqs<'a>(&'a [u8]);

impl<'a> PackedSeqs<'a> {
    /// Wraps packed sequence numbers; `None` unless whole ones.
    pub fn new(bytes: &'a [u8]) -> Option<PackedSeqs<'a>> {
        bytes.len().is_multiple_of(8).then_some(PackedSeqs(bytes))
    }

    /// Packs `seqs` into `out`.
    pub fn pack(seqs: &[u64], out: &mut Vec<u8>) {
        for seq in seqs {
            out.extend_from_slice(&seq.to_le_bytes());
        }
    }

    /// The sequence numbers.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.0.chunks_exact(8).map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
    }
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
        DedupEntries::pack_each(entries.iter().copied(), out);
    }

    /// [`DedupEntries::pack`] for entries made on the way.
    fn pack_each(entries: impl Iterator<Item = (u128, u64)>, out: &mut Vec<u8>) {
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

/// Which framing a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Sync marker, and a CRC covering the length (files with the v2 header).
    V2,
    /// Length and CRC only (files of earlier versions, read only).
    V1,
}

impl Framing {
    /// Bytes before the payload.
    pub fn header_bytes(self) -> usize {
        match self {
            Framing::V2 => HEADER_BYTES,
            Framing::V1 => V1_HEADER_BYTES,
        }
    }
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid record of `len` bytes.
    Record(Record<'a>, usize),
    /// A frame whose CRC checks but whose fields do not (written wrong, not
    /// damaged on disk): exactly `len` bytes to skip.
    Malformed(usize, &'static str),
    /// The buffer ends inside a frame that is otherwise plausible so far (or
    /// is shorter than a header).
    Incomplete,
    /// Not a frame here: no sync marker, an impossible length, or a CRC
    /// mismatch. Where the next frame starts is for the scanner to find.
    Damaged(&'static str),
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
    let start = open_frame(out);
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
        Record::Ack {
            seq,
            acked_at_ms,
            key,
        } => {
            out.push(if key.is_some() {
                KIND_ACK_KEYED
            } else {
                KIND_ACK
            });
            put_u64(out, *seq);
            put_u64(out, *acked_at_ms);
            if let Some(key) = key {
                out.extend_from_slice(&key.to_le_bytes());
            }
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
        Record::Padding => out.push(KIND_PADDING),
        Record::Purge { upto, kept } => {
            out.push(KIND_PURGE);
            put_u64(out, *upto);
            out.extend_from_slice(kept.0);
        }
    }
    seal(out, start);
}

/// Appends one dedup record of `entries` (key, acked_at_ms) to `out`,
/// packed straight into it: the bytes of [`encode`] on a
/// [`Record::Dedup`] of [`DedupEntries::pack`]ed entries, without that
/// packed copy. A deleted segment carries tens of thousands of entries,
/// and the shard does this between two of its connections' turns.
pub fn encode_dedup(entries: impl ExactSizeIterator<Item = (u128, u64)>, out: &mut Vec<u8>) {
    out.reserve(HEADER_BYTES + entries.len() * DEDUP_ENTRY_BYTES);
    let start = open_frame(out);
    out.push(KIND_DEDUP);
    DedupEntries::pack_each(entries, out);
    seal(out, start);
}

/// Starts a v2 frame at the end of `out` (sync marker, room for its length
/// and CRC), returning where it starts, for [`seal`] once its kind and
/// fields follow.
fn open_frame(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&SYNC);
    out.extend_from_slice(&[0u8; 8]);
    start
}

/// Bytes of the v2 frame of a message record with these fields: where the
/// next record starts, without encoding it.
pub fn message_record_bytes(
    sender: &str,
    message_id: &str,
    exchange: &str,
    routing_key: &str,
    body_len: u64,
) -> u64 {
    let names = sender.len() + message_id.len() + exchange.len() + routing_key.len();
    (HEADER_BYTES + 16 + 4 * 2 + names) as u64 + body_len
}

/// Fills in the length and CRC of the v2 frame that starts at `start` and
/// runs to the end of `out`.
fn seal(out: &mut [u8], start: usize) {
    let len = ((out.len() - start - 12) as u32).to_le_bytes();
    out[start + 4..start + 8].copy_from_slice(&len);
    let crc = crc::crc32c_of_two(&len, &out[start + 12..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// A padding frame of exactly `total` bytes (at least [`HEADER_BYTES`]) in
/// `framing`: written over a damaged range once its bytes are quarantined,
/// so later reads pass it quietly.
pub fn padding(framing: Framing, total: usize) -> Option<Vec<u8>> {
    let header = framing.header_bytes();
    if total < header || total - header + 1 > MAX_RECORD_BYTES {
        return None;
    }
    let mut out = vec![0u8; total];
    match framing {
        Framing::V2 => {
            out[..4].copy_from_slice(&SYNC);
            out[12] = KIND_PADDING;
            seal(&mut out, 0);
        }
        Framing::V1 => {
            out[8] = KIND_PADDING;
            let len = (total - 8) as u32;
            out[..4].copy_from_slice(&len.to_le_bytes());
            let crc = crc::crc32c(&out[8..]);
            out[4..8].copy_from_slice(&crc.to_le_bytes());
        }
    }
    Some(out)
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
            key: None,
        },
        KIND_ACK_KEYED => Record::Ack {
            seq: c.u64()?,
            acked_at_ms: c.u64()?,
            key: Some(u128::from_le_bytes(c.take(16)?.try_into().ok()?)),
        },
        KIND_DELIVERED => Record::Delivered {
            seq: c.u64()?,
            count: c.u32()?,
            delivered_at_ms: c.u64()?,
        },
        KIND_DEDUP => Record::Dedup(DedupEntries::new(c.rest_bytes())?),
        KIND_PADDING => {
            c.rest_bytes();
            Record::Padding
        }
        KIND_PURGE => Record::Purge {
            upto: c.u64()?,
            kept: PackedSeqs::new(c.rest_bytes())?,
        },
        KIND_DELIVERED_V1 => Record::Delivered {
            seq: c.u64()?,
            count: c.u32()?,
            delivered_at_ms: 0,
        },
        _ => return None,
    };
    c.buf.is_empty().then_some(record)
}

/// Decodes the frame at the start of `buf`.
pub fn decode(framing: Framing, buf: &[u8]) -> Decoded<'_> {
    match framing {
        Framing::V2 => decode_v2(buf),
        Framing::V1 => decode_v1(buf),
    }
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn decode_v2(buf: &[u8]) -> Decoded<'_> {
    let sync_seen = buf.len().min(SYNC.len());
    if buf[..sync_seen] != SYNC[..sync_seen] {
        return Decoded::Damaged("no sync marker");
    }
    if buf.len() < HEADER_BYTES {
        return Decoded::Incomplete;
    }
    let len = read_u32(buf, 4) as usize;
    if len == 0 || len > MAX_RECORD_BYTES {
        return Decoded::Damaged("impossible length");
    }
    let total = 12 + len;
    if buf.len() < total {
        return Decoded::Incomplete;
    }
    let crc = crc::crc32c_of_two(&buf[4..8], &buf[12..total]);
    if crc != read_u32(buf, 8) {
        return Decoded::Damaged("CRC mismatch");
    }
    fields_of(&buf[12..total], total)
}

fn decode_v1(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < V1_HEADER_BYTES {
        return Decoded::Incomplete;
    }
    let len = read_u32(buf, 0) as usize;
    if len == 0 || len > MAX_RECORD_BYTES {
        return Decoded::Damaged("impossible length");
    }
    let total = 8 + len;
    if buf.len() < total {
        return Decoded::Incomplete;
    }
    if crc::crc32c(&buf[8..total]) != read_u32(buf, 4) {
        return Decoded::Damaged("CRC mismatch");
    }
    fields_of(&buf[8..total], total)
}

/// The record in a frame body (kind and payload) whose CRC checked.
fn fields_of(body: &[u8], total: usize) -> Decoded<'_> {
    match fields(body[0], &body[1..]) {
        Some(record) => Decoded::Record(record, total),
        None => Decoded::Malformed(total, "malformed fields"),
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
                key: None,
            },
            Record::Ack {
                seq: 8,
                acked_at_ms: 1_700_000_000_001,
                key: Some(u128::MAX - 5),
            },
            Record::Delivered {
                seq: 7,
                count: 3,
                delivered_at_ms: 1_699_999_999_500,
            },
            Record::Dedup(DedupEntries(&DEDUP_SAMPLE)),
            Record::Purge {
                upto: 9,
                kept: PackedSeqs(&DEDUP_SAMPLE[..16]),
            },
            Record::Purge {
                upto: 0,
                kept: PackedSeqs(&[]),
            },
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

    #[test]
    fn a_dedup_record_encoded_in_place_is_the_packed_one() {
        let entries = [
            (1u128, 2u64),
            (u128::MAX, 7),
            (0x0123_4567_89ab_cdef, u64::MAX),
        ];
        let mut packed = Vec::new();
        DedupEntries::pack(&entries, &mut packed);
        let mut expected = b"before".to_vec();
        encode(
            &Record::Dedup(DedupEntries::new(&packed).unwrap()),
            &mut expected,
        );
        let mut direct = b"before".to_vec();
        encode_dedup(entries.iter().copied(), &mut direct);
        assert_eq!(direct, expected);
        match decode(Framing::V2, &direct[6..]) {
            Decoded::Record(Record::Dedup(e), used) => {
                assert_eq!(used, direct.len() - 6);
                assert_eq!(e.iter().collect::<Vec<_>>(), entries);
            }
            other => panic!("not a dedup record: {other:?}"),
        }
    }

    /// A record as earlier versions wrote it, built by hand.
    fn legacy(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![kind];
        body.extend_from_slice(payload);
        let mut out = Vec::new();
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc::crc32c(&body).to_le_bytes());
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
        assert_eq!(
            decode(Framing::V1, &buf),
            Decoded::Record(expected, buf.len())
        );
        let mut payload = 9u64.to_le_bytes().to_vec();
        payload.extend_from_slice(&4u32.to_le_bytes());
        let buf = legacy(KIND_DELIVERED_V1, &payload);
        let expected = Record::Delivered {
            seq: 9,
            count: 4,
            delivered_at_ms: 0,
        };
        assert_eq!(
            decode(Framing::V1, &buf),
            Decoded::Record(expected, buf.len())
        );
    }

    #[test]
    fn round_trips_every_kind() {
        let mut buf = Vec::new();
        for r in samples() {
            encode(&r, &mut buf);
        }
        let mut rest = &buf[..];
        for expected in samples() {
            match decode(Framing::V2, rest) {
                Decoded::Record(r, n) => {
                    assert_eq!(r, expected);
                    rest = &rest[n..];
                }
                other => panic!("expected a record, got {other:?}"),
            }
        }
        assert_eq!(decode(Framing::V2, rest), Decoded::Incomplete);
    }

    #[test]
    fn a_cut_frame_is_incomplete() {
        let mut buf = Vec::new();
        encode(&samples()[0], &mut buf);
        for cut in 0..buf.len() {
            assert_eq!(
                decode(Framing::V2, &buf[..cut]),
                Decoded::Incomplete,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn every_flipped_bit_is_damage_never_a_record() {
        let mut buf = Vec::new();
        encode(&samples()[0], &mut buf);
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[byte] ^= 1 << bit;
                match decode(Framing::V2, &bad) {
                    Decoded::Damaged(_) | Decoded::Incomplete => {}
                    other => panic!("byte {byte} bit {bit}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn padding_is_a_valid_frame_of_the_asked_size() {
        for framing in [Framing::V1, Framing::V2] {
            for total in [framing.header_bytes(), 100, 4096] {
                let pad = padding(framing, total).unwrap();
                assert_eq!(pad.len(), total);
                assert_eq!(
                    decode(framing, &pad),
                    Decoded::Record(Record::Padding, total)
                );
            }
            assert!(padding(framing, framing.header_bytes() - 1).is_none());
        }
    }

    #[test]
    fn the_largest_body_fits_a_record() {
        let body = "x".repeat(MAX_BODY_BYTES);
        let name = "n".repeat(255);
        let mut buf = Vec::new();
        encode(
            &Record::Message {
                seq: u64::MAX,
                sender: &name,
                message_id: &name,
                exchange: &name,
                routing_key: &name,
                sent_at_ms: 1,
                body: &body,
            },
            &mut buf,
        );
        assert_eq!(buf.len(), MAX_RECORD_BYTES + 12);
        assert!(matches!(decode(Framing::V2, &buf), Decoded::Record(..)));
    }
}
