//! Hybrid end-to-end encryption (docs/ARCHITECTURE.md, "End-to-end encryption"): what
//! a sender puts in a publish and what only the addressed receiver can open.
//!
//! Per message and per receiver:
//! 1. a random 256-bit session key and a random 96-bit nonce;
//! 2. the body is encrypted with ChaCha20-Poly1305 under them (tag appended), with
//!    the `message_id` bytes as associated data, so a ciphertext cannot be replayed
//!    under another id;
//! 3. the session key is wrapped in a libsodium sealed box (`crypto_box_seal`:
//!    ephemeral X25519 key ‖ XSalsa20-Poly1305 box, nonce = BLAKE2b(ephemeral_pk ‖
//!    receiver_pk)) for the receiver's X25519 public key.
//!
//! Every binary field travels as standard padded base64 (RFC 4648 §4) inside an
//! [`EncryptedInputData`] JSON object, the body of a `publish`. The broker relays it
//! without being able to read it. Nothing here logs: keys and plaintexts must never
//! reach a log line.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::rngs::OsRng;
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

pub use crypto_box::{PublicKey, SecretKey};

/// Bytes of an X25519 key and of a session key.
pub const KEY_BYTES: usize = 32;

/// Bytes of the ChaCha20-Poly1305 nonce (96 bits, the IETF variant libsodium calls
/// `crypto_aead_chacha20poly1305_ietf`).
pub const NONCE_BYTES: usize = 12;

/// Bytes a sealed box adds to what it seals: the ephemeral public key and the
/// Poly1305 tag (libsodium's `crypto_box_SEALBYTES`).
pub const SEAL_OVERHEAD: usize = 32 + 16;

/// The JSON body of a `publish` (docs/PROTOCOL.md, "Publish checks, in order"): a
/// message encrypted for one receiver.
///
/// The five named fields are required strings. `sender_client_id` is optional; the
/// broker refuses a publish whose `sender_client_id` is not the publisher's CN, so a
/// receiver may use it to tell senders apart. Anything else a sender added is kept
/// in [`EncryptedInputData::extra`] and written back unchanged, because the broker
/// relays extra fields and a receiver should see what was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptedInputData {
    /// `{sender_id}-{correlation_id}-{receiver_id}` for the reference sender; the
    /// broker deduplicates on it and it is the associated data of the ciphertext.
    pub message_id: String,
    /// Who can open it; the receiver checks it is itself.
    pub receiver_client_id: String,
    /// The session key sealed for the receiver (base64 of 80 bytes).
    pub enc_session_key: String,
    /// The ChaCha20-Poly1305 nonce (base64 of 12 bytes).
    pub nonce: String,
    /// The encrypted body with its 16-byte tag appended (base64).
    pub ciphertext: String,
    /// The sender's CN, as the broker verified it (not encrypted; the broker,
    /// not the ciphertext, vouches for it). `None` when the sender did not
    /// say; [`encrypt`] leaves it to the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_client_id: Option<String>,
    /// Fields beyond these, relayed as they are (not encrypted, not
    /// authenticated).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Why a message could not be encrypted or opened. The messages never contain key
/// material or plaintext.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// A field is not standard padded base64.
    #[error("{field} is not standard padded base64")]
    Base64 {
        /// The JSON field (or key file) that was wrong.
        field: &'static str,
    },
    /// A field decoded to the wrong number of bytes.
    #[error("{field} holds {got} bytes, expected {expected}")]
    Length {
        /// The JSON field (or key).
        field: &'static str,
        /// What it decoded to.
        got: usize,
        /// What it must hold.
        expected: usize,
    },
    /// The sealed session key does not open with this private key: the message is
    /// for another receiver, or `enc_session_key` was altered.
    #[error("the session key does not open with this private key (sealed for another receiver, or altered)")]
    SessionKey,
    /// The ciphertext does not authenticate: it, its nonce or its message id were
    /// altered (a ciphertext moved under another message id fails here).
    #[error("the ciphertext does not authenticate under its message id (altered, or replayed under another id)")]
    Ciphertext,
    /// The plaintext is larger than ChaCha20-Poly1305 can encrypt in one message
    /// (256 GiB); unreachable for anything the broker would accept.
    #[error("the plaintext is too large to encrypt")]
    TooLarge,
}

