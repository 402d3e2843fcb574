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
use crate::keys::{
    check_client_id, resolved, KeyStoreError, MemoryKeyStore, PublicKey, PublicKeyStore,
    Registration, RegistrationResult,
};
use crate::seal::{open, seal, NONCE_BYTES, TAG_BYTES};

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

/// Loads and opens every stored key into `memory`.
pub(crate) async fn load_keys(
    client: &Client,
    cipher: &Aes256Gcm,
    target: &str,
    memory: &MemoryKeyStore,
) -> Result<(), BridgeError> {
    let rows = client
        .query(
            "SELECT client_id, public_key_ciphertext, nonce, tag FROM public_keys",
            &[],
        )
        .await
        .map_err(|e| BridgeError::Load {
            target: target.to_owned(),
            what: "public_keys",
            cause: describe(&e),
        })?;
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
        memory.insert(&client_id, key);
    }
    Ok(())
}

/// The bridge thread's side of key registration.
pub(crate) struct KeyTask {
    link: Link,
    cipher: Aes256Gcm,
    memory: Arc<MemoryKeyStore>,
    commands: mpsc::Receiver<KeyCommand>,
    status: Arc<StatusCell>,
}

impl KeyTask {
    /// Serves `commands` over `link`.
    pub(crate) fn new(
        link: Link,
        cipher: Aes256Gcm,
        memory: Arc<MemoryKeyStore>,
        commands: mpsc::Receiver<KeyCommand>,
        status: Arc<StatusCell>,
    ) -> KeyTask {
        KeyTask {
            link,
            cipher,
            memory,
            commands,
            status,
        }
    }

    /// Serves registrations until `stop` turns true; those still queued then
    /// are answered `Unavailable`.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) {
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
            }
        }
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            let _ = command.reply.send(Err(KeyStoreError::Unavailable(
                "database bridge shutting down".to_owned(),
            )));
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
