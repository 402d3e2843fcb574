//! Public keys in PostgreSQL (`public_keys`), served from memory.
//!
//! Every row is loaded and opened at start, so a wrong `aes_key` fails start
//! (naming the client) instead of serving garbage later. A registration goes
//! to the bridge thread over a bounded channel (`try_send`: a shard never
//! waits); the thread upserts the sealed row, commits, and only then updates
//! the memory map and answers. While the database is unreachable, a
//! registration is answered `Unavailable` within [`REGISTER_WAIT`].

use std::sync::Arc;
use std::time::Duration;

use aes_gcm::Aes256Gcm;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{timeout_at, Instant};
use tokio_postgres::Client;

use super::error::BridgeError;
use super::link::{describe, Link, ATTEMPT_TIMEOUT};
use super::status::StatusCell;
use ciphermq_keystore::keys::{
    check_client_id, resolved, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore,
    Registration, RegistrationResult,
};
use ciphermq_keystore::seal::{open, seal, NONCE_BYTES, TAG_BYTES};

/// Longest a registration waits for the database before it is answered
/// `Unavailable` (the client may retry).
pub(crate) const REGISTER_WAIT: Duration = Duration::from_secs(2);
/// Registrations queued for the bridge thread; more are refused at once.
pub(crate) const COMMAND_QUEUE: usize = 256;

const UPSERT: &str = "
INSERT INTO public_keys (client_id, public_key_ciphertext, nonce, tag, updated_time)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (client_id) DO UPDATE SET
    public_key_ciphertext = EXCLUDED.public_key_ciphertext,
    nonce = EXCLUDED.nonce,
    tag = EXCLUDED.tag,
    updated_time = EXCLUDED.updated_time";

/// One registration for the bridge thread.
pub(crate) struct KeyCommand {
    client_id: String,
    key: PublicKey,
    /// When the registrant stops caring: answered `Unavailable` after it.
    deadline: std::time::Instant,
    reply: oneshot::Sender<RegistrationResult>,
}

/// The [`PublicKeyStore`] of the PostgreSQL backend.
pub(crate) struct PgKeyStore {
    /// Lookups; filled at start and after each committed registration.
    memory: Arc<MemoryKeyStore>,
    commands: mpsc::Sender<KeyCommand>,
}

impl PgKeyStore {
    /// A store answering from `memory` and registering through `commands`.
    pub(crate) fn new(
        memory: Arc<MemoryKeyStore>,
        commands: mpsc::Sender<KeyCommand>,
    ) -> PgKeyStore {
        PgKeyStore { memory, commands }
    }
}

impl PublicKeyStore for PgKeyStore {
    fn register(&self, client_id: &str, key: PublicKey) -> Registration {
        if let Err(e) = check_client_id(client_id) {
            return resolved(Err(e));
        }
        let (reply, registration) = oneshot::channel();
        let command = KeyCommand {
            client_id: client_id.to_owned(),
            key,
            deadline: std::time::Instant::now() + REGISTER_WAIT,
            reply,
        };
        match self.commands.try_send(command) {
            Ok(()) => registration,
            Err(mpsc::error::TrySendError::Full(_)) => resolved(Err(KeyStoreError::Unavailable(
                "database bridge busy".to_owned(),
            ))),
            Err(mpsc::error::TrySendError::Closed(_)) => resolved(Err(KeyStoreError::Unavailable(
                "database bridge stopped".to_owned(),
            ))),
        }
    }

    fn get(&self, client_id: &str) -> Option<PublicKey> {
        self.memory.get(client_id)
    }

    fn len(&self) -> usize {
        self.memory.len()
    }
}

