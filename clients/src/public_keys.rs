//! Receivers' public keys for the sender: asked from the broker (`get_public_key`)
//! and cached in `keys/<receiver_id>_public.key`.
//!
//! The broker is asked first, because a receiver may have rotated its key. A
//! receiver that has not registered yet is asked again for up to
//! `key_wait_secs`, so a sender started together with its receivers works. If the
//! broker still has no key (its key store is in memory in this build, so a
//! restarted broker forgets keys until receivers reconnect), the cached file is
//! used, with a warning.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ciphermq_proto::Reply;

use crate::connection::Connection;
use crate::crypto::{self, PublicKey};
use crate::key_file;
use crate::sender::SenderError;

/// How often a missing key is asked for again while waiting.
const KEY_POLL: Duration = Duration::from_millis(250);

/// Gets the public key of every receiver; see the module documentation.
pub(crate) async fn fetch(
    conn: &mut Connection,
    receivers: &[String],
    keys_dir: &Path,
    wait: Duration,
) -> Result<HashMap<String, PublicKey>, SenderError> {
    let deadline = Instant::now() + wait;
    let mut keys = HashMap::new();
    for receiver in receivers {
        if keys.contains_key(receiver) {
            continue;
        }
        let key = fetch_one(conn, receiver, keys_dir, deadline).await?;
        keys.insert(receiver.clone(), key);
    }
    Ok(keys)
}

/// One receiver's key: from the broker (cached on success), else from the cache.
async fn fetch_one(
    conn: &mut Connection,
    receiver: &str,
    keys_dir: &Path,
    deadline: Instant,
) -> Result<PublicKey, SenderError> {
    let cache = key_file::public_key_path(keys_dir, receiver);
    let mut logged_wait = false;
    loop {
        let line = conn.request(&format!("get_public_key {receiver}")).await?;
        match Reply::parse(&line) {
            Reply::PublicKey { client_id, key_b64 } if client_id == receiver => {
                let key = crypto::public_key_from_base64(key_b64).map_err(|error| {
                    SenderError::Protocol(format!(
                        "the broker's public key for {receiver} is unusable: {error}"
                    ))
                })?;
                store(&cache, receiver, &key);
                return Ok(key);
            }
            Reply::Error(reason) if reason.starts_with("no public key") => {
                if Instant::now() < deadline {
                    if !logged_wait {
                        tracing::info!(
                            receiver,
                            "waiting for the receiver to register its public key"
                        );
                        logged_wait = true;
                    }
                    tokio::time::sleep(KEY_POLL).await;
                    continue;
                }
                return match key_file::read_public_key(&cache) {
                    Ok(key) => {
                        tracing::warn!(
                            receiver,
                            cache = %cache.display(),
                            "the broker has no public key for this receiver; using the cached key"
                        );
                        Ok(key)
                    }
                    Err(error) => Err(SenderError::NoPublicKey {
                        receiver: receiver.to_owned(),
                        cache: error.to_string(),
                    }),
                };
            }
            Reply::AccessDenied(line) => {
                return Err(SenderError::Refused(format!(
                    "get_public_key {receiver}: {line}"
                )))
            }
            _ => {
                return Err(SenderError::Protocol(format!(
                    "unexpected reply to get_public_key {receiver}: {line}"
                )))
            }
        }
    }
}

/// Writes the cache file when it is missing or holds another key; a cache that
/// cannot be written is worth a warning, not a failure.
fn store(cache: &Path, receiver: &str, key: &PublicKey) {
    match key_file::read_public_key(cache) {
        Ok(cached) if cached == *key => return,
        Ok(_) => tracing::info!(
            receiver,
            "the receiver's public key changed; updating the cache"
        ),
        Err(_) => {}
    }
    if let Err(error) = key_file::write_public_key(cache, key) {
        tracing::warn!(receiver, %error, "cannot cache the public key");
    }
}
