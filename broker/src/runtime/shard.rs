//! One shard's life on its pinned glommio executor: bind the shared port
//! (`SO_REUSEPORT`), restore the queues its logs left, start its background
//! tasks, accept connections (each past the handshake gate), and, once told to
//! stop, end the way `shutdown` says.
//!
//! Start-up (`server`) builds a [`ShardStart`] per shard and runs
//! [`run_shard`] on that shard's executor; nothing here runs on any other
//! thread. What happens to an accepted connection after the gate is in
//! `handoff`.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_shard::durability::DiskSpace;
use ciphermq_shard::log::MirrorWatermarks;
use ciphermq_shard::{Durability, MeshEndpoint, MeshInbound, QueueSettings, RecoveredQueue, Shard};
use futures_lite::future;
use glommio::net::TcpListener;

use crate::conn::handoff::{adopt_handoffs, handshake, Doorbells, HandoffInbox};
use crate::conn::handshake_gate::HandshakeGate;
use crate::runtime::context::{ShardLocal, Shared};
use crate::runtime::shutdown::{drain_shard, InFlight, ShutdownSignal};
use crate::storage::committer;
use ciphermq_shard::log_throttle::LogThrottle;
use ciphermq_shard::log_throttled;
use ciphermq_stats::{ShardStats, ShardThread};

/// What one shard's executor starts with.
pub(crate) struct ShardStart {
    /// Which shard this is.
    pub(crate) shard: usize,
    /// The address to listen on (shard 0's real address once it bound, so
    /// port 0 resolves to one port for all shards).
    pub(crate) address: String,
    /// Settings and services shared by every shard.
    pub(crate) shared: Arc<Shared>,
    /// Limits every queue of this shard is created with.
    pub(crate) queue_settings: QueueSettings,
    /// This shard's end of the mesh to the other shards.
    pub(crate) endpoint: MeshEndpoint,
    /// Connections other shards accepted for this one.
    pub(crate) handoffs: HandoffInbox,
    /// Where to send the connections other shards own.
    pub(crate) doorbells: Doorbells,
    /// Fires when the broker stops.
    pub(crate) shutdown: Arc<ShutdownSignal>,
    /// `Some(data_dir, segment_bytes)` for durable queues.
    pub(crate) durable: Option<(PathBuf, u64)>,
    /// With the Postgres bridge: what it has read of each log.
    pub(crate) mirror: Option<Arc<MirrorWatermarks>>,
    /// Free space on the data directory's filesystem, as last looked at.
    pub(crate) disk: Arc<DiskSpace>,
    /// This shard's queues as their logs left them.
    pub(crate) recovered: Vec<(Arc<str>, RecoveredQueue)>,
}

/// Runs one shard until the broker stops. `ready` gets the bound address once
/// the shard serves, or why it could not bind, within the first poll:
/// nothing is awaited before it (the start's wake-up of a shard parked
/// before that poll relies on it, `nudge::FirstPoll`).
pub(crate) async fn run_shard(
    ctx: ShardStart,
    ready: std::sync::mpsc::Sender<Result<SocketAddr, String>>,
) {
    let listener = match TcpListener::bind(ctx.address.as_str()) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let MeshEndpoint { outbound, inbound } = ctx.endpoint;
    let placement = ctx
        .shared
        .cluster
        .as_ref()
        .and_then(|c| c.log_placement(&ctx.shared.topology));
    let durable = ctx.durable.map(|(dir, segment)| {
        let mut durable = Durability::new(dir, segment, ctx.mirror, ctx.disk);
        if let Some(placement) = placement {
            durable.set_placement(placement);
        }
        durable
    });
    let is_durable = durable.is_some();
    let mut state = Shard::new(
        ctx.queue_settings,
        ctx.shared.topology.clone(),
        outbound,
        durable,
    );
    let now = Instant::now();
    for (name, queue) in ctx.recovered {
        state.restore_queue(name, queue, now);
    }
    let stats = ctx.shared.stats.shard(ctx.shard).clone();
    ciphermq_stats::enter(stats.clone());
    note_threads(&stats);
    let local = Rc::new(ShardLocal::new(state, ctx.shared.clone(), stats));
    glommio::spawn_local(drain_mesh(local.clone(), inbound)).detach();
    glommio::spawn_local(adopt_handoffs(local.clone(), ctx.handoffs)).detach();
    glommio::spawn_local(watch_policy(local.clone(), ctx.shard)).detach();
    glommio::spawn_local(sweep_deliveries(local.clone())).detach();
    crate::liveness::stall_watch::spawn(local.clone());
    crate::storage::chores::spawn(local.clone());
    let committing = Rc::new(Cell::new(0usize));
    if is_durable {
        committer::spawn(local.clone(), committing.clone());
        crate::storage::backlog_reader::spawn(local.clone());
    }
    let _ = ready.send(Ok(addr));

    let shard = ctx.shard;
    // Handshakes in progress: the shard must not end under them, or their
    // sockets would never be closed (closing needs the running reactor).
    let handshaking = Rc::new(Cell::new(0usize));
    let performance = &ctx.shared.settings;
    let gate = HandshakeGate::new(
        performance.max_handshakes,
        performance.max_handshakes_per_ip,
        ctx.shared.shards,
    );
    let turned_away = LogThrottle::new(Duration::from_secs(1));
    let accept_loop = async {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    // Before any TLS: a flood of handshakes holds a bounded
                    // number of sockets and sessions.
                    let peer = stream.peer_addr().map(|a| a.ip());
                    let place = match peer.as_ref().map(|ip| gate.admit(*ip)) {
                        Ok(Ok(place)) => place,
                        Ok(Err(refusal)) => {
                            local.stats.handshakes_refused.add(1);
                            log_throttled!(warn, turned_away.admit(Instant::now()), "closes",
                                { peer = ?peer, ?refusal, },
                                "connection closed before its handshake: too many handshakes in progress (performance.max_handshakes / max_handshakes_per_ip)");
                            drop(stream);
                            continue;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "accepted a connection already gone");
                            continue;
                        }
                    };
                    let guard = (InFlight::enter(&handshaking), place);
                    let task = handshake(
                        local.clone(),
                        stream,
                        ctx.doorbells.clone(),
                        ctx.shutdown.clone(),
                    );
                    glommio::spawn_local(async move {
                        task.await;
                        drop(guard);
                    })
                    .detach();
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "accept failed");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    };
    future::or(accept_loop, ctx.shutdown.wait(shard)).await;
    drop(listener);
    drain_shard(&local, &committing, &handshaking).await;
    local.shared.pulses.shard(shard).end();
}

