//! Receivers' public keys for a publishing client: asked from the broker,
//! checked against their pins, cached for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ciphermq_proto::Reply;
use tokio::time::Instant;

use crate::client::driver::{Expect, Handle};
use crate::client::error::{fingerprint, PublishError};
use crate::client::pins::KeyPins;
use crate::client::reply;
use crate::crypto::{self, PublicKey};

/// What a client knows of receivers' keys.
#[derive(Debug)]
pub(crate) struct KeyBook {
    /// Pins (trust on first use).
    pins: Arc<dyn KeyPins>,
    /// How long a checked key is used without asking again.
    ttl: Duration,
    /// Keys checked against their pins, and when.
    cache: Mutex<HashMap<String, (PublicKey, Instant)>>,
    /// One lock per receiver, so concurrent publishes to a receiver whose key
    /// is not cached ask the broker (and write its pin) once, not once each.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyBook {
    /// An empty cache over `pins`.
    pub(crate) fn new(pins: Arc<dyn KeyPins>, ttl: Duration) -> KeyBook {
        KeyBook {
            pins,
            ttl,
            cache: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
        }
    }

    /// The key to encrypt for `receiver` with: cached, or the broker's if it
    /// equals the pin (pinned now when there is none), or the pin if the broker
    /// has none.
    pub(crate) async fn key_for(
        &self,
        handle: &Handle,
        receiver: &str,
    ) -> Result<PublicKey, PublishError> {
        if let Some(key) = self.cached(receiver) {
            return Ok(key);
        }
        let lock = self
            .fetching
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(receiver.to_owned())
            .or_default()
            .clone();
        let _fetching = lock.lock().await;
        // Another publish may have fetched it while this one waited.
        if let Some(key) = self.cached(receiver) {
            return Ok(key);
        }
        let offered = fetch(handle, receiver).await?;
        let pinned = self.pins.pinned(receiver)?;
        match (offered, pinned) {
            (None, None) => Err(PublishError::NoPublicKey {
                receiver: receiver.to_owned(),
            }),
            (None, Some(pinned)) => {
                tracing::debug!(
                    receiver,
                    "the broker has no public key for this receiver; using the pinned one"
                );
                Ok(pinned)
            }
            (Some(offered), None) => {
                self.pins.pin(receiver, &offered)?;
                tracing::info!(
                    receiver,
                    key = %fingerprint(&offered),
                    "pinned the receiver's public key on first use"
                );
                self.remember(receiver, &offered);
                Ok(offered)
            }
            (Some(offered), Some(pinned)) if offered == pinned => {
                self.remember(receiver, &offered);
                Ok(offered)
            }
            (Some(offered), Some(pinned)) => {
                tracing::warn!(
                    receiver,
                    pinned = %fingerprint(&pinned),
                    offered = %fingerprint(&offered),
                    "THE RECEIVER'S PUBLIC KEY CHANGED: refusing to encrypt for the new key. \
                     Either the receiver rotated its key or someone (the broker included) \
                     substitutes it; confirm with the receiver before accepting it"
                );
                Err(PublishError::KeyChanged {
                    receiver: receiver.to_owned(),
                    pinned,
                    offered,
                })
            }
        }
    }

    /// Pins the broker's current key for `receiver`, whatever was pinned.
    pub(crate) async fn accept_rotation(
        &self,
        handle: &Handle,
        receiver: &str,
    ) -> Result<PublicKey, PublishError> {
        let offered = fetch(handle, receiver)
            .await?
            .ok_or_else(|| PublishError::NoPublicKey {
                receiver: receiver.to_owned(),
            })?;
        self.accept(receiver, &offered)?;
        Ok(offered)
    }

    /// Pins `key` for `receiver`, whatever was pinned.
    pub(crate) fn accept(&self, receiver: &str, key: &PublicKey) -> Result<(), PublishError> {
        let old = self.pins.pinned(receiver)?;
        self.pins.pin(receiver, key)?;
        match old {
            Some(old) if old != *key => tracing::warn!(
                receiver,
                old = %fingerprint(&old),
                new = %fingerprint(key),
                "accepted a new public key for the receiver; it is pinned from now on"
            ),
            Some(_) => {}
            None => {
                tracing::info!(receiver, key = %fingerprint(key), "pinned the receiver's public key")
            }
        }
        self.remember(receiver, key);
        Ok(())
    }

    /// A cached key still fresh.
    fn cached(&self, receiver: &str) -> Option<PublicKey> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (key, at) = cache.get(receiver)?;
        (at.elapsed() < self.ttl).then(|| key.clone())
    }

    /// Caches a key found good.
    fn remember(&self, receiver: &str, key: &PublicKey) {
        if self.ttl.is_zero() {
            return;
        }
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(receiver.to_owned(), (key.clone(), Instant::now()));
    }
}

/// `get_public_key <receiver>`: the key, or `None` when the broker has none.
pub(crate) async fn fetch(
    handle: &Handle,
    receiver: &str,
) -> Result<Option<PublicKey>, PublishError> {
    reply::check_name("client id", receiver)?;
    let line = handle
        .call(format!("get_public_key {receiver}").into(), Expect::Line)
        .await?;
    match Reply::parse(&line) {
        Reply::PublicKey { client_id, key_b64 } if client_id == receiver => {
            crypto::public_key_from_base64(key_b64)
                .map(Some)
                .map_err(|error| PublishError::BadKey {
                    receiver: receiver.to_owned(),
                    error,
                })
        }
        Reply::Error(text) if text.starts_with("no public key") => Ok(None),
        _ => Err(PublishError::Request(reply::refusal(line))),
    }
}
