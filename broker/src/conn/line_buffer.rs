//! Splits decrypted bytes into request lines, enforcing the line-length limit:
//! an over-long line is reported once and discarded up to its newline, and the
//! connection stays usable.
//!
//! Also home of [`ReadBuffer`], the byte buffer behind both the line buffer
//! and the TLS session's ciphertext: it zeroes memory only when it grows, and
//! frees it only when its connection parks idle.

/// Buffers larger than this are shrunk when their connection parks idle, and
/// an empty buffer of any size is freed then, so an idle connection costs
/// little memory.
pub(crate) const IDLE_BUFFER_BYTES: usize = 16 * 1024;

/// Bytes appended by reads at the end and consumed from the front.
///
/// Safe Rust can only read into initialized memory, so room for a read must be
/// zeroed first. This buffer zeroes each byte once, when it first grows to
/// cover it: the `Vec`'s length is its initialized size, and the data is the
/// separate range `start..end`. Consumed space is reused by moving the
/// unconsumed tail to the front (`copy_within`), never by reallocating.
#[derive(Debug, Default)]
pub(crate) struct ReadBuffer {
    /// Storage: `buf.len()` bytes are initialized, `buf[start..end]` is data.
    buf: Vec<u8>,
    /// First byte not yet consumed.
    start: usize,
    /// End of the data.
    end: usize,
}

impl ReadBuffer {
    /// A buffer holding a copy of `data`.
    pub(crate) fn from_slice(data: &[u8]) -> ReadBuffer {
        ReadBuffer {
            buf: data.to_vec(),
            start: 0,
            end: data.len(),
        }
    }

