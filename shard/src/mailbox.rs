//! How a shard hands results to a connection task on the same thread: a queue
//! of events plus the task's waker.
//!
//! Bounded by construction, not by a cap: completions by the connection's
//! pending-reply limit, deliveries by its consumers' prefetch.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::Waker;

use ciphermq_proto::NackReason;

use crate::queue::Delivery;

/// The outcome of a command that finished on a (possibly remote) shard.
#[derive(Debug)]
pub enum Completion {
    /// A publish's part: stored (or a duplicate) in its queues, or refused.
    Enqueued(Result<(), NackReason>),
    /// `consume` registered.
    Consumed,
    /// `fetch`: the deliveries, possibly none.
    Fetched(Vec<Delivery>),
    /// `purge_queue`: how many ready messages went, and whether the log
    /// records that keep them gone across a restart were made durable
    /// (they are appended again after a failed commit either way).
    Purged {
        /// Ready messages removed.
        count: u64,
        /// The commit of the purge's records.
        durable: Result<(), NackReason>,
    },
}

/// Something a connection must act on.
#[derive(Debug)]
pub enum ConnEvent {
    /// The command numbered `seq` on this connection finished (or one part of it).
    Completed {
        /// The command's position on its connection.
        seq: u64,
        /// What happened.
        completion: Completion,
    },
    /// A push delivery from a consumed queue.
    Delivery(Delivery),
    /// A queue this connection consumed from, or holds deliveries of, was
    /// deleted: its deliveries of that queue are no longer owed, and a
    /// consumer is told with a pushed line.
    QueueDeleted {
        /// The deleted queue.
        queue: std::sync::Arc<str>,
        /// Whether the connection was one of its consumers.
        consumer: bool,
    },
}

/// One connection's inbox on its shard.
#[derive(Default)]
pub struct Mailbox {
    events: RefCell<VecDeque<ConnEvent>>,
    waker: Cell<Option<Waker>>,
    closed: Cell<bool>,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("events", &self.events.borrow().len())
            .field("closed", &self.closed.get())
            .finish()
    }
}

impl Mailbox {
    /// Queues an event and wakes the connection.
    pub fn push(&self, event: ConnEvent) {
        self.events.borrow_mut().push_back(event);
        self.wake();
    }

    /// Wakes the connection without an event (timeouts, shutdown).
    pub fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Asks the connection to close (kept until it looks).
    pub fn close(&self) {
        self.closed.set(true);
        self.wake();
    }

    /// Whether [`Mailbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Registers the task to wake on the next event. The connection calls
    /// this on every poll: the stored waker is kept when it already wakes the
    /// same task, saving a clone and a drop.
    pub fn register(&self, waker: &Waker) {
        match self.waker.take() {
            Some(current) if current.will_wake(waker) => self.waker.set(Some(current)),
            _ => self.waker.set(Some(waker.clone())),
        }
    }

    /// Moves every pending event into `into`.
    pub fn drain_into(&self, into: &mut VecDeque<ConnEvent>) {
        into.append(&mut self.events.borrow_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_the_task_registered_last_once_per_registration() {
        let (a, b) = (
            Arc::new(Counter(AtomicUsize::new(0))),
            Arc::new(Counter(AtomicUsize::new(0))),
        );
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        let mailbox = Mailbox::default();
        mailbox.register(&wa);
        mailbox.register(&wa);
        mailbox.push(ConnEvent::Completed {
            seq: 1,
            completion: Completion::Consumed,
        });
        mailbox.wake();
        assert_eq!(
            a.0.load(Ordering::SeqCst),
            1,
            "woken once, then unregistered"
        );
        mailbox.register(&wa);
        mailbox.register(&wb);
        mailbox.close();
        assert_eq!(
            (a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)),
            (1, 1)
        );
        assert!(mailbox.is_closed());
        let mut events = VecDeque::new();
        mailbox.drain_into(&mut events);
        assert_eq!(events.len(), 1);
    }
}
