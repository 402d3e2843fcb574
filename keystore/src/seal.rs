//! Sealing a public key at rest: AES-256-GCM under `encryption.aes_key`, a
//! fresh random 96-bit nonce per write, and the client id as associated data,
//! so a sealed key moved to another client (file renamed, row edited) does
//! not open. Shared by the file and PostgreSQL stores so both seal alike.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use rand::RngCore;

use crate::keys::PublicKey;

/// Bytes of the GCM nonce.
pub const NONCE_BYTES: usize = 12;
/// Bytes of the GCM authentication tag.
pub const TAG_BYTES: usize = 16;

/// A sealed key, split the way the PostgreSQL table stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The random nonce of this write.
    pub nonce: [u8; NONCE_BYTES],
    /// The encrypted key, without the tag.
    pub ciphertext: Vec<u8>,
    /// The GCM tag.
    pub tag: [u8; TAG_BYTES],
}

/// Seals `key` for `client_id` with a fresh nonce; `None` only if the cipher
/// refuses (it does not for 32-byte inputs).
pub fn seal(cipher: &Aes256Gcm, client_id: &str, key: &PublicKey) -> Option<Sealed> {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut nonce);
    let mut sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: key,
                aad: client_id.as_bytes(),
            },
        )
        .ok()?;
    let split = sealed.len().checked_sub(TAG_BYTES)?;
    let tag: [u8; TAG_BYTES] = sealed[split..].try_into().ok()?;
    sealed.truncate(split);
    Some(Sealed {
        nonce,
        ciphertext: sealed,
        tag,
    })
}

/// Opens a sealed key; `None` when it does not authenticate (wrong
/// `aes_key`, another client's key, damage) or has the wrong shape.
pub fn open(
    cipher: &Aes256Gcm,
    client_id: &str,
    nonce: &[u8],
    ciphertext: &[u8],
    tag: &[u8],
) -> Option<PublicKey> {
    if nonce.len() != NONCE_BYTES || tag.len() != TAG_BYTES {
        return None;
    }
    let mut body = Vec::with_capacity(ciphertext.len() + TAG_BYTES);
    body.extend_from_slice(ciphertext);
    body.extend_from_slice(tag);
    let plain = cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: &body,
                aad: client_id.as_bytes(),
            },
        )
        .ok()?;
    plain.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes_gcm::KeyInit;

    #[test]
    fn opens_only_for_the_same_client_and_key() {
        let cipher = Aes256Gcm::new(&[3u8; 32].into());
        let sealed = seal(&cipher, "r1", &[9u8; 32]).unwrap();
        assert_eq!(sealed.ciphertext.len(), 32);
        let open_as =
            |c: &Aes256Gcm, id: &str| open(c, id, &sealed.nonce, &sealed.ciphertext, &sealed.tag);
        assert_eq!(open_as(&cipher, "r1"), Some([9u8; 32]));
        assert_eq!(open_as(&cipher, "r2"), None);
        assert_eq!(open_as(&Aes256Gcm::new(&[4u8; 32].into()), "r1"), None);
        assert_eq!(
            open(&cipher, "r1", &[0; 3], &sealed.ciphertext, &sealed.tag),
            None
        );
    }

    #[test]
    fn every_write_gets_a_fresh_nonce() {
        let cipher = Aes256Gcm::new(&[3u8; 32].into());
        let a = seal(&cipher, "r1", &[9u8; 32]).unwrap();
        let b = seal(&cipher, "r1", &[9u8; 32]).unwrap();
        assert_ne!(a.nonce, b.nonce);
        assert_ne!(a.ciphertext, b.ciphertext);
    }
}