fn decode_field(
    client_id: &str,
    name: &str,
    value: &str,
    len: Option<usize>,
) -> Result<Vec<u8>, BridgeError> {
    let bad = |why: String| BridgeError::BadKeyRow {
        client_id: client_id.to_owned(),
        why,
    };
    let bytes = BASE64
        .decode(value)
        .map_err(|e| bad(format!("{name} is not base64: {e}")))?;
    if let Some(len) = len.filter(|len| bytes.len() != *len) {
        return Err(bad(format!(
            "{name} has {} bytes, expected {len}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Rows changed at or after `$1` (microseconds since the Unix epoch), with
/// their change time in the same unit.
const CHANGED_SINCE: &str = "
SELECT client_id, public_key_ciphertext, nonce, tag,
       (extract(epoch FROM updated_time) * 1000000)::bigint
FROM public_keys WHERE updated_time >= to_timestamp($1::bigint / 1000000.0)";

/// How far back a refresh reads before the newest change it saw: a
/// registration's time is its transaction's start, and one that began
/// earlier may commit later.
const REFRESH_OVERLAP_US: i64 = 10_000_000;

/// Loads and opens every stored key into `memory`.
pub(crate) async fn load_keys(
    client: &Client,
    cipher: &Aes256Gcm,
    target: &str,
    memory: &MemoryKeyStore,
) -> Result<i64, BridgeError> {
    load_keys_since(client, cipher, target, memory, 0).await
}

/// Loads and opens the keys changed at or after `since` (microseconds since
/// the Unix epoch) into `memory`; returns the newest change time read (or
/// `since`).
async fn load_keys_since(
    client: &Client,
    cipher: &Aes256Gcm,
    target: &str,
    memory: &MemoryKeyStore,
    since: i64,
) -> Result<i64, BridgeError> {
    let rows = client
        .query(CHANGED_SINCE, &[&since])
        .await
        .map_err(|e| BridgeError::Load {
            target: target.to_owned(),
            what: "public_keys",
            cause: describe(&e),
        })?;
    let mut newest = since;
    for row in rows {
        let field = |i: usize| {
            row.try_get::<_, String>(i).map_err(|e| BridgeError::Load {
                target: target.to_owned(),
                what: "public_keys",
                cause: describe(&e),
            })
        };
        let client_id = field(0)?;
        let ciphertext = decode_field(&client_id, "public_key_ciphertext", &field(1)?, None)?;
        let nonce = decode_field(&client_id, "nonce", &field(2)?, Some(NONCE_BYTES))?;
        let tag = decode_field(&client_id, "tag", &field(3)?, Some(TAG_BYTES))?;
        let key = open(cipher, &client_id, &nonce, &ciphertext, &tag).ok_or_else(|| {
            BridgeError::WrongKey {
                client_id: client_id.clone(),
            }
        })?;
        let changed = row.try_get::<_, i64>(4).unwrap_or(since);
        newest = newest.max(changed);
        memory.insert(&client_id, key);
    }
    Ok(newest)
}

/// The bridge thread's side of key registration.
pub(crate) struct KeyTask {
    link: Link,
    cipher: Aes256Gcm,
    memory: Arc<MemoryKeyStore>,
    commands: mpsc::Receiver<KeyCommand>,
    status: Arc<StatusCell>,
    /// Reading other brokers' registrations (a cluster's nodes).
    refresh: Option<KeyRefresh>,
}

/// How a cluster node learns the keys other nodes registered.
pub(crate) struct KeyRefresh {
    /// How often it reads them.
    pub(crate) period: Duration,
    /// The newest change time read so far (microseconds since the epoch).
    pub(crate) newest: i64,
    /// `host:port/dbname`, for errors.
    pub(crate) target: String,
    /// The last read failed (an outage is logged once).
    pub(crate) failing: bool,
}

impl KeyTask {
    /// Serves `commands` over `link`.
    pub(crate) fn new(
        link: Link,
        cipher: Aes256Gcm,
        memory: Arc<MemoryKeyStore>,
        commands: mpsc::Receiver<KeyCommand>,
        status: Arc<StatusCell>,
        refresh: Option<KeyRefresh>,
    ) -> KeyTask {
        KeyTask {
            link,
            cipher,
            memory,
            commands,
            status,
            refresh,
        }
    }

    /// Serves registrations until `stop` turns true; those still queued then
    /// are answered `Unavailable`.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let period = self
            .refresh
            .as_ref()
            .map_or(Duration::from_secs(3600), |r| r.period);
        let mut refresh = tokio::time::interval(period);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stop.borrow() {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                command = self.commands.recv() => match command {
                    Some(command) => {
                        let result = self.store(&command).await;
                        // The registrant may have given up; the outcome stands.
                        let _ = command.reply.send(result);
                    }
                    None => break,
                },
                () = self.link.event() => {}
                _ = refresh.tick(), if self.refresh.is_some() => self.refresh_keys().await,
            }
        }
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            let _ = command.reply.send(Err(KeyStoreError::Unavailable(
                "database bridge shutting down".to_owned(),
            )));
        }
    }

    /// Reads the keys other brokers registered since the last refresh. A
    /// failure is logged once per outage and tried again next period.
    async fn refresh_keys(&mut self) {
        let Some(refresh) = self.refresh.as_mut() else {
            return;
        };
        let Some(conn) = self.link.conn() else {
            return;
        };
        let since = refresh.newest.saturating_sub(REFRESH_OVERLAP_US).max(0);
        match load_keys_since(
            &conn.client,
            &self.cipher,
            &refresh.target,
            &self.memory,
            since,
        )
        .await
        {
            Ok(newest) => {
                refresh.newest = newest;
                refresh.failing = false;
            }
            Err(e) => {
                if !refresh.failing {
                    tracing::warn!(error = %e, "reading public keys registered by other nodes failed; retrying");
                }
                refresh.failing = true;
            }
        }
    }

    fn unavailable(&self, why: &str) -> KeyStoreError {
        KeyStoreError::Unavailable(format!("database unavailable: {why}"))
    }

    /// Makes one registration durable, then visible.
    async fn store(&mut self, command: &KeyCommand) -> RegistrationResult {
        let deadline = Instant::from_std(command.deadline);
        if Instant::now() >= deadline {
            return Err(KeyStoreError::Unavailable(format!(
                "database bridge busy: the registration waited over {REGISTER_WAIT:?}"
            )));
        }
        if self.link.conn().is_none() {
            // Registrations are rare: try now rather than wait out the backoff.
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .min(ATTEMPT_TIMEOUT);
            self.link.try_now(limit).await;
        }
        let Some(conn) = self.link.conn() else {
            let why = self
                .status
                .last_error()
                .unwrap_or_else(|| "not connected".to_owned());
            return Err(self.unavailable(&why));
        };
        let sealed = seal(&self.cipher, &command.client_id, &command.key)
            .ok_or_else(|| KeyStoreError::Unavailable("sealing the key failed".to_owned()))?;
        let ciphertext = BASE64.encode(&sealed.ciphertext);
        let nonce = BASE64.encode(sealed.nonce);
        let tag = BASE64.encode(sealed.tag);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&command.client_id, &ciphertext, &nonce, &tag];
        match timeout_at(deadline, conn.client.execute(UPSERT, &params)).await {
            Ok(Ok(_)) => Ok(self.memory.insert(&command.client_id, command.key)),
            Ok(Err(e)) => {
                let why = describe(&e);
                if e.as_db_error().is_some() {
                    // The server answered: the connection is fine.
                    self.status.error(why.clone());
                } else {
                    self.link.fail(why.clone());
                }
                tracing::warn!(client_id = %command.client_id, error = %why, "storing a public key in PostgreSQL failed");
                Err(self.unavailable(&why))
            }
            Err(_) => {
                let why = format!("no answer within {REGISTER_WAIT:?}");
                self.link.fail(why.clone());
                Err(self.unavailable(&why))
            }
        }
    }
}
