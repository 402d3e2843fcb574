//! A commit job's bytes, laid out in memory the way they will lie in the file.
//!
//! The committer writes the block-aligned middle of a large job around the
//! page cache (`O_DIRECT`), which needs the memory it writes from to be
//! block-aligned as well. A plain buffer starts wherever the allocator put
//! it, so the middle used to be copied into an aligned staging buffer first:
//! every byte of a fast publisher's rounds copied once more, on the thread
//! the `fdatasync`s wait on. A `LogBuf` starts its bytes `lead` bytes into
//! its allocation, chosen so that an address and the file offset it will be
//! written at agree modulo [`BLOCK`]: the middle can then be written from
//! where the records were encoded.
//!
//! Only an optimisation: when the buffer had to grow (and moved), or the
//! log's end moved under it after a failed job, the addresses no longer
//! agree and the committer copies as before. The bytes written are the same
//! either way.

use std::ops::Deref;

/// The block both file offsets and addresses are aligned to: the largest
/// logical block size in common use, so it suits every device.
pub const BLOCK: usize = 4096;

/// Buffers smaller than this are not laid out (their lead would be a large
/// share of them, and a job that small is not written directly anyway).
pub const LAID_OUT_MIN: usize = 128 << 10;

/// Bytes to append to a log file, placed for a direct write (module doc).
#[derive(Debug, Default)]
pub struct LogBuf {
    /// `lead` bytes of nothing, then the bytes.
    vec: Vec<u8>,
    lead: usize,
}

impl LogBuf {
    /// An empty buffer over `vec`'s allocation (a written one, handed back).
    pub fn from_vec(mut vec: Vec<u8>) -> LogBuf {
        vec.clear();
        LogBuf { vec, lead: 0 }
    }

    /// The allocation, emptied, for a later round.
    pub fn into_vec(self) -> Vec<u8> {
        let mut vec = self.vec;
        vec.clear();
        vec
    }

    /// The allocation's size.
    pub fn capacity(&self) -> usize {
        self.vec.capacity()
    }

    /// Makes room for at least `bytes` bytes and a lead, before the first
    /// append (a buffer that grows later moves and loses its layout).
    pub fn reserve(&mut self, bytes: usize) {
        let lead = if bytes >= LAID_OUT_MIN { BLOCK } else { 0 };
        self.vec.reserve(bytes + lead);
    }

    /// While empty: places the next byte appended where a byte bound for
    /// file offset `offset` belongs (module doc). Does nothing to a buffer
    /// below [`LAID_OUT_MIN`].
    pub fn lay_out_for(&mut self, offset: u64) {
        debug_assert!(self.is_empty(), "laid out with bytes in it");
        self.vec.clear();
        let at = self.vec.as_ptr() as usize;
        // Both sides taken modulo BLOCK, a power of two, so the wrapping
        // subtraction is exact.
        let lead = (offset as usize).wrapping_sub(at) % BLOCK;
        self.lead = if self.vec.capacity() >= LAID_OUT_MIN.max(lead + BLOCK) {
            lead
        } else {
            0
        };
        self.vec.resize(self.lead, 0);
    }

    /// The buffer to encode records into. Encoders only append: what is
    /// already in it stays as it is.
    pub fn appender(&mut self) -> &mut Vec<u8> {
        &mut self.vec
    }
}

impl Deref for LogBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.vec[self.lead..]
    }
}

impl AsRef<[u8]> for LogBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the byte at `i` of `buf` sits at an address that agrees with
    /// file offset `offset + i` modulo the block.
    fn agrees(buf: &LogBuf, offset: u64) -> bool {
        (buf.as_ptr() as usize) % BLOCK == (offset as usize) % BLOCK
    }

    #[test]
    fn a_large_buffer_places_its_bytes_as_the_file_will() {
        for offset in [0u64, 1, 12, 511, 4095, 4096, 4097, 1 << 30, (1 << 30) + 777] {
            let mut buf = LogBuf::default();
            buf.reserve(1 << 20);
            buf.lay_out_for(offset);
            assert!(buf.is_empty());
            buf.appender().extend_from_slice(b"record");
            assert_eq!(&buf[..], b"record");
            assert!(agrees(&buf, offset), "offset {offset}");
        }
    }

    #[test]
    fn a_buffer_handed_back_is_laid_out_again_for_its_next_offset() {
        let mut buf = LogBuf::default();
        buf.reserve(1 << 20);
        buf.lay_out_for(100);
        buf.appender().extend_from_slice(&[7; 5000]);
        let mut again = LogBuf::from_vec(buf.into_vec());
        assert!(again.is_empty());
        again.lay_out_for(5100);
        again.appender().extend_from_slice(&[8; 10]);
        assert_eq!(&again[..], &[8; 10]);
        assert!(agrees(&again, 5100));
    }

    #[test]
    fn a_small_buffer_is_left_as_it_is() {
        let mut buf = LogBuf::default();
        buf.reserve(1000);
        buf.lay_out_for(4000);
        buf.appender().push(1);
        assert_eq!(&buf[..], &[1]);
        assert_eq!(buf.appender().len(), 1, "no lead in a small buffer");
        let mut none = LogBuf::default();
        none.lay_out_for(12);
        assert!(none.is_empty());
        assert_eq!(none.capacity(), 0, "nothing allocated for a lead");
    }
}
