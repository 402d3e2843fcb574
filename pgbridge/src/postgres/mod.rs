//! The PostgreSQL bridge: public keys and message metadata in PostgreSQL,
//! without ever blocking a shard.
//!
//! One OS thread (`pgbridge`) runs a tokio current-thread runtime with two
//! connections, each reconnecting by itself (`link`):
//! - keys (`keys`): registrations arrive over a bounded channel
//!   (`try_send`), are upserted sealed, and only then become visible;
//! - the metadata mirror (`mirror`): tails the broker's durable queue logs
//!   (`tail`), coalesces records into one batch of rows (`batch`), and
//!   commits the rows together with per-queue watermarks, so it resumes
//!   exactly where it stopped. Its backlog is measured against a disk budget
//!   (`budget`) that decides how long acked segments wait for it.
//!
//! Also: `config` (settings), `tls` (`sslmode`: rustls under the driver,
//! and what a refused certificate is reported as), `schema` (tables, created if missing),
//! `startup` (what `start` does before returning), `status` (a snapshot
//! for `/ready` and metrics), `error`.

mod batch;
mod budget;
mod config;
mod error;
mod keys;
mod link;
mod mirror;
mod schema;
mod startup;
mod status;
mod tail;
mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use aes_gcm::aead::KeyInit;
use aes_gcm::Aes256Gcm;
use ciphermq_shard::log::MirrorWatermarks;
use tokio::sync::{mpsc, watch};

pub use config::PgConfig;
pub use error::BridgeError;
pub use link::describe;
pub use status::BridgeStatus;
pub use tls::{SslMode, UnknownSslMode};

use ciphermq_keystore::keys::{MemoryKeyStore, PublicKeyStore};
use keys::{KeyCommand, KeyRefresh, KeyTask, PgKeyStore, COMMAND_QUEUE};
use link::Link;
use mirror::{LogSource, Mirror};
use status::{LinkKind, StatusCell};
use tls::PgTls;

/// A running bridge. Dropping it stops the thread like [`PgBridge::shutdown`].
pub struct PgBridge {
    keys: Arc<PgKeyStore>,
    status: Arc<StatusCell>,
    /// Turned to `true` to stop the thread.
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PgBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBridge")
            .field("status", &self.status.snapshot())
            .finish_non_exhaustive()
    }
}

impl PgBridge {
    /// Reads `ca_cert_path` when `sslmode` uses it (a missing or unusable
    /// one fails with [`BridgeError::MissingCaCert`] or
    /// [`BridgeError::CaCert`]), connects (retrying with backoff until
    /// `connect_timeout`; a refused certificate, or TLS refused while
    /// required, fails at once with [`BridgeError::Tls`]), creates the
    /// schema if missing, loads and decrypts every stored public key (one
    /// that does not decrypt with `aes_key` fails with
    /// [`BridgeError::WrongKey`]: never serve garbage), then starts the
    /// thread.
    ///
    /// `logs`: `Some((data_dir, watermarks))` when queues are durable: the
    /// thread tails `{data_dir}/queues/{queue}/segment-{base:020}.log` and
    /// holds acked segments through `watermarks` until it has read them (up
    /// to `max_unmirrored_bytes`). `None` (memory mode): keys only.
    pub fn start(
        config: PgConfig,
        aes_key: [u8; 32],
        logs: Option<(PathBuf, Arc<MirrorWatermarks>)>,
    ) -> Result<PgBridge, BridgeError> {
        let tls = PgTls::new(&config)?;
        let status = Arc::new(StatusCell::new(logs.is_some()));
        let memory = Arc::new(MemoryKeyStore::new());
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread = {
            let status = status.clone();
            let memory = memory.clone();
            std::thread::Builder::new()
                .name("pgbridge".to_owned())
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = ready_tx.send(Err(BridgeError::Thread(e)));
                            return;
                        }
                    };
                    let cipher = Aes256Gcm::new(&aes_key.into());
                    let thread = BridgeThread {
                        config,
                        tls,
                        cipher,
                        logs,
                        memory,
                        status,
                        commands: command_rx,
                    };
                    runtime.block_on(thread.run(stop_rx, ready_tx));
                })
                .map_err(BridgeError::Thread)?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(PgBridge {
                keys: Arc::new(PgKeyStore::new(memory, commands)),
                status,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(BridgeError::ThreadDied)
            }
        }
    }

    /// The key store the broker serves registrations and lookups from.
    pub fn key_store(&self) -> Arc<dyn PublicKeyStore> {
        self.keys.clone()
    }

    /// A snapshot of the bridge's health; cheap, callable from any thread.
    pub fn status(&self) -> BridgeStatus {
        self.status.snapshot()
    }

    /// Stops the thread after one last flush attempt (at most about 2 s) and
    /// joins it. Registrations still queued are answered `Unavailable`.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the pgbridge thread panicked");
            }
        }
    }
}

impl Drop for PgBridge {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// What the `pgbridge` thread owns.
struct BridgeThread {
    config: PgConfig,
    /// Shared by every connection (the CA file is read once).
    tls: PgTls,
    cipher: Aes256Gcm,
    logs: Option<(PathBuf, Arc<MirrorWatermarks>)>,
    memory: Arc<MemoryKeyStore>,
    status: Arc<StatusCell>,
    commands: mpsc::Receiver<KeyCommand>,
}

impl BridgeThread {
    /// Starts up (reporting the outcome on `ready`), then serves keys and
    /// runs the mirror until `stop`.
    async fn run(
        self,
        stop: watch::Receiver<bool>,
        ready: std::sync::mpsc::SyncSender<Result<(), BridgeError>>,
    ) {
        let started = match startup::prepare(
            &self.config,
            &self.tls,
            &self.cipher,
            &self.memory,
            self.logs.is_some(),
        )
        .await
        {
            Ok(started) => started,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let key_link = Link::new(
            self.config.clone(),
            self.tls.clone(),
            LinkKind::Keys,
            self.status.clone(),
            Some(started.keys),
        );
        let refresh = self.config.key_refresh.map(|period| KeyRefresh {
            period,
            newest: 0,
            target: self.config.target(),
            failing: false,
        });
        let keys = KeyTask::new(
            key_link,
            self.cipher,
            self.memory,
            self.commands,
            self.status.clone(),
            refresh,
        );
        let mirror = match (self.logs, started.mirror) {
            (Some((data_dir, watermarks)), Some(start)) => {
                let link = Link::new(
                    self.config.clone(),
                    self.tls,
                    LinkKind::Mirror,
                    self.status.clone(),
                    start.conn,
                );
                Some(Mirror::new(
                    self.config,
                    LogSource {
                        data_dir,
                        watermarks,
                    },
                    self.status,
                    link,
                    start.positions,
                ))
            }
            _ => None,
        };
        if ready.send(Ok(())).is_err() {
            return;
        }
        match mirror {
            Some(mirror) => {
                tokio::join!(keys.run(stop.clone()), mirror.run(stop));
            }
            None => keys.run(stop).await,
        }
        tracing::info!("pgbridge stopped");
    }
}