/// Encrypts `plaintext` for the receiver whose X25519 public key is `receiver_pk`,
/// with fresh randomness from the operating system.
pub fn encrypt(
    receiver_pk: &PublicKey,
    message_id: &str,
    receiver_client_id: &str,
    plaintext: &[u8],
) -> Result<EncryptedInputData, CryptoError> {
    encrypt_with_rng(
        &mut OsRng,
        receiver_pk,
        message_id,
        receiver_client_id,
        plaintext,
    )
}

/// [`encrypt`] with a caller-chosen cryptographically secure generator (a
/// per-thread one saves the system calls of [`OsRng`] on a hot path).
pub fn encrypt_with_rng<R: RngCore + CryptoRng>(
    rng: &mut R,
    receiver_pk: &PublicKey,
    message_id: &str,
    receiver_client_id: &str,
    plaintext: &[u8],
) -> Result<EncryptedInputData, CryptoError> {
    let mut session_key = Zeroizing::new([0u8; KEY_BYTES]);
    rng.fill_bytes(session_key.as_mut());
    let mut nonce = [0u8; NONCE_BYTES];
    rng.fill_bytes(&mut nonce);

    let cipher = ChaCha20Poly1305::new(Key::from_slice(session_key.as_ref()));
    let ciphertext = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: message_id.as_bytes(),
            },
        )
        .map_err(|_| CryptoError::TooLarge)?;
    let sealed = receiver_pk
        .seal(rng, session_key.as_ref())
        .map_err(|_| CryptoError::TooLarge)?;

    Ok(EncryptedInputData {
        message_id: message_id.to_owned(),
        receiver_client_id: receiver_client_id.to_owned(),
        enc_session_key: BASE64.encode(sealed),
        nonce: BASE64.encode(nonce),
        ciphertext: BASE64.encode(ciphertext),
        sender_client_id: None,
        extra: serde_json::Map::new(),
    })
}

/// Opens a message sealed for `secret`'s public key: unwraps the session key, then
/// decrypts and authenticates the body against `msg.message_id`.
///
/// It does not compare `receiver_client_id` with anything: the caller knows who it
/// is (a message for someone else fails with [`CryptoError::SessionKey`] anyway).
pub fn decrypt(secret: &SecretKey, msg: &EncryptedInputData) -> Result<Vec<u8>, CryptoError> {
    let sealed = decode("enc_session_key", &msg.enc_session_key)?;
    if sealed.len() != SEAL_OVERHEAD + KEY_BYTES {
        return Err(CryptoError::Length {
            field: "enc_session_key",
            got: sealed.len(),
            expected: SEAL_OVERHEAD + KEY_BYTES,
        });
    }
    let session_key = Zeroizing::new(
        secret
            .unseal(&sealed)
            .map_err(|_| CryptoError::SessionKey)?,
    );
    // The length was checked above, so an opened box holds exactly a key; check
    // anyway rather than trust arithmetic on someone else's construction.
    if session_key.len() != KEY_BYTES {
        return Err(CryptoError::Length {
            field: "session key",
            got: session_key.len(),
            expected: KEY_BYTES,
        });
    }
    let nonce = decode("nonce", &msg.nonce)?;
    if nonce.len() != NONCE_BYTES {
        return Err(CryptoError::Length {
            field: "nonce",
            got: nonce.len(),
            expected: NONCE_BYTES,
        });
    }
    let ciphertext = decode("ciphertext", &msg.ciphertext)?;
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&session_key));
    cipher
        .decrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &ciphertext,
                aad: msg.message_id.as_bytes(),
            },
        )
        .map_err(|_| CryptoError::Ciphertext)
}

/// A new X25519 key pair's secret half, from the operating system's generator.
pub fn generate_secret_key() -> SecretKey {
    SecretKey::generate(&mut OsRng)
}

/// A public key as the protocol carries it (`register_public_key`, `PUBLIC_KEY`):
/// standard padded base64 of its 32 bytes.
pub fn public_key_to_base64(key: &PublicKey) -> String {
    BASE64.encode(key.as_bytes())
}

