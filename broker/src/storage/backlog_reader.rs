//! The backlog reader of one shard: it reads back from the segment logs the
//! bodies of queued messages that are kept on disk only (past
//! `storage.memory_budget_mb`), ahead of the consumers.
//!
//! The shard decides what to read (one read in flight per queue, about a
//! megabyte each, started when fewer than a batch of messages are in memory
//! ahead of its consumers or a `fetch` waits); this task only does the I/O,
//! through glommio's io_uring file API, so the shard never blocks on disk.
//! Files are opened for direct I/O (no second copy in the page cache for a
//! backlog read once); a filesystem that refuses it is read buffered.

use std::rc::Rc;

use ciphermq_shard::backlog::ReadJob;
use ciphermq_shard::Shard;
use glommio::io::{OpenOptions, ReadResult};

use crate::runtime::context::ShardLocal;

/// Starts the reader of this shard.
pub(crate) fn spawn(local: Rc<ShardLocal>) {
    glommio::spawn_local(run(local)).detach();
}

async fn run(local: Rc<ShardLocal>) {
    let mut jobs = Vec::new();
    loop {
        local
            .work_for(Shard::has_read_work, Shard::register_reader)
            .await;
        local.with_shard(|shard| shard.take_read_jobs(&mut jobs));
        for job in jobs.drain(..) {
            glommio::spawn_local(read_one(local.clone(), job)).detach();
        }
    }
}

async fn read_one(local: Rc<ShardLocal>, job: ReadJob) {
    let result = read(&job).await;
    let now = std::time::Instant::now();
    local.with_shard(|shard| match &result {
        Ok(data) => shard.read_done(&job, Ok(data), now),
        Err(e) => shard.read_done(&job, Err(e.clone()), now),
    });
}

/// Reads `job.len` bytes at `job.offset` of its segment (fewer at the end
/// of the file). Never through a symbolic link (`O_NOFOLLOW`), as every
/// open of a log file.
async fn read(job: &ReadJob) -> Result<ReadResult, String> {
    let fail = |e: glommio::GlommioError<()>| e.to_string();
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NOFOLLOW);
    match options.dma_open(&job.path).await {
        Ok(file) => {
            let read = file.read_at(job.offset, job.len).await.map_err(fail);
            let _ = file.close().await;
            read
        }
        Err(_) => {
            let file = options.buffered_open(&job.path).await.map_err(fail)?;
            let read = file.read_at(job.offset, job.len).await.map_err(fail);
            let _ = file.close().await;
            read
        }
    }
}
