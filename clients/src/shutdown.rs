//! A shutdown signal given by the caller as any future (Ctrl+C in the binaries, a
//! channel in tests), usable in `select!` loops over several connections.

use std::future::Future;
use std::pin::Pin;

/// Wraps the caller's shutdown future so it can be awaited repeatedly: once it has
/// fired, [`Shutdown::wait`] never completes again (a finished future must not be
/// polled again).
pub(crate) struct Shutdown<'a> {
    /// The caller's future.
    fut: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>,
    /// Whether it completed.
    fired: bool,
}

impl<'a> Shutdown<'a> {
    /// Wraps a pinned future.
    pub(crate) fn new(fut: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>) -> Self {
        Shutdown { fut, fired: false }
    }

    /// Completes when the signal fires; never after that. Cancel safe.
    pub(crate) async fn wait(&mut self) {
        if self.fired {
            std::future::pending::<()>().await;
        }
        self.fut.as_mut().await;
        self.fired = true;
    }

    /// Whether the signal has fired.
    pub(crate) fn fired(&self) -> bool {
        self.fired
    }
}
