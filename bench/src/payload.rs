//! Message bodies. Pre-encrypted: one `EncryptedInputData` envelope per run,
//! of an exact size, in which only the message id and the send timestamp
//! change per message (measures the broker). Live: every message encrypted by
//! `ciphermq_clients::crypto` for the receiver's X25519 key, and decrypted by
//! the consumer (measures the whole path).
//!
//! The same bytes are published to every broker, so payload sizes match. The
//! timestamp (microseconds since the run's start: the scheduled send time at a
//! fixed rate, the actual send time otherwise) is the last field, a string of
//! decimal digits zero padded to a fixed width (a JSON number may not have
//! leading zeros), so a consumer reads it back from the end of the body
//! without parsing the JSON.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use base64::Engine as _;
use ciphermq_clients::crypto::{self, EncryptedInputData, PublicKey, SecretKey};
use ciphermq_clients::key_file;
use rand::RngCore;

/// `{"message_id":"`
const ID_KEY: &[u8] = br#"{"message_id":""#;
/// Digits of the run part of an id (`r` + 8 hex digits).
const RUN_WIDTH: usize = 8;
/// Digits of the publisher part of an id.
const PUBLISHER_WIDTH: usize = 4;
/// Digits of the sequence part of an id.
const SEQ_WIDTH: usize = 10;
/// Length of a message id: `r{run:08x}p{publisher:04}s{seq:010}`.
pub const ID_LEN: usize = 1 + RUN_WIDTH + 1 + PUBLISHER_WIDTH + 1 + SEQ_WIDTH;
/// The timestamp field's key and opening quote.
const STAMP_KEY: &[u8] = br#"","sent_us":""#;
/// What follows the timestamp digits.
const TAIL: &[u8] = br#""}"#;
/// Digits of the timestamp (u64::MAX has 20).
const STAMP_WIDTH: usize = 20;
/// A sealed box of a 32-byte session key: 32 (ephemeral key) + 32 + 16 (tag).
const SEALED_KEY_BYTES: usize = crypto::SEAL_OVERHEAD + crypto::KEY_BYTES;
/// ChaCha20-Poly1305 nonce.
const NONCE_BYTES: usize = crypto::NONCE_BYTES;
/// ChaCha20-Poly1305 tag, appended to the ciphertext.
const TAG_BYTES: usize = 16;

/// The smallest `--size` for `receiver`: every fixed field and 4 bytes of ciphertext.
pub fn min_size(receiver: &str) -> usize {
    Template::overhead(receiver) + 4
}

/// An envelope of exactly `size` bytes with slots for an id and a timestamp.
#[derive(Debug, Clone)]
pub struct Template {
    /// The body with a zero id and a zero timestamp.
    bytes: Vec<u8>,
    /// Where the id starts.
    id_at: usize,
    /// Where the timestamp digits start.
    stamp_at: usize,
    /// `r{run:08x}`: ids of this run start with it.
    prefix: String,
}

impl Template {
    /// Bytes of the envelope that are not ciphertext.
    fn overhead(receiver: &str) -> usize {
        let b64 = |n: usize| n.div_ceil(3) * 4;
        ID_KEY.len()
            + ID_LEN
            + r#"","receiver_client_id":""#.len()
            + receiver.len()
            + r#"","enc_session_key":""#.len()
            + b64(SEALED_KEY_BYTES)
            + r#"","nonce":""#.len()
            + b64(NONCE_BYTES)
            + r#"","ciphertext":""#.len()
            + STAMP_KEY.len()
            + STAMP_WIDTH
            + TAIL.len()
    }

