//! Stopping the broker: the signal every shard waits on, and how a shard ends
//! once it fires.
//!
//! A shard must not simply stop its executor: connections still owe replies to
//! what they accepted (publishes wait for the last commit rounds), and sockets
//! can only be closed while the reactor runs. So the order of the last steps
//! lives here, in one place, apart from start-up and the accept loop.
//!
//! The drain is bounded by `server.shutdown_timeout_secs` (0: unbounded).
//! Giving up is safe: a publish is answered `ACK` only after its
//! `fdatasync`, so whatever is still open at the deadline was never
//! acknowledged, and what a cut-short commit round leaves on disk is a torn
//! tail that recovery cuts off, as after `kill -9`.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;

use crate::liveness::pulse::OpenWork;
use crate::runtime::context::ShardLocal;

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

/// How a drain ended: one shard's, or the broker's (every shard's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Everything accepted was answered and every connection closed.
    Finished,
    /// `server.shutdown_timeout_secs` passed first (on some shard): what was
    /// still open was logged and dropped, never anything acknowledged.
    GaveUp,
}

/// The end of a shard, once it no longer accepts: closes every connection's
/// mailbox, then waits until its connections answered what they accepted
/// (their publishes wait for the last commit rounds), said goodbye and went,
/// and until no commit round (`committing`) and no handshake (`handshaking`)
/// is in flight; or, with `server.shutdown_timeout_secs`, until that much
/// time has passed, when it logs what is still open and gives up. What it
/// waits for is kept in the shard's pulse for other threads to read.
pub(crate) async fn drain_shard(
    local: &ShardLocal,
    committing: &Cell<usize>,
    handshaking: &Cell<usize>,
) -> Drain {
    for mailbox in local.shard.borrow().mailboxes() {
        mailbox.close();
    }
    let shard = local.stats.shard;
    let pulse = local.shared.pulses.shard(shard);
    let timeout = local.shared.settings.shutdown_timeout;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let work = {
            let state = local.shard.borrow();
            OpenWork {
                shard,
                connections: state.mailboxes().count(),
                commits: committing.get() + usize::from(state.has_commit_work()),
                handshakes: handshaking.get(),
                not_draining: false,
                ended: false,
            }
        };
        pulse.draining(work);
        if work.is_idle() {
            return Drain::Finished;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            tracing::warn!(
                shard,
                connections = work.connections,
                commits_pending = work.commits,
                handshakes = work.handshakes,
                shutdown_timeout_secs = timeout.map_or(0, |t| t.as_secs()),
                "drain deadline passed (server.shutdown_timeout_secs): closing what is still open; \
                 nothing acknowledged is lost (ACKs follow fsync), unanswered commands were never acknowledged"
            );
            pulse.give_up();
            return Drain::GaveUp;
        }
        glommio::timer::sleep(DRAIN_POLL).await;
    }
}
