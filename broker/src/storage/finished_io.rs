//! Lets a busy shard notice a finished commit write before glommio does.
//!
//! glommio hears of a blocking-I/O call's end only when its reactor polls,
//! and a busy shard's reactor polls only once its task queues run dry or
//! the preempt timer fires. Publishing a window of 1,000 alone, a round's
//! `fdatasync` took 0.27 ms and its end then waited another 0.55 ms, on
//! average, to be noticed, while the publisher's window sat in the round
//! (docs/DECISIONS.md, "A finished commit write is noticed in the middle
//! of a long burst").
//!
//! So a commit write run through [`FinishedIo::run`] also leaves its result
//! in a slot of its own and counts itself finished in a counter the shard
//! shares with its blocking-I/O thread. A connection deep in a burst looks
//! at the counter every few lines ([`FinishedIo::wake_finished`]: one
//! atomic load while nothing finished) and, when it counts a finished call
//! no run has taken yet, wakes whoever waits and ends its task queue's
//! turn, so the committer answers the round at once (`connection.rs`).
//! glommio's own completion still wakes the waiter when the shard is idle,
//! so nothing depends on a connection looking.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

/// Wakers kept at most while runs overlap. Each distinct waiting task is
/// kept once, and all are forgotten whenever no run is under way; past
/// this many, all are woken and forgotten: a spurious wake costs a task
/// one poll.
const MAX_WAITING: usize = 16;

/// One shard's finished-call counter and the tasks waiting on its calls.
#[derive(Debug, Default)]
pub(crate) struct FinishedIo {
    /// Calls finished, counted by the blocking-I/O thread.
    finished: Arc<AtomicU64>,
    /// Calls whose run ended on the shard (result taken, or dropped): while
    /// `finished` is ahead, a finished call still waits to be noticed.
    ended: Cell<u64>,
    /// Runs under way; when none is, no waker is kept.
    running: Cell<usize>,
    /// Tasks waiting for a call of this shard.
    waiting: RefCell<Vec<Waker>>,
    /// A call was handed over by a look, before glommio noticed it.
    looked: Cell<bool>,
    /// Calls begun in the current period of [`LOOK_PERIOD_CALLS`].
    period_calls: Cell<u32>,
    /// The first connection that looked in the current period.
    looker: Cell<Option<u64>>,
    /// A second connection looked in it: several publishers keep the shard
    /// busy, and a look would only split the round their bursts fill.
    several: Cell<bool>,
    /// `several` of the period before: the gate holds through a period
    /// after one that saw several publishers.
    several_before: Cell<bool>,
}

/// Calls per period over which the connections that look are told apart
/// (tens of milliseconds of a loaded shard's rounds).
const LOOK_PERIOD_CALLS: u32 = 16;

impl FinishedIo {
    /// Runs `call` on the shard's blocking-I/O thread and returns its
    /// result as soon as either the shard looks ([`FinishedIo::wake_finished`])
    /// or glommio's reactor notices, whichever comes first.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        if self.period_calls.get() == LOOK_PERIOD_CALLS {
            self.period_calls.set(0);
            self.looker.set(None);
            self.several_before.set(self.several.replace(false));
        }
        self.period_calls.set(self.period_calls.get() + 1);
        let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
        let (filled, finished) = (slot.clone(), self.finished.clone());
        let through_glommio = glommio::executor().spawn_blocking(move || {
            let out = call();
            *filled.lock().unwrap_or_else(PoisonError::into_inner) = Some(out);
            // After the slot: whoever sees the count finds the result.
            finished.fetch_add(1, Ordering::Release);
        });
        let mut through_glommio = std::pin::pin!(through_glommio);
        let take = || slot.lock().unwrap_or_else(PoisonError::into_inner).take();
        self.running.set(self.running.get() + 1);
        let _ended = RunEnds(self);
        std::future::poll_fn(|cx| {
            if through_glommio.as_mut().poll(cx).is_ready() {
                // The call filled its slot before it returned.
                if let Some(out) = take() {
                    return Poll::Ready(out);
                }
            } else if let Some(out) = take() {
                // Finished, and glommio has not noticed: a look handed it
                // over.
                self.looked.set(true);
                return Poll::Ready(out);
            }
            self.wait(cx.waker());
            Poll::Pending
        })
        .await
    }

    fn wait(&self, waker: &Waker) {
        let mut waiting = self.waiting.borrow_mut();
        if waiting.iter().any(|w| w.will_wake(waker)) {
            return;
        }
        if waiting.len() >= MAX_WAITING {
            waiting.drain(..).for_each(Waker::wake);
        }
        waiting.push(waker.clone());
    }

    /// Whether a call was handed over by a look since this was last asked.
    pub(crate) fn take_looked(&self) -> bool {
        self.looked.replace(false)
    }

    /// Whether a call finished that no run has taken yet while a task
    /// waited for one; if so, those tasks are woken (they run once the
    /// caller's task queue ends its turn). `conn` is the publishing
    /// connection looking, deep in a burst. Once two connections looked
    /// in a period of [`LOOK_PERIOD_CALLS`] calls, none is handed over in
    /// it or in the next: several publishers keep the shard busy by
    /// themselves, and noticing the write early only splits the round
    /// their bursts fill, each round paying its fixed cost
    /// (docs/DECISIONS.md, "A finished commit write is noticed in the
    /// middle of a long burst").
    pub(crate) fn wake_finished(&self, conn: u64) -> bool {
        match self.looker.get() {
            None => self.looker.set(Some(conn)),
            Some(first) if first != conn => self.several.set(true),
            Some(_) => {}
        }
        if self.several.get()
            || self.several_before.get()
            || self.running.get() == 0
            || self.finished.load(Ordering::Acquire) <= self.ended.get()
        {
            return false;
        }
        let mut waiting = self.waiting.take();
        let woke = !waiting.is_empty();
        waiting.drain(..).for_each(Waker::wake);
        // Keep the allocation for the next waiters.
        let mut slot = self.waiting.borrow_mut();
        if slot.is_empty() {
            *slot = waiting;
        }
        woke
    }
}