    /// An envelope for `receiver` of exactly `size` bytes (at least
    /// [`min_size`]), tagged with `run`; its base64 fields hold random bytes.
    pub fn new(size: usize, receiver: &str, run: u32) -> Template {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut rng = rand::thread_rng();
        let mut random = |n: usize| {
            let mut v = vec![0u8; n];
            rng.fill_bytes(&mut v);
            v
        };
        let key = b64.encode(random(SEALED_KEY_BYTES));
        let nonce = b64.encode(random(NONCE_BYTES));
        let filler_len = size.saturating_sub(Self::overhead(receiver)).max(4);
        let mut filler = b64.encode(random(filler_len.div_ceil(4) * 3));
        filler.truncate(filler_len);

        let prefix = format!("r{run:08x}");
        let mut bytes = Vec::with_capacity(size);
        bytes.extend_from_slice(ID_KEY);
        let id_at = bytes.len();
        bytes.extend_from_slice(prefix.as_bytes());
        bytes.extend_from_slice(format!("p{:0PUBLISHER_WIDTH$}s{:0SEQ_WIDTH$}", 0, 0).as_bytes());
        bytes.extend_from_slice(br#"","receiver_client_id":""#);
        bytes.extend_from_slice(receiver.as_bytes());
        bytes.extend_from_slice(br#"","enc_session_key":""#);
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(br#"","nonce":""#);
        bytes.extend_from_slice(nonce.as_bytes());
        bytes.extend_from_slice(br#"","ciphertext":""#);
        bytes.extend_from_slice(filler.as_bytes());
        bytes.extend_from_slice(STAMP_KEY);
        let stamp_at = bytes.len();
        bytes.extend_from_slice(&[b'0'; STAMP_WIDTH]);
        bytes.extend_from_slice(TAIL);
        Template {
            bytes,
            id_at,
            stamp_at,
            prefix,
        }
    }

    /// Body length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// `r{run:08x}`: the ids of this run start with it, so leftovers of an
    /// interrupted earlier run are acknowledged but not counted.
    pub fn id_prefix(&self) -> &str {
        &self.prefix
    }

    /// Appends the body of message `seq` of `publisher`, stamped `stamp_us`.
    pub fn write(&self, out: &mut Vec<u8>, publisher: usize, seq: u64, stamp_us: u64) {
        let start = out.len();
        out.extend_from_slice(&self.bytes);
        let id = start + self.id_at + 1 + RUN_WIDTH;
        write_digits(&mut out[id + 1..id + 1 + PUBLISHER_WIDTH], publisher as u64);
        let seq_at = id + 1 + PUBLISHER_WIDTH + 1;
        write_digits(&mut out[seq_at..seq_at + SEQ_WIDTH], seq);
        let stamp = start + self.stamp_at;
        write_digits(&mut out[stamp..stamp + STAMP_WIDTH], stamp_us);
    }
}

/// How a run makes its bodies.
#[derive(Debug)]
pub enum Body {
    /// One envelope, re-stamped per message.
    PreEncrypted(Template),
    /// A real encryption per message.
    Live(Live),
}

impl Body {
    /// Appends the body of message `seq` of `publisher`, stamped `stamp_us`.
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        publisher: usize,
        seq: u64,
        stamp_us: u64,
    ) -> Result<()> {
        match self {
            Body::PreEncrypted(t) => {
                t.write(out, publisher, seq, stamp_us);
                Ok(())
            }
            Body::Live(l) => l.write(out, publisher, seq, stamp_us),
        }
    }

    /// Body length in bytes (live: the largest a body can be).
    pub fn len(&self) -> usize {
        match self {
            Body::PreEncrypted(t) => t.len(),
            Body::Live(l) => l.size,
        }
    }

    /// Ids of this run start with it.
    pub fn id_prefix(&self) -> &str {
        match self {
            Body::PreEncrypted(t) => t.id_prefix(),
            Body::Live(l) => &l.prefix,
        }
    }
}

/// Live encryption: a plaintext sealed anew for every message.
#[derive(Debug)]
pub struct Live {
    /// The receiver's X25519 public key.
    public_key: PublicKey,
    /// The receiver's CN, written into each envelope.
    receiver: String,
    /// What is encrypted (random bytes, sized so the envelope is about `size`).
    plaintext: Vec<u8>,
    /// `r{run:08x}`.
    prefix: String,
    /// The envelope size aimed at (bodies are at most this long).
    size: usize,
}

impl Live {
    /// Reads `receiver`'s public key from `keys_dir` (as `ciphermq-pki` writes
    /// it) and sizes the plaintext so that each envelope is `size` bytes give
    /// or take base64 padding.
    pub fn new(size: usize, receiver: &str, run: u32, keys_dir: &Path) -> Result<Live> {
        let path = key_file::public_key_path(keys_dir, receiver);
        let public_key = key_file::read_public_key(&path)
            .with_context(|| format!("live encryption needs {receiver}'s public key"))?;
        let room = size.saturating_sub(Template::overhead(receiver));
        let plaintext_len = (room / 4 * 3).saturating_sub(TAG_BYTES).max(1);
        let mut plaintext = vec![0u8; plaintext_len];
        rand::thread_rng().fill_bytes(&mut plaintext);
        Ok(Live {
            public_key,
            receiver: receiver.to_owned(),
            plaintext,
            prefix: format!("r{run:08x}"),
            size,
        })
    }

    fn write(&self, out: &mut Vec<u8>, publisher: usize, seq: u64, stamp_us: u64) -> Result<()> {
        let id = format!(
            "{}p{:0PUBLISHER_WIDTH$}s{:0SEQ_WIDTH$}",
            self.prefix,
            publisher % 10usize.pow(PUBLISHER_WIDTH as u32),
            seq % 10u64.pow(SEQ_WIDTH as u32)
        );
        let mut data = crypto::encrypt_with_rng(
            &mut rand::thread_rng(),
            &self.public_key,
            &id,
            &self.receiver,
            &self.plaintext,
        )?;
        data.extra.insert(
            "sent_us".to_owned(),
            serde_json::Value::String(format!("{stamp_us:0STAMP_WIDTH$}")),
        );
        serde_json::to_writer(out, &data)?;
        Ok(())
    }
}

/// What a consumer does with a body in live mode: open it.
#[derive(Clone)]
pub struct Opener(Arc<SecretKey>);

impl Opener {
    /// Reads `receiver`'s private key from `keys_dir`.
    pub fn new(receiver: &str, keys_dir: &Path) -> Result<Opener> {
        let path = key_file::private_key_path(keys_dir, receiver);
        let key = key_file::read_secret_key(&path)
            .with_context(|| format!("live encryption needs {receiver}'s private key"))?;
        Ok(Opener(Arc::new(key)))
    }

    /// Parses and decrypts a body; `false` if it does not open.
    pub fn open(&self, body: &[u8]) -> bool {
        serde_json::from_slice::<EncryptedInputData>(body)
            .ok()
            .is_some_and(|m| crypto::decrypt(&self.0, &m).is_ok())
    }
}

/// Writes `n` right-aligned in decimal over `slot` (which holds zeros); digits
/// that do not fit are dropped (ids wrap, they never overflow the slot).
fn write_digits(slot: &mut [u8], mut n: u64) {
    for b in slot.iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The timestamp of a body written by [`Template::write`].
pub fn stamp_of(body: &[u8]) -> Option<u64> {
    let end = body.len().checked_sub(TAIL.len())?;
    let start = end.checked_sub(STAMP_WIDTH)?;
    if &body[end..] != TAIL || !body[..start].ends_with(STAMP_KEY) {
        return None;
    }
    body[start..end].iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.wrapping_mul(10).wrapping_add(u64::from(b - b'0')))
    })
}

/// The message id of a body written by [`Template::write`].
pub fn id_of(body: &[u8]) -> Option<&str> {
    let id = body.strip_prefix(ID_KEY)?.get(..ID_LEN)?;
    std::str::from_utf8(id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_exact_size_and_pass_the_broker_check() {
        for size in [min_size("receiver_1"), 512, 1024, 16 * 1024] {
            let t = Template::new(size, "receiver_1", 0xabcdef01);
            let mut out = Vec::new();
            t.write(&mut out, 3, 42, 1_234_567);
            assert_eq!(out.len(), size);
            assert_eq!(t.len(), size);
            let body = std::str::from_utf8(&out).unwrap();
            let info = ciphermq_proto::inspect_message(body).unwrap();
            assert_eq!(info.message_id, "rabcdef01p0003s0000000042");
            assert_eq!(id_of(&out), Some("rabcdef01p0003s0000000042"));
            assert!(info.message_id.starts_with(t.id_prefix()));
            assert_eq!(stamp_of(&out), Some(1_234_567));
        }
    }

    #[test]
    fn write_appends_after_what_is_already_there() {
        let t = Template::new(600, "receiver_1", 7);
        let mut out = b"publish ex key ".to_vec();
        t.write(&mut out, 0, 1, u64::MAX);
        let body = &out[b"publish ex key ".len()..];
        assert_eq!(stamp_of(body), Some(u64::MAX));
        assert_eq!(id_of(body), Some("r00000007p0000s0000000001"));
    }

    #[test]
    fn live_bodies_are_about_the_size_and_open_with_the_receivers_key() {
        let dir = tempfile::tempdir().unwrap();
        let secret = crypto::generate_secret_key();
        key_file::write_secret_key(
            &key_file::private_key_path(dir.path(), "receiver_1"),
            &secret,
        )
        .unwrap();
        key_file::write_public_key(
            &key_file::public_key_path(dir.path(), "receiver_1"),
            &secret.public_key(),
        )
        .unwrap();
        for size in [1024, 16 * 1024] {
            let live = Body::Live(Live::new(size, "receiver_1", 9, dir.path()).unwrap());
            let mut out = Vec::new();
            live.write(&mut out, 2, 5, 77).unwrap();
            assert!(
                out.len() <= size && out.len() + 4 > size,
                "{} vs {size}",
                out.len()
            );
            let body = std::str::from_utf8(&out).unwrap();
            assert_eq!(
                ciphermq_proto::inspect_message(body).unwrap().message_id,
                "r00000009p0002s0000000005"
            );
            assert_eq!(id_of(&out), Some("r00000009p0002s0000000005"));
            assert_eq!(stamp_of(&out), Some(77));
            let opener = Opener::new("receiver_1", dir.path()).unwrap();
            assert!(opener.open(&out));
            let mut tampered = out.clone();
            tampered[id_of(&out).unwrap().len() + 10] ^= 1;
            assert!(!opener.open(&tampered));
        }
    }

    #[test]
    fn foreign_bodies_have_no_stamp() {
        assert_eq!(stamp_of(b""), None);
        assert_eq!(stamp_of(br#"{"message_id":"x"}"#), None);
        assert_eq!(stamp_of(br#"{"sent_us":"00000000000000000001"}"#), None);
    }
}
