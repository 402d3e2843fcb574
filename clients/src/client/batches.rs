//! What the connection task (`driver`) hands over in batches, and the
//! buffers it reuses: a delivery kept as its line ([`RawDelivery`]), a
//! pipeline's message ids in one buffer ([`PublishIds`]), the write buffers
//! that go round between the publishers and the socket ([`Spares`]).

use crate::client::driver::WRITE_BACKLOG_BYTES;

/// A `Message:` line, kept whole: its fields are ranges of it (no copy of the
/// body per delivery).
#[derive(Debug)]
pub(crate) struct RawDelivery {
    /// `Message: <id> <queue> <count> <body>`.
    line: String,
    /// Where the id is in `line`.
    id: (usize, usize),
    /// Where the queue is in `line`.
    queue: (usize, usize),
    /// Where the body starts in `line`.
    body: usize,
    /// 1 on first delivery, one more on each redelivery.
    pub(crate) count: u32,
}

impl RawDelivery {
    /// Parses a `Message:` line; `None` if it is malformed.
    pub(crate) fn parse(line: String) -> Option<RawDelivery> {
        let d = ciphermq_proto::Delivery::parse(&line)?;
        let base = line.as_ptr() as usize;
        let at = |s: &str| s.as_ptr() as usize - base;
        let id = (at(d.message_id), at(d.message_id) + d.message_id.len());
        let queue = (at(d.queue), at(d.queue) + d.queue.len());
        let body = at(d.body);
        let count = d.delivery_count;
        Some(RawDelivery {
            line,
            id,
            queue,
            body,
            count,
        })
    }

    /// The message id.
    pub(crate) fn id(&self) -> &str {
        &self.line[self.id.0..self.id.1]
    }

    /// The queue it comes from.
    pub(crate) fn queue(&self) -> &str {
        &self.line[self.queue.0..self.queue.1]
    }

    /// The published JSON, unchanged.
    pub(crate) fn body(&self) -> &str {
        &self.line[self.body..]
    }
}

/// The message ids of a pipeline's publishes, in order, in one buffer (one
/// allocation a flush, not one a publish); read from the front as the
/// replies come.
#[derive(Debug, Default)]
pub(crate) struct PublishIds {
    /// The ids, one after the other.
    text: String,
    /// Where each id ends in `text`.
    ends: Vec<usize>,
    /// How many ids were answered already.
    next: usize,
}

impl PublishIds {
    /// An empty list with room for about `ids` ids of `bytes` bytes in all.
    pub(crate) fn with_capacity(ids: usize, bytes: usize) -> PublishIds {
        PublishIds {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(ids),
            next: 0,
        }
    }

    /// Appends an id.
    pub(crate) fn push(&mut self, id: &str) {
        self.text.push_str(id);
        self.ends.push(self.text.len());
    }

    /// Ids not answered yet.
    pub(crate) fn len(&self) -> usize {
        self.ends.len() - self.next
    }

    /// Whether every id was answered (or none was pushed).
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of ids held (for sizing the next list).
    pub(crate) fn text_len(&self) -> usize {
        self.text.len()
    }

    /// The oldest id not answered yet, which now counts as answered.
    pub(crate) fn pop_front(&mut self) -> Option<&str> {
        let end = *self.ends.get(self.next)?;
        let start = match self.next {
            0 => 0,
            n => self.ends[n - 1],
        };
        self.next += 1;
        self.text.get(start..end)
    }
}

impl<'a> FromIterator<&'a str> for PublishIds {
    fn from_iter<I: IntoIterator<Item = &'a str>>(ids: I) -> PublishIds {
        let mut list = PublishIds::default();
        for id in ids {
            list.push(id);
        }
        list
    }
}

/// Most write buffers kept for reuse per connection ([`Spares`]).
const SPARE_BUFFERS: usize = 4;

/// Largest buffer kept for reuse: one huge flush does not pin its memory for
/// the connection's life.
const SPARE_BUFFER_MAX_BYTES: usize = WRITE_BACKLOG_BYTES;

/// Write buffers the task has emptied, for the next [`Op::Many`] to be built
/// in: a publish pipeline flushing hundreds of kilobytes at a time reuses the
/// same few buffers instead of allocating one a flush. At most
/// [`SPARE_BUFFERS`] are kept.
#[derive(Debug, Default)]
pub(crate) struct Spares(std::sync::Mutex<Vec<Vec<u8>>>);

impl Spares {
    /// An empty buffer, with the capacity of one used before if there is one.
    pub(crate) fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .ok()
            .and_then(|mut spares| spares.pop())
            .unwrap_or_default()
    }

    /// Keeps `buf` (emptied) for reuse, unless enough are kept or it is
    /// larger than [`SPARE_BUFFER_MAX_BYTES`].
    pub(crate) fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > SPARE_BUFFER_MAX_BYTES {
            return;
        }
        buf.clear();
        if let Ok(mut spares) = self.0.lock() {
            if spares.len() < SPARE_BUFFERS {
                spares.push(buf);
            }
        }
    }
}