/// Counts a run as ended however it ends (its result taken, or the run
/// dropped), and forgets the wakers once no run is under way, so a task
/// that got its result through glommio is never woken for it later.
struct RunEnds<'a>(&'a FinishedIo);

impl Drop for RunEnds<'_> {
    fn drop(&mut self) {
        let io = self.0;
        io.ended.set(io.ended.get() + 1);
        io.running.set(io.running.get() - 1);
        if io.running.get() == 0 {
            io.waiting.borrow_mut().clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    /// A call's result reaches its waiter through a look alone, while
    /// glommio's reactor does not poll (this task never lets its queue run
    /// dry); and a look with nothing finished wakes no one.
    #[test]
    fn a_look_hands_over_a_finished_call_before_the_reactor_polls() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let io = Rc::new(FinishedIo::default());
                assert!(!io.wake_finished(1), "nothing ran, nothing finished");
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let got = Rc::new(Cell::new(None));
                let waiter = {
                    let (io, got) = (io.clone(), got.clone());
                    glommio::spawn_local(async move {
                        let out = io
                            .run(move || {
                                rx.recv().expect("released");
                                7u32
                            })
                            .await;
                        got.set(Some(out));
                    })
                };
                // Let the waiter hand its call over and wait.
                while io.waiting.borrow().is_empty() {
                    glommio::executor().yield_now().await;
                }
                assert!(!io.wake_finished(1), "the call has not finished");
                tx.send(()).expect("the call waits");
                // Busy until a look sees it, awaiting nothing the reactor
                // completes.
                while !io.wake_finished(1) {
                    std::hint::spin_loop();
                }
                // The woken waiter runs in this queue's turn; the reactor
                // polls only between turns (or past the preempt timer).
                for _ in 0..100 {
                    if got.get().is_some() {
                        break;
                    }
                    glommio::executor().yield_now().await;
                }
                assert_eq!(got.get(), Some(7), "handed over within the turn");
                waiter.await;
                assert!(io.take_looked(), "counted as handed over by a look");
                assert!(!io.take_looked(), "once");
            })
            .expect("executor")
            .join()
            .expect("joined");
    }

    /// Two publishing connections looking in a period hand nothing over,
    /// in that period or the next: glommio's completion ends those calls.
    /// In the period after, one connection looking hands a call over again.
    #[test]
    fn several_publishers_looking_hand_nothing_over_until_a_period_passes() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let io = Rc::new(FinishedIo::default());
                let released = u64::from(2 * LOOK_PERIOD_CALLS);
                for call in 0..=released {
                    let (tx, rx) = std::sync::mpsc::channel::<()>();
                    let waiter = {
                        let io = io.clone();
                        glommio::spawn_local(async move { io.run(move || rx.recv()).await })
                    };
                    while io.waiting.borrow().is_empty() {
                        glommio::executor().yield_now().await;
                    }
                    if call == 0 {
                        assert!(!io.wake_finished(1), "not finished yet");
                        assert!(!io.wake_finished(2), "not finished yet");
                    }
                    tx.send(()).expect("the call waits");
                    while io.finished.load(Ordering::Acquire) == call {
                        std::hint::spin_loop();
                    }
                    let handed = io.wake_finished(1);
                    if call < released {
                        assert!(!handed, "call {call}: several looked");
                    } else {
                        assert!(handed, "call {call}: one looker, a period later");
                    }
                    assert_eq!(waiter.await, Ok(()));
                    if call < released {
                        assert!(!io.take_looked(), "call {call}: glommio noticed it");
                    }
                    io.take_looked();
                }
            })
            .expect("executor")
            .join()
            .expect("joined");
    }

    /// With no one looking, glommio's completion alone finishes the call,
    /// and the run keeps no waker after it: a later look finds nothing.
    #[test]
    fn without_a_look_the_reactor_finishes_the_call() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let io = Rc::new(FinishedIo::default());
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let waiter = {
                    let io = io.clone();
                    glommio::spawn_local(
                        async move { io.run(move || rx.recv().map(|()| "done")).await },
                    )
                };
                // The call waits until the run is pending, so only glommio
                // can end it (this task then awaits, and the reactor polls).
                while io.waiting.borrow().is_empty() {
                    glommio::executor().yield_now().await;
                }
                tx.send(()).expect("the call waits");
                assert_eq!(waiter.await, Ok("done"));
                assert!(!io.take_looked(), "glommio noticed it, not a look");
                assert!(io.waiting.borrow().is_empty(), "no waker kept once done");
                assert!(!io.wake_finished(1), "a call taken is not looked for again");
            })
            .expect("executor")
            .join()
            .expect("joined");
    }
}
