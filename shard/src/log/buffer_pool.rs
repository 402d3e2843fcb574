//! Written commit buffers, kept for the next rounds' pending bytes.
//!
//! A round's bytes are encoded into one buffer that the committer writes on
//! another thread. Freed there, a buffer of a few hundred KiB or more went
//! back to the kernel, and the next round's buffer was mapped fresh: every
//! page faulted and was zeroed while the shard copied records into it
//! (`clear_page` under `record::encode`, 2% of a shard's samples at 16 KiB
//! bodies, docs/benchmarks-journal.md). The committer hands written buffers back to
//! the shard instead, and a log starting a round takes one of them.
//!
//! What the pool holds is bounded per shard (a few buffers, at most
//! [`MAX_BYTES`] in all) and let go after a quiet second, so idle shards and
//! many-queue shards keep nothing extra. Small buffers are not kept:
//! the allocator reuses those without touching the kernel.

/// Buffers kept at most: a busy log has two rounds in flight, a third
/// being filled.
const MAX_BUFFERS: usize = 4;
/// Bytes of capacity kept at most.
pub const MAX_BYTES: usize = 16 << 20;
/// Smaller buffers are neither kept nor handed out.
pub const MIN_BYTES: usize = 128 << 10;

/// A shard's spare commit buffers.
#[derive(Debug, Default)]
pub struct BufferPool {
    spare: Vec<Vec<u8>>,
    /// Whether a buffer came or went since the last [`BufferPool::tidy`].
    used: bool,
}

impl BufferPool {
    /// Keeps `buf`, emptied, for a later round if it is large and there is
    /// room; a larger one displaces the smallest kept.
    pub fn give(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() < MIN_BYTES || buf.capacity() > MAX_BYTES {
            return;
        }
        buf.clear();
        self.used = true;
        let held: usize = self.spare.iter().map(Vec::capacity).sum();
        if self.spare.len() < MAX_BUFFERS && held + buf.capacity() <= MAX_BYTES {
            self.spare.push(buf);
            return;
        }
        let smallest = (0..self.spare.len()).min_by_key(|&i| self.spare[i].capacity());
        if let Some(i) = smallest {
            let freed = self.spare[i].capacity();
            if freed < buf.capacity() && held - freed + buf.capacity() <= MAX_BYTES {
                self.spare[i] = buf;
            }
        }
    }

    /// The smallest kept buffer of at least `room` bytes, if any.
    pub fn take(&mut self, room: usize) -> Option<Vec<u8>> {
        if room < MIN_BYTES {
            return None;
        }
        let best = (0..self.spare.len())
            .filter(|&i| self.spare[i].capacity() >= room)
            .min_by_key(|&i| self.spare[i].capacity())?;
        self.used = true;
        Some(self.spare.swap_remove(best))
    }

    /// Lets everything go if nothing was given or taken since the last call
    /// (made about once a second).
    pub fn tidy(&mut self) {
        if !self.used {
            self.spare = Vec::new();
        }
        self.used = false;
    }

    /// Bytes of capacity kept.
    pub fn bytes(&self) -> usize {
        self.spare.iter().map(Vec::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_comes_back_with_its_pages() {
        let mut pool = BufferPool::default();
        let mut buf = Vec::with_capacity(1 << 20);
        buf.extend_from_slice(&[7u8; 1000]);
        let at = buf.as_ptr();
        pool.give(buf);
        assert!(pool.take(2 << 20).is_none(), "too small for the room asked");
        let again = pool.take(512 << 10).expect("kept");
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert!(again.is_empty());
        assert_eq!(pool.bytes(), 0);
    }

    #[test]
    fn small_rooms_and_small_buffers_bypass_it() {
        let mut pool = BufferPool::default();
        pool.give(Vec::with_capacity(MIN_BYTES - 1));
        assert_eq!(pool.bytes(), 0);
        pool.give(Vec::with_capacity(MIN_BYTES));
        assert!(pool.take(MIN_BYTES - 1).is_none());
        assert!(pool.take(MIN_BYTES).is_some());
    }

    #[test]
    fn takes_the_smallest_that_fits() {
        let mut pool = BufferPool::default();
        for mib in [4, 1, 2] {
            pool.give(Vec::with_capacity(mib << 20));
        }
        assert_eq!(pool.take(1500 << 10).unwrap().capacity(), 2 << 20);
        assert_eq!(pool.take(1 << 20).unwrap().capacity(), 1 << 20);
        assert_eq!(pool.take(1 << 20).unwrap().capacity(), 4 << 20);
        assert!(pool.take(MIN_BYTES).is_none());
    }

    /// However many buffers come back, the pool never holds more than its
    /// bounds; larger ones displace smaller ones within them.
    #[test]
    fn what_it_holds_is_bounded() {
        let mut pool = BufferPool::default();
        for _ in 0..20 {
            pool.give(Vec::with_capacity(1 << 20));
        }
        assert_eq!(pool.spare.len(), MAX_BUFFERS);
        assert_eq!(pool.bytes(), MAX_BUFFERS << 20);
        pool.give(Vec::with_capacity(6 << 20));
        assert_eq!(pool.bytes(), (MAX_BUFFERS - 1 + 6) << 20);
        for _ in 0..20 {
            pool.give(Vec::with_capacity(6 << 20));
        }
        assert!(pool.bytes() <= MAX_BYTES, "{} bytes held", pool.bytes());
        pool.give(Vec::with_capacity(MAX_BYTES + 1));
        assert!(pool.bytes() <= MAX_BYTES);
        assert!(pool.spare.iter().all(|b| b.capacity() <= MAX_BYTES));
    }

    /// A quiet second lets everything go; a busy one keeps it.
    #[test]
    fn a_quiet_pool_lets_go() {
        let mut pool = BufferPool::default();
        pool.give(Vec::with_capacity(1 << 20));
        pool.tidy();
        assert_eq!(pool.bytes(), 1 << 20, "used since the last tidy");
        pool.tidy();
        assert_eq!(pool.bytes(), 0, "quiet since the last tidy");
    }
}
