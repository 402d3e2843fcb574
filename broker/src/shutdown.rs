//! Stopping the broker: the signal every shard waits on, and how a shard ends
//! once it fires.
//!
//! A shard must not simply stop its executor: connections still owe replies to
//! what they accepted (publishes wait for the last commit rounds), and sockets
//! can only be closed while the reactor runs. So the order of the last steps
//! lives here, in one place, apart from start-up and the accept loop.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;

use crate::context::ShardLocal;

/// How long a stopping shard waits for its connections, commits and
/// handshakes before it ends regardless.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// How often a stopping shard looks again whether it is idle.
const DRAIN_POLL: Duration = Duration::from_millis(5);

/// Tells every shard to stop: set once (by `BrokerHandle::shutdown`, its
/// stopper, or a start that failed half-way), seen by all shards.
pub(crate) struct ShutdownSignal {
    stop: AtomicBool,
    /// One per shard: the task waiting in [`ShutdownSignal::wait`].
    wakers: Vec<Arc<AtomicWaker>>,
}

impl ShutdownSignal {
    /// A signal not yet triggered, for `shards` shards.
    pub(crate) fn new(shards: usize) -> ShutdownSignal {
        ShutdownSignal {
            stop: AtomicBool::new(false),
            wakers: (0..shards).map(|_| Arc::new(AtomicWaker::new())).collect(),
        }
    }

    /// Tells every shard to stop (from any thread; repeating is harmless).
    pub(crate) fn trigger(&self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    /// Whether the broker is stopping.
    pub(crate) fn is_triggered(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Resolves once the signal is triggered; `shard` is the waiting shard.
    pub(crate) async fn wait(&self, shard: usize) {
        std::future::poll_fn(|cx| {
            if self.stop.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.wakers[shard].register(cx.waker());
            if self.stop.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// Counts a task as running until dropped: what a stopping shard waits for
/// besides its connections (see [`drain_shard`]).
pub(crate) struct InFlight(Rc<Cell<usize>>);

impl InFlight {
    /// Adds one to `count` until the returned guard is dropped.
    pub(crate) fn enter(count: &Rc<Cell<usize>>) -> InFlight {
        count.set(count.get() + 1);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// The end of a shard, once it no longer accepts: closes every connection's
/// mailbox, then waits (at most [`DRAIN_DEADLINE`]) until its connections
/// answered what they accepted (their publishes wait for the last commit
/// rounds), said goodbye and went, and until no commit round (`committing`)
/// and no handshake (`handshaking`) is in flight.
pub(crate) async fn drain_shard(
    local: &ShardLocal,
    committing: &Cell<usize>,
    handshaking: &Cell<usize>,
) {
    for mailbox in local.shard.borrow().mailboxes() {
        mailbox.close();
    }
    let deadline = Instant::now() + DRAIN_DEADLINE;
    while Instant::now() < deadline {
        let busy = committing.get() > 0 || handshaking.get() > 0 || {
            let shard = local.shard.borrow();
            shard.has_commit_work() || shard.mailboxes().next().is_some()
        };
        if !busy {
            break;
        }
        glommio::timer::sleep(DRAIN_POLL).await;
    }
}
