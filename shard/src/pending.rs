//! A value decided on another thread, awaited by a connection task.
//!
//! Slow, rare work (saving the topology) runs off the shards; the command's
//! reply waits in its slot until the value arrives. One value, one waiter:
//! a mutex held for a store or a take, and the waiter's waker.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

#[derive(Debug)]
struct Slot<T> {
    value: Mutex<Option<T>>,
    waker: AtomicWaker,
}

/// The waiting side: a future of the value.
#[derive(Debug)]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
}

/// The deciding side: hand it to the thread that does the work.
#[derive(Debug)]
pub struct Resolver<T> {
    slot: Arc<Slot<T>>,
}

/// A pending value and the resolver that decides it.
pub fn pending<T>() -> (Pending<T>, Resolver<T>) {
    let slot = Arc::new(Slot {
        value: Mutex::new(None),
        waker: AtomicWaker::new(),
    });
    (Pending { slot: slot.clone() }, Resolver { slot })
}

impl<T> Pending<T> {
    /// A value known at once.
    pub fn ready(value: T) -> Pending<T> {
        let (pending, resolver) = pending();
        resolver.resolve(value);
        pending
    }

    /// The value, if it has arrived (taking it).
    pub fn try_take(&mut self) -> Option<T> {
        self.slot
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl<T> Resolver<T> {
    /// Decides the value and wakes the waiter.
    pub fn resolve(self, value: T) {
        *self
            .slot
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(value);
        self.slot.waker.wake();
    }
}

impl<T> Future for Pending<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if let Some(v) = self.try_take() {
            return Poll::Ready(v);
        }
        self.slot.waker.register(cx.waker());
        // A value stored between the check and the registration.
        match self.try_take() {
            Some(v) => Poll::Ready(v),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_resolved_on_another_thread_arrives() {
        let (mut p, r) = pending::<u32>();
        assert_eq!(p.try_take(), None);
        std::thread::spawn(move || r.resolve(7)).join().unwrap();
        assert_eq!(p.try_take(), Some(7));
        assert_eq!(Pending::ready(3).try_take(), Some(3));
    }
}
