//! A task that owns the writing half of a connection, so the task reading replies
//! never stops to write (a pipelining client that stops reading can deadlock with a
//! broker that stops reading when its replies go unread).
//!
//! Lines sent while a flush is in progress are coalesced into the next flush, so a
//! burst of commands costs one write. The task ends when every [`LineSender`] is
//! dropped (after flushing what was queued) or on the first write error, and it is
//! aborted when its [`WriterTask`] is dropped, so an aborted client leaves nothing
//! running that holds the connection open.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::connection::{ClientError, ConnectionWriter};

/// Queues command text for the writer task. Cloneable and cheap.
#[derive(Debug, Clone)]
pub(crate) struct LineSender(mpsc::UnboundedSender<String>);

impl LineSender {
    /// Queues text made of whole lines (each ending in `\n`). `false` when the
    /// writer task has ended (the connection failed).
    pub(crate) fn send(&self, lines: String) -> bool {
        self.0.send(lines).is_ok()
    }
}

/// The writer task; aborted on drop.
#[derive(Debug)]
pub(crate) struct WriterTask(JoinHandle<Result<(), ClientError>>);

impl WriterTask {
    /// The join handle, for `select!` on the task failing.
    pub(crate) fn handle(&mut self) -> &mut JoinHandle<Result<(), ClientError>> {
        &mut self.0
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Spawns the writer task for `writer`.
pub(crate) fn spawn(mut writer: ConnectionWriter) -> (LineSender, WriterTask) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let task = tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            writer.queue_bytes(first.as_bytes());
            while let Ok(more) = rx.try_recv() {
                writer.queue_bytes(more.as_bytes());
            }
            writer.flush().await?;
        }
        Ok(())
    });
    (LineSender(tx), WriterTask(task))
}

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