/// Names the shard's two threads to its statistics, so the metrics can say
/// how each fared with the kernel's scheduler (`ciphermq_shard_thread_*`):
/// this executor's thread now, its blocking-I/O thread once a task has
/// asked it.
fn note_threads(stats: &Arc<ShardStats>) {
    stats.set_thread(ShardThread::Executor, crate::runtime::sys::thread_id());
    let stats = stats.clone();
    glommio::spawn_local(async move {
        let tid = glommio::executor()
            .spawn_blocking(crate::runtime::sys::thread_id)
            .await;
        stats.set_thread(ShardThread::BlockingIo, tid);
    })
    .detach();
}

/// Wakes every connection of this shard when the policy is reloaded, so those
/// whose role changed close even when idle.
async fn watch_policy(local: Rc<ShardLocal>, shard: usize) {
    let mut seen = 0;
    loop {
        seen = local.shared.policy.changed(shard, seen).await;
        for mailbox in local.shard.borrow().mailboxes() {
            mailbox.wake();
        }
    }
}

/// Bytes a shard frees from memory (bodies moved to disk, or acked) before
/// it hands the heap's free pages back to the kernel.
const RELEASE_AFTER_BYTES: u64 = 64 << 20;

/// Redelivers deliveries unacked past `performance.ack_wait_secs`, and
/// gives freed memory back (on a short-lived thread) once a second when a
/// lot was freed.
async fn sweep_deliveries(local: Rc<ShardLocal>) {
    let mut peak = 0u64;
    // A trim in progress on its own thread: one at a time.
    let trimming = Arc::new(AtomicBool::new(false));
    loop {
        glommio::timer::sleep(Duration::from_secs(1)).await;
        let held = local.with_shard(|shard| {
            shard.sweep(Instant::now());
            shard.resident_bytes()
        });
        peak = peak.max(held);
        if peak - held >= RELEASE_AFTER_BYTES && !trimming.swap(true, Ordering::AcqRel) {
            // `malloc_trim` walks every arena: 7-12 ms, too long for the
            // shard's thread or for its blocking thread (commit rounds).
            let (freed, done) = (peak - held, trimming.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("shard-{}-trim", local.stats.shard))
                .spawn(move || {
                    let started = Instant::now();
                    crate::runtime::sys::release_free_memory();
                    tracing::debug!(
                        freed,
                        took_us = started.elapsed().as_micros() as u64,
                        "free heap pages returned"
                    );
                    done.store(false, Ordering::Release);
                });
            if spawned.is_err() {
                trimming.store(false, Ordering::Release);
            }
            peak = held;
        }
        if local.shared.stats.collects() {
            local.stats.refresh(&local.shard.borrow());
        }
    }
}

/// Applies batches from other shards.
async fn drain_mesh(local: Rc<ShardLocal>, inbound: MeshInbound) {
    while let Some(batch) = std::future::poll_fn(|cx| inbound.poll_recv(cx)).await {
        let now = Instant::now();
        local.with_shard(|shard| {
            for msg in batch {
                shard.handle(msg, now);
            }
        });
    }
}
