//! What happens before [`PgBridge::start`](super::PgBridge::start) returns:
//! the first connection (retried until `connect_timeout`), the schema, every
//! stored key, and the mirror's committed watermarks. Failing any of these
//! fails start, so a broker never runs half-configured.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aes_gcm::Aes256Gcm;
use tokio::time::{sleep, Instant};

use super::batch::Position;
use super::config::PgConfig;
use super::error::BridgeError;
use super::keys::load_keys;
use super::link::{describe, Backoff, Conn, ATTEMPT_TIMEOUT};
use super::mirror::load_watermarks;
use super::schema;
use super::tls::{is_local, PgTls};
use ciphermq_keystore::keys::MemoryKeyStore;

/// Shortest time given to one attempt, even when the deadline is near.
const MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// The mirror's connection (`None` if the second connect failed: its link
/// then keeps trying) and its committed positions.
pub(crate) struct MirrorStart {
    /// For metadata batches.
    pub(crate) conn: Option<Conn>,
    /// As in `ciphermq_mirror_watermark`.
    pub(crate) positions: HashMap<Arc<str>, Position>,
}

/// Connections and state ready for the bridge's tasks.
pub(crate) struct Started {
    /// For key registrations.
    pub(crate) keys: Conn,
    /// For the mirror, when logs are given.
    pub(crate) mirror: Option<MirrorStart>,
}

/// Connects, retrying with backoff until `connect_timeout` has passed; a
/// TLS refusal (which retrying cannot cure) fails at once.
async fn connect_first(config: &PgConfig, tls: &PgTls) -> Result<Conn, BridgeError> {
    let started = Instant::now();
    let deadline = started + config.connect_timeout;
    let mut backoff = Backoff::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = left.min(ATTEMPT_TIMEOUT).max(MIN_ATTEMPT);
        match Conn::open(config.clone(), tls.clone(), limit).await {
            Ok(conn) => return Ok(conn),
            Err(e) if e.permanent => {
                return Err(BridgeError::Tls {
                    target: config.target(),
                    why: e.why,
                })
            }
            Err(e) => {
                let why = e.why;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(BridgeError::Connect {
                        target: config.target(),
                        cause: format!(
                            "{why} (gave up after {:.1} s; check host, port, dbname, user and password, and that the server is running)",
                            started.elapsed().as_secs_f64()
                        ),
                    });
                }
                tracing::warn!(target = %config.target(), error = %why, "PostgreSQL not reachable yet; retrying");
                sleep(backoff.next_delay().min(left)).await;
            }
        }
    }
}

/// Everything start needs from the database. `mirror`: whether metadata is
/// mirrored (durable queues).
pub(crate) async fn prepare(
    config: &PgConfig,
    tls: &PgTls,
    cipher: &Aes256Gcm,
    memory: &MemoryKeyStore,
    mirror: bool,
) -> Result<Started, BridgeError> {
    let target = config.target();
    let mut keys = connect_first(config, tls).await?;
    schema::ensure(&mut keys.client, &target).await?;
    load_keys(&keys.client, cipher, &target, memory).await?;
    let encrypted = session_encrypted(&keys.client).await;
    tracing::info!(%target, sslmode = %config.sslmode, tls = encrypted, certificate_checked = encrypted && tls.chain_checked(), keys = memory_len(memory), "PostgreSQL bridge connected; public keys loaded");
    warn_if_exposed(config, tls, encrypted);
    let mirror = if mirror {
        let positions = load_watermarks(&keys.client, &config.node)
            .await
            .map_err(|e| BridgeError::Load {
                target: target.clone(),
                what: "ciphermq_mirror_watermark",
                cause: describe(&e),
            })?;
        let conn = match Conn::open(config.clone(), tls.clone(), ATTEMPT_TIMEOUT).await {
            Ok(conn) => Some(conn),
            Err(e) => {
                let why = e.why;
                tracing::warn!(%target, error = %why, "second PostgreSQL connection (metadata mirror) failed; retrying in the background");
                None
            }
        };
        Some(MirrorStart { conn, positions })
    } else {
        None
    };
    Ok(Started { keys, mirror })
}

/// Whether the server sees this session as TLS (`pg_stat_ssl`); `false`
/// when it cannot say.
async fn session_encrypted(client: &tokio_postgres::Client) -> bool {
    match client
        .query_opt(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
    {
        Ok(Some(row)) => row.try_get::<_, bool>(0).unwrap_or(false),
        _ => false,
    }
}

/// Says so when the link to a server on another host is plaintext or does
/// not prove who the server is.
fn warn_if_exposed(config: &PgConfig, tls: &PgTls, encrypted: bool) {
    if is_local(&config.host) {
        return;
    }
    let target = config.target();
    if !encrypted {
        tracing::warn!(%target, sslmode = %config.sslmode, "the PostgreSQL link is plaintext: metadata, the password exchange and the public-key rows cross the network readable and alterable; turn TLS on at the server and set database.sslmode = \"verify-full\" with database.ca_cert_path");
    } else if !tls.chain_checked() {
        tracing::warn!(%target, sslmode = %config.sslmode, "the PostgreSQL link is encrypted but the server's certificate is not checked: a machine in the middle can pose as the server; set database.sslmode = \"verify-full\" with database.ca_cert_path");
    }
}

fn memory_len(memory: &MemoryKeyStore) -> usize {
    ciphermq_keystore::keys::PublicKeyStore::len(memory)
}