    /// The unconsumed bytes.
    #[inline]
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// How many unconsumed bytes there are.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether every byte was consumed.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Bytes of memory held (for tests and memory accounting).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Marks the first `n` unconsumed bytes as consumed.
    #[inline]
    pub(crate) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len(), "consumed {n} of {} bytes", self.len());
        self.start = (self.start + n).min(self.end);
    }

    /// Room for at least `want` more bytes: everything initialized past the
    /// data. Call [`ReadBuffer::commit`] with how many were written.
    pub(crate) fn spare(&mut self, want: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < want && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < want {
            // Zeroes only the bytes never initialized before.
            self.buf.resize(self.end + want, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Appends `written` bytes of the last [`ReadBuffer::spare`].
    #[inline]
    pub(crate) fn commit(&mut self, written: usize) {
        debug_assert!(self.end + written <= self.buf.len());
        self.end = (self.end + written).min(self.buf.len());
    }

    /// Gives memory back before the connection parks: frees the buffer when
    /// it holds no data, and moves a little data out of a large buffer into
    /// one of its size.
    pub(crate) fn release_idle(&mut self) {
        let len = self.len();
        if len == 0 {
            *self = ReadBuffer::default();
        } else if self.buf.capacity() > IDLE_BUFFER_BYTES && len <= self.buf.capacity() / 2 {
            *self = ReadBuffer::from_slice(self.data());
        }
    }
}

/// What the next call to [`LineBuffer::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A complete line, without `\n` (a trailing `\r` is left for the parser).
    Complete(&'a [u8]),
    /// A line passed the limit: answer `Error: line too long` (once per line).
    TooLong,
    /// No complete line buffered.
    Incomplete,
}

/// Buffered plaintext of one connection.
#[derive(Debug)]
pub(crate) struct LineBuffer {
    /// Bytes not yet returned as lines.
    data: ReadBuffer,
    /// Bytes of `data` already searched for a newline.
    scanned: usize,
    /// Longest line accepted, newline excluded.
    max_line: usize,
    /// Inside an over-long line: drop bytes until its newline.
    discarding: bool,
}

impl LineBuffer {
    /// A buffer for lines of at most `max_line` bytes (newline excluded). It
    /// allocates nothing until the first [`LineBuffer::spare`].
    pub(crate) fn new(max_line: usize) -> LineBuffer {
        LineBuffer {
            data: ReadBuffer::default(),
            scanned: 0,
            max_line,
            discarding: false,
        }
    }

    /// Room to append at least `want` bytes into; call [`LineBuffer::commit`]
    /// with what was written. Memory is zeroed only when the buffer grows.
    #[inline]
    pub(crate) fn spare(&mut self, want: usize) -> &mut [u8] {
        self.data.spare(want)
    }

    /// Keeps `written` bytes of the last [`LineBuffer::spare`].
    #[inline]
    pub(crate) fn commit(&mut self, written: usize) {
        self.data.commit(written);
    }

    /// Frees or shrinks the buffer before the connection parks idle (see
    /// [`ReadBuffer::release_idle`]).
    pub(crate) fn release_idle(&mut self) {
        self.data.release_idle();
    }

    /// Buffered bytes not yet returned as lines.
    pub(crate) fn buffered(&self) -> usize {
        self.data.len()
    }

    /// Bytes of memory held.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// Whether more input can be taken without passing the limit by much.
    pub(crate) fn wants_input(&self) -> bool {
        self.buffered() <= self.max_line + 1
    }

    /// The next line, a too-long notice, or `Incomplete`.
    pub(crate) fn next_line(&mut self) -> Line<'_> {
        loop {
            let pending = self.data.data();
            let found = memchr::memchr(b'\n', &pending[self.scanned..]).map(|i| i + self.scanned);
            match found {
                Some(i) => {
                    let line_start = self.data.start;
                    self.data.consume(i + 1);
                    self.scanned = 0;
                    if self.discarding {
                        self.discarding = false;
                        continue;
                    }
                    if i > self.max_line {
                        // Too long, though its newline came in the same read.
                        return Line::TooLong;
                    }
                    return Line::Complete(&self.data.buf[line_start..line_start + i]);
                }
                None => {
                    let len = pending.len();
                    if self.discarding {
                        self.data.consume(len);
                        self.scanned = 0;
                        return Line::Incomplete;
                    }
                    if len > self.max_line {
                        self.discarding = true;
                        self.data.consume(len);
                        self.scanned = 0;
                        return Line::TooLong;
                    }
                    self.scanned = len;
                    return Line::Incomplete;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lb: &mut LineBuffer, data: &[u8]) {
        let spare = lb.spare(data.len());
        spare[..data.len()].copy_from_slice(data);
        lb.commit(data.len());
    }

    fn drain(lb: &mut LineBuffer, out: &mut Vec<Vec<u8>>) {
        loop {
            match lb.next_line() {
                Line::Complete(line) => out.push(line.to_vec()),
                Line::TooLong => out.push(b"<too long>".to_vec()),
                Line::Incomplete => return,
            }
        }
    }

    #[test]
    fn splits_lines_across_reads() {
        let mut lb = LineBuffer::new(100);
        feed(&mut lb, b"heart");
        assert_eq!(lb.next_line(), Line::Incomplete);
        feed(&mut lb, b"beat\r");
        assert_eq!(lb.next_line(), Line::Incomplete);
        feed(&mut lb, b"\nquit\n\n");
        assert_eq!(lb.next_line(), Line::Complete(b"heartbeat\r"));
        assert_eq!(lb.next_line(), Line::Complete(b"quit"));
        assert_eq!(lb.next_line(), Line::Complete(b""));
        assert_eq!(lb.next_line(), Line::Incomplete);
        assert_eq!(lb.buffered(), 0);
    }

    #[test]
    fn too_long_lines_are_reported_once_and_skipped() {
        let mut lb = LineBuffer::new(10);
        feed(&mut lb, &[b'x'; 25]);
        assert_eq!(lb.next_line(), Line::TooLong);
        assert_eq!(lb.next_line(), Line::Incomplete);
        feed(&mut lb, &[b'x'; 25]);
        assert_eq!(lb.next_line(), Line::Incomplete, "still the same line");
        feed(&mut lb, b"xxxxx\nheartbeat\n");
        assert_eq!(lb.next_line(), Line::Complete(b"heartbeat"));
        let mut exact = LineBuffer::new(4);
        feed(&mut exact, b"abcd\nabcde\nok\n");
        assert_eq!(exact.next_line(), Line::Complete(b"abcd"));
        assert_eq!(exact.next_line(), Line::TooLong, "newline in the same read");
        assert_eq!(exact.next_line(), Line::Complete(b"ok"));
    }

    /// Lines of varied lengths fed in reads of every size from 1 byte to
    /// past the buffer: each line comes out whole, once, in order, and the
    /// buffer stays near one read plus one partial line.
    #[test]
    fn any_read_size_yields_the_same_lines_in_bounded_memory() {
        let lines: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("publish ex key {}", "y".repeat(i * 7 % 300)).into_bytes())
            .collect();
        let stream: Vec<u8> = lines
            .iter()
            .flat_map(|l| l.iter().chain(b"\n"))
            .copied()
            .collect();
        for read in [1, 7, 100, 1000, 4096, 65_536] {
            let mut lb = LineBuffer::new(400);
            let mut out = Vec::new();
            for chunk in stream.chunks(read) {
                feed(&mut lb, chunk);
                drain(&mut lb, &mut out);
                assert!(
                    lb.capacity() <= 2 * (read + 400 + 1),
                    "read {read}: {} bytes held",
                    lb.capacity()
                );
            }
            assert_eq!(out, lines, "read size {read}");
        }
    }

    /// Consumed space is reused: the partial line moves to the front, and
    /// memory is not initialized again.
    #[test]
    fn compacts_instead_of_growing_or_zeroing_again() {
        let mut lb = LineBuffer::new(100);
        feed(&mut lb, b"first line\nsec");
        assert_eq!(lb.next_line(), Line::Complete(b"first line"));
        assert_eq!(lb.next_line(), Line::Incomplete);
        let initialized = lb.data.buf.len();
        // Room for 8 more bytes needs the 11 consumed ones: the tail moves.
        let spare = lb.spare(8);
        assert!(spare.len() >= 8);
        spare[..8].copy_from_slice(b"ond\nthir");
        lb.commit(8);
        assert_eq!(lb.data.buf.len(), initialized, "no growth, no zeroing");
        assert_eq!(lb.data.start, 0);
        assert_eq!(lb.next_line(), Line::Complete(b"second"));
        // Reads that bring nothing cost nothing.
        for _ in 0..10 {
            let _ = lb.spare(4);
            lb.commit(0);
        }
        assert_eq!(lb.data.buf.len(), initialized);
        assert_eq!(lb.buffered(), 4);
    }

    #[test]
    fn parked_connections_give_their_memory_back() {
        let mut lb = LineBuffer::new(1000);
        let _ = lb.spare(64 * 1024);
        lb.commit(0);
        assert!(lb.capacity() >= 64 * 1024);
        lb.release_idle();
        assert_eq!(lb.capacity(), 0, "empty: freed");

        // A partial line in a large buffer moves to a small one.
        feed(&mut lb, b"done\n");
        let spare = lb.spare(64 * 1024);
        spare[..7].copy_from_slice(b"partial");
        lb.commit(7);
        assert_eq!(lb.next_line(), Line::Complete(b"done"));
        assert_eq!(lb.next_line(), Line::Incomplete);
        lb.release_idle();
        assert!(
            lb.capacity() <= IDLE_BUFFER_BYTES,
            "{} bytes held",
            lb.capacity()
        );
        feed(&mut lb, b" line\n");
        assert_eq!(lb.next_line(), Line::Complete(b"partial line"));

        // A small buffer with data in it stays as it is.
        feed(&mut lb, b"abc");
        let before = lb.capacity();
        lb.release_idle();
        assert_eq!(lb.capacity(), before);
        assert_eq!(lb.buffered(), 3);
    }

    #[test]
    fn a_read_buffer_starts_from_leftover_bytes() {
        let mut b = ReadBuffer::from_slice(b"hello");
        assert_eq!(b.data(), b"hello");
        b.consume(2);
        let spare = b.spare(3);
        spare[..3].copy_from_slice(b"!!!");
        b.commit(3);
        assert_eq!(b.data(), b"llo!!!");
        b.consume(6);
        assert!(b.is_empty());
        b.release_idle();
        assert_eq!(b.capacity(), 0);
    }
}
