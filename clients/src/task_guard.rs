//! Task guards for the client's helpers.
//!
//! The typed client's connection task writes to its socket itself (see
//! `client::driver`); what is left here is the guard that keeps a helper task
//! from outliving what started it.

use tokio::task::JoinHandle;

/// A spawned task that is aborted when this guard is dropped: helpers of a client
/// (the encryption stage) must not outlive it when it is cancelled.
#[derive(Debug)]
#[cfg_attr(not(feature = "tools"), allow(dead_code))]
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
