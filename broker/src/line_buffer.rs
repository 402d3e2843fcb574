//! Splits decrypted bytes into request lines, enforcing the line-length limit:
//! an over-long line is reported once and discarded up to its newline, and the
//! connection stays usable.

/// What the next call to [`LineBuffer::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A complete line, without `\n` (a trailing `\r` is left for the parser).
    Complete(&'a [u8]),
    /// A line passed the limit: answer `Error: line too long` (once per line).
    TooLong,
    /// No complete line buffered.
    Incomplete,
}

/// Buffered plaintext of one connection.
#[derive(Debug)]
pub struct LineBuffer {
    buf: Vec<u8>,
    start: usize,
    /// Bytes of `buf[start..]` already searched for a newline.
    scanned: usize,
    max_line: usize,
    /// Inside an over-long line: drop bytes until its newline.
    discarding: bool,
}

impl LineBuffer {
    /// A buffer for lines of at most `max_line` bytes (newline excluded).
    pub fn new(max_line: usize) -> LineBuffer {
        LineBuffer {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max_line,
            discarding: false,
        }
    }

    /// Room to append into; call [`LineBuffer::commit`] with what was written.
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        if self.start > 0 && (self.start == self.buf.len() || self.start > self.buf.capacity() / 2)
        {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + want, 0);
        &mut self.buf[len..]
    }

    /// Keeps `written` bytes of the last [`LineBuffer::spare`] and drops the rest.
    pub fn commit(&mut self, want: usize, written: usize) {
        let len = self.buf.len() - want + written;
        self.buf.truncate(len);
        self.release_if_empty();
    }

    /// Frees a large buffer with nothing in it, so idle connections stay small.
    fn release_if_empty(&mut self) {
        if self.start == self.buf.len() && !self.discarding && self.buf.capacity() > 16 * 1024 {
            self.buf = Vec::new();
            self.start = 0;
            self.scanned = 0;
        }
    }

    /// Buffered bytes not yet returned as lines.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether more input can be taken without passing the limit by much.
    pub fn wants_input(&self) -> bool {
        self.buffered() <= self.max_line + 1
    }

    /// The next line, a too-long notice, or `Incomplete`.
    pub fn next_line(&mut self) -> Line<'_> {
        loop {
            let pending = &self.buf[self.start..];
            let found = memchr_newline(&pending[self.scanned..]).map(|i| i + self.scanned);
            match found {
                Some(i) => {
                    let line_start = self.start;
                    self.start += i + 1;
                    self.scanned = 0;
                    if self.discarding {
                        self.discarding = false;
                        continue;
                    }
                    if i > self.max_line {
                        // Too long, though its newline came in the same read.
                        return Line::TooLong;
                    }
                    return Line::Complete(&self.buf[line_start..line_start + i]);
                }
                None => {
                    self.scanned = pending.len();
                    if self.discarding {
                        self.start = self.buf.len();
                        self.scanned = 0;
                        return Line::Incomplete;
                    }
                    if pending.len() > self.max_line {
                        self.discarding = true;
                        self.start = self.buf.len();
                        self.scanned = 0;
                        return Line::TooLong;
                    }
                    return Line::Incomplete;
                }
            }
        }
    }
}

#[inline]
fn memchr_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lb: &mut LineBuffer, data: &[u8]) {
        let spare = lb.spare(data.len());
        spare.copy_from_slice(data);
        lb.commit(data.len(), data.len());
    }

    #[test]
    fn splits_lines_across_reads() {
        let mut lb = LineBuffer::new(100);
        feed(&mut lb, b"heart");
        assert_eq!(lb.next_line(), Line::Incomplete);
        feed(&mut lb, b"beat\r\nquit\n\n");
        assert_eq!(lb.next_line(), Line::Complete(b"heartbeat\r"));
        assert_eq!(lb.next_line(), Line::Complete(b"quit"));
        assert_eq!(lb.next_line(), Line::Complete(b""));
        assert_eq!(lb.next_line(), Line::Incomplete);
    }

    #[test]
    fn too_long_lines_are_reported_once_and_skipped() {
        let mut lb = LineBuffer::new(10);
        feed(&mut lb, &[b'x'; 25]);
        assert_eq!(lb.next_line(), Line::TooLong);
        assert_eq!(lb.next_line(), Line::Incomplete);
        feed(&mut lb, b"xxxxx\nheartbeat\n");
        assert_eq!(lb.next_line(), Line::Complete(b"heartbeat"));
        let mut exact = LineBuffer::new(4);
        feed(&mut exact, b"abcd\nabcde\nok\n");
        assert_eq!(exact.next_line(), Line::Complete(b"abcd"));
        assert_eq!(exact.next_line(), Line::TooLong, "newline in the same read");
        assert_eq!(exact.next_line(), Line::Complete(b"ok"));
    }
}
