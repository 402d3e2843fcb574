//! Receivers' public keys for the sender: asked from the broker through the
//! client, checked against the keys pinned on first use (`known_receivers`),
//! and cached in `keys/<receiver_id>_public.key`.
//!
//! A receiver that has not registered yet is asked for again for up to
//! `key_wait_secs`, so a sender started together with its receivers works.
//! Then, if the broker still has none, the pinned key is used; else the cached
//! file (which is pinned from then on), with a warning. A key that differs from
//! the pinned one stops the sender ([`SenderError::KeyChanged`]).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::client::{Client, PublishError, RequestError};
use crate::crypto::{public_key_to_base64, PublicKey};
use crate::key_file;
use crate::sender::SenderError;

/// How often a missing key is asked for again while waiting.
const KEY_POLL: Duration = Duration::from_millis(250);

/// Gets the public key of every receiver; see the module documentation.
pub(crate) async fn fetch(
    client: &Client,
    receivers: &[String],
    keys_dir: &Path,
    pin_file: &Path,
    wait: Duration,
) -> Result<HashMap<String, PublicKey>, SenderError> {
    let deadline = Instant::now() + wait;
    let mut keys = HashMap::new();
    for receiver in receivers {
        if keys.contains_key(receiver) {
            continue;
        }
        let key = fetch_one(client, receiver, keys_dir, pin_file, deadline).await?;
        keys.insert(receiver.clone(), key);
    }
    Ok(keys)
}

/// One receiver's key; see the module documentation.
async fn fetch_one(
    client: &Client,
    receiver: &str,
    keys_dir: &Path,
    pin_file: &Path,
    deadline: Instant,
) -> Result<PublicKey, SenderError> {
    let cache = key_file::public_key_path(keys_dir, receiver);
    let mut logged_wait = false;
    // Wait for the receiver to register, if it has not yet.
    loop {
        match client.get_public_key(receiver).await {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => {
                if !logged_wait {
                    tracing::info!(
                        receiver,
                        "waiting for the receiver to register its public key"
                    );
                    logged_wait = true;
                }
                tokio::time::sleep(KEY_POLL).await;
            }
            Ok(None) => break,
            Err(error) => return Err(refused(receiver, error)),
        }
    }
    // The broker's key checked against the pin, or the pin if it has none.
    match client.receiver_key(receiver).await {
        Ok(key) => {
            store(&cache, receiver, &key);
            Ok(key)
        }
        Err(PublishError::NoPublicKey { .. }) => match key_file::read_public_key(&cache) {
            Ok(key) => {
                tracing::warn!(
                    receiver,
                    cache = %cache.display(),
                    "the broker has no public key for this receiver and none is pinned; \
                     using (and pinning) the cached key"
                );
                client
                    .accept_key(receiver, &key)
                    .map_err(|e| SenderError::Keys {
                        receiver: receiver.to_owned(),
                        error: e,
                    })?;
                Ok(key)
            }
            Err(error) => Err(SenderError::NoPublicKey {
                receiver: receiver.to_owned(),
                cache: error.to_string(),
            }),
        },
        Err(PublishError::KeyChanged {
            receiver,
            pinned,
            offered,
        }) => Err(SenderError::KeyChanged {
            pinned: public_key_to_base64(&pinned),
            offered: public_key_to_base64(&offered),
            pin_file: pin_file.to_owned(),
            receiver,
        }),
        Err(PublishError::Request(error)) => Err(refused(receiver, error)),
        Err(error) => Err(SenderError::Keys {
            receiver: receiver.to_owned(),
            error,
        }),
    }
}

/// A refused `get_public_key` (a CN without the sender role, say), or a lost
/// connection.
fn refused(receiver: &str, error: RequestError) -> SenderError {
    match error {
        RequestError::Denied(_) | RequestError::Broker(_) | RequestError::RateLimited => {
            SenderError::Refused(format!("get_public_key {receiver}: {error}"))
        }
        other => SenderError::Protocol(format!("get_public_key {receiver}: {other}")),
    }
}

/// Writes the cache file when it is missing or holds another key (the pin
/// decides which key is right); a cache that cannot be written is worth a
/// warning, not a failure.
fn store(cache: &Path, receiver: &str, key: &PublicKey) {
    match key_file::read_public_key(cache) {
        Ok(cached) if cached == *key => return,
        Ok(_) => tracing::info!(
            receiver,
            "the cached public key differs from the pinned one; updating the cache"
        ),
        Err(_) => {}
    }
    if let Err(error) = key_file::write_public_key(cache, key) {
        tracing::warn!(receiver, %error, "cannot cache the public key");
    }
}