/// Parses the standard padded base64 of a 32-byte X25519 public key.
pub fn public_key_from_base64(text: &str) -> Result<PublicKey, CryptoError> {
    Ok(PublicKey::from(key32_from_base64("public key", text)?))
}

/// Standard padded base64 of exactly 32 bytes (surrounding whitespace ignored), the
/// form of every raw key on disk and on the wire.
pub(crate) fn key32_from_base64(
    field: &'static str,
    text: &str,
) -> Result<[u8; KEY_BYTES], CryptoError> {
    let bytes = Zeroizing::new(decode(field, text.trim())?);
    <[u8; KEY_BYTES]>::try_from(bytes.as_slice()).map_err(|_| CryptoError::Length {
        field,
        got: bytes.len(),
        expected: KEY_BYTES,
    })
}

/// Base64-decodes one field.
fn decode(field: &'static str, text: &str) -> Result<Vec<u8>, CryptoError> {
    BASE64
        .decode(text)
        .map_err(|_| CryptoError::Base64 { field })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (SecretKey, PublicKey) {
        let secret = generate_secret_key();
        let public = secret.public_key();
        (secret, public)
    }

    #[test]
    fn round_trip() {
        let (sk, pk) = pair();
        let msg = encrypt(&pk, "s-1-r", "r", b"hello").unwrap();
        assert_eq!(msg.message_id, "s-1-r");
        assert_eq!(msg.receiver_client_id, "r");
        assert_eq!(decrypt(&sk, &msg).unwrap(), b"hello");
    }

    #[test]
    fn field_sizes_and_alphabet() {
        let (_, pk) = pair();
        let msg = encrypt(&pk, "m", "r", &[7u8; 100]).unwrap();
        assert_eq!(BASE64.decode(&msg.enc_session_key).unwrap().len(), 80);
        assert_eq!(BASE64.decode(&msg.nonce).unwrap().len(), 12);
        assert_eq!(BASE64.decode(&msg.ciphertext).unwrap().len(), 116);
        // Standard padded alphabet: 116 bytes encode to 156 characters ending in "=".
        assert_eq!(msg.ciphertext.len(), 156);
        assert!(msg.ciphertext.ends_with('='));
        assert!(!msg.ciphertext.contains('-') && !msg.ciphertext.contains('_'));
    }

    #[test]
    fn fresh_randomness_per_message() {
        let (_, pk) = pair();
        let a = encrypt(&pk, "m", "r", b"same").unwrap();
        let b = encrypt(&pk, "m", "r", b"same").unwrap();
        assert_ne!(a.enc_session_key, b.enc_session_key);
        assert_ne!(a.nonce, b.nonce);
        assert_ne!(a.ciphertext, b.ciphertext);
    }

    #[test]
    fn empty_plaintext() {
        let (sk, pk) = pair();
        let msg = encrypt(&pk, "m", "r", b"").unwrap();
        assert_eq!(decrypt(&sk, &msg).unwrap(), b"");
    }

    #[test]
    fn rejects_another_message_id() {
        let (sk, pk) = pair();
        let mut msg = encrypt(&pk, "s-1-r", "r", b"hello").unwrap();
        msg.message_id = "s-2-r".into();
        assert_eq!(decrypt(&sk, &msg), Err(CryptoError::Ciphertext));
    }

    #[test]
    fn rejects_tampered_ciphertext_and_nonce() {
        let (sk, pk) = pair();
        let msg = encrypt(&pk, "m", "r", b"hello world").unwrap();
        let mut bytes = BASE64.decode(&msg.ciphertext).unwrap();
        bytes[0] ^= 1;
        let tampered = EncryptedInputData {
            ciphertext: BASE64.encode(&bytes),
            ..msg.clone()
        };
        assert_eq!(decrypt(&sk, &tampered), Err(CryptoError::Ciphertext));
        let mut nonce = BASE64.decode(&msg.nonce).unwrap();
        nonce[11] ^= 0x80;
        let tampered = EncryptedInputData {
            nonce: BASE64.encode(&nonce),
            ..msg
        };
        assert_eq!(decrypt(&sk, &tampered), Err(CryptoError::Ciphertext));
    }

    #[test]
    fn rejects_tampered_session_key_and_wrong_receiver() {
        let (sk, pk) = pair();
        let (other_sk, _) = pair();
        let msg = encrypt(&pk, "m", "r", b"hello").unwrap();
        assert_eq!(decrypt(&other_sk, &msg), Err(CryptoError::SessionKey));
        let mut sealed = BASE64.decode(&msg.enc_session_key).unwrap();
        sealed[40] ^= 1;
        let tampered = EncryptedInputData {
            enc_session_key: BASE64.encode(&sealed),
            ..msg
        };
        assert_eq!(decrypt(&sk, &tampered), Err(CryptoError::SessionKey));
    }

    #[test]
    fn rejects_malformed_fields() {
        let (sk, pk) = pair();
        let msg = encrypt(&pk, "m", "r", b"x").unwrap();
        let bad = EncryptedInputData {
            nonce: "not base64!".into(),
            ..msg.clone()
        };
        assert_eq!(
            decrypt(&sk, &bad),
            Err(CryptoError::Base64 { field: "nonce" })
        );
        let bad = EncryptedInputData {
            nonce: BASE64.encode([0u8; 24]),
            ..msg.clone()
        };
        assert!(matches!(
            decrypt(&sk, &bad),
            Err(CryptoError::Length { field: "nonce", .. })
        ));
        // URL-safe or unpadded base64 is not the standard alphabet.
        let bad = EncryptedInputData {
            enc_session_key: msg.enc_session_key.replace('+', "-").replace('/', "_"),
            ..msg.clone()
        };
        if bad.enc_session_key != msg.enc_session_key {
            assert_eq!(
                decrypt(&sk, &bad),
                Err(CryptoError::Base64 {
                    field: "enc_session_key"
                })
            );
        }
        let bad = EncryptedInputData {
            enc_session_key: BASE64.encode([0u8; 79]),
            ..msg
        };
        assert!(matches!(
            decrypt(&sk, &bad),
            Err(CryptoError::Length {
                field: "enc_session_key",
                ..
            })
        ));
    }

    #[test]
    fn json_keeps_extra_fields_and_requires_the_five() {
        let text = r#"{"message_id":"m","receiver_client_id":"r","enc_session_key":"a","nonce":"b","ciphertext":"c","trace":{"id":7}}"#;
        let msg: EncryptedInputData = serde_json::from_str(text).unwrap();
        assert_eq!(msg.extra["trace"]["id"], 7);
        let back = serde_json::to_string(&msg).unwrap();
        assert_eq!(back, text);
        let missing = r#"{"message_id":"m","receiver_client_id":"r","nonce":"b","ciphertext":"c"}"#;
        assert!(serde_json::from_str::<EncryptedInputData>(missing).is_err());
        let not_string = r#"{"message_id":"m","receiver_client_id":"r","enc_session_key":1,"nonce":"b","ciphertext":"c"}"#;
        assert!(serde_json::from_str::<EncryptedInputData>(not_string).is_err());
    }

    #[test]
    fn json_carries_the_sender_id_only_when_set() {
        let text = r#"{"message_id":"m","receiver_client_id":"r","enc_session_key":"a","nonce":"b","ciphertext":"c","sender_client_id":"s","trace":1}"#;
        let mut msg: EncryptedInputData = serde_json::from_str(text).unwrap();
        assert_eq!(msg.sender_client_id.as_deref(), Some("s"));
        assert!(!msg.extra.contains_key("sender_client_id"));
        assert_eq!(serde_json::to_string(&msg).unwrap(), text);
        msg.sender_client_id = None;
        assert!(!serde_json::to_string(&msg)
            .unwrap()
            .contains("sender_client_id"));
        let null = text.replace(r#""s""#, "null");
        let msg: EncryptedInputData = serde_json::from_str(&null).unwrap();
        assert_eq!(msg.sender_client_id, None);
    }

    #[test]
    fn public_key_base64_round_trip() {
        let (_, pk) = pair();
        let text = public_key_to_base64(&pk);
        assert_eq!(text.len(), 44);
        assert_eq!(public_key_from_base64(&text).unwrap(), pk);
        assert!(matches!(
            public_key_from_base64("QUFB"),
            Err(CryptoError::Length { got: 3, .. })
        ));
    }
}
