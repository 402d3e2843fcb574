//! `[encryption]`: the end-to-end algorithm's name and the AES key that
//! seals stored public keys: the key's three sources, in order, and its
//! decoding, whose errors never echo the key.

use std::fmt;
use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use super::checks::check_non_empty_path;
use super::{Config, ConfigError};

/// Environment variable consulted for the AES key when neither
/// `encryption.aes_key` nor `encryption.aes_key_file` is set.
pub const ENV_AES_KEY: &str = "CIPHERMQ_AES_KEY";

/// The only end-to-end algorithm the clients speak (docs/ARCHITECTURE.md,
/// "End-to-end encryption"); the key exists so a future algorithm can be
/// introduced explicitly.
pub const ALGORITHM_X25519_CHACHA20_POLY1305: &str = "x25519_chacha20_poly1305";

/// `[encryption]`: the end-to-end algorithm name and the AES-256-GCM key that
/// seals stored public keys (docs/ARCHITECTURE.md, "Public keys and metadata").
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionConfig {
    /// End-to-end algorithm; must be `x25519_chacha20_poly1305` (the default).
    pub algorithm: String,
    /// AES-256 key, standard padded base64 of exactly 32 bytes. Takes precedence
    /// over `aes_key_file` and `CIPHERMQ_AES_KEY`. Default none.
    pub aes_key: Option<String>,
    /// File holding the base64 AES key (surrounding whitespace ignored); relative
    /// to the config file. Used when `aes_key` is unset. Default none.
    pub aes_key_file: Option<PathBuf>,
}

impl Default for EncryptionConfig {
    fn default() -> Self {
        EncryptionConfig {
            algorithm: ALGORITHM_X25519_CHACHA20_POLY1305.to_owned(),
            aes_key: None,
            aes_key_file: None,
        }
    }
}

// Hand-written so that `{:?}` of a config never prints the key.
impl fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionConfig")
            .field("algorithm", &self.algorithm)
            .field("aes_key", &self.aes_key.as_ref().map(|_| "<redacted>"))
            .field("aes_key_file", &self.aes_key_file)
            .finish()
    }
}

impl Config {
    /// The AES-256 key sealing stored public keys, from the first source that is
    /// set: `encryption.aes_key`, `encryption.aes_key_file`, then the
    /// `CIPHERMQ_AES_KEY` environment variable. `None` when none is set.
    pub fn resolve_aes_key(&self) -> Result<Option<[u8; 32]>, ConfigError> {
        // A value that is not UTF-8 becomes replacement characters, which then
        // fail to decode as base64: reported only if the variable is the source.
        let env = std::env::var_os(ENV_AES_KEY);
        let env = env.as_deref().map(|v| v.to_string_lossy());
        self.encryption.resolve_aes_key_with_env(env.as_deref())
    }

    pub(super) fn validate_encryption(&self) -> Result<(), ConfigError> {
        let e = &self.encryption;
        if e.algorithm != ALGORITHM_X25519_CHACHA20_POLY1305 {
            return Err(ConfigError::invalid(
                "encryption.algorithm",
                format!(
                    "{:?} is not supported (the only algorithm is \"{ALGORITHM_X25519_CHACHA20_POLY1305}\")",
                    e.algorithm
                ),
            ));
        }
        if let Some(key) = &e.aes_key {
            decode_aes_key("encryption.aes_key", key)?;
        }
        if let Some(p) = &e.aes_key_file {
            check_non_empty_path("encryption.aes_key_file", p)?;
        }
        Ok(())
    }
}

impl EncryptionConfig {
    /// [`Config::resolve_aes_key`] with the environment variable's value passed in,
    /// so it can be tested without touching the process environment.
    pub(super) fn resolve_aes_key_with_env(
        &self,
        env: Option<&str>,
    ) -> Result<Option<[u8; 32]>, ConfigError> {
        if let Some(key) = &self.aes_key {
            return decode_aes_key("encryption.aes_key", key).map(Some);
        }
        if let Some(path) = &self.aes_key_file {
            let text = std::fs::read_to_string(path).map_err(|err| {
                ConfigError::invalid(
                    "encryption.aes_key_file",
                    format!("cannot read {}: {err}", path.display()),
                )
            })?;
            return decode_aes_key("encryption.aes_key_file", &text)
                .map_err(|_| {
                    ConfigError::invalid(
                        "encryption.aes_key_file",
                        format!("{} must hold base64 of exactly 32 bytes", path.display()),
                    )
                })
                .map(Some);
        }
        match env.map(str::trim) {
            Some(value) if !value.is_empty() => decode_aes_key(&env_key(), value).map(Some),
            _ => Ok(None),
        }
    }
}

fn env_key() -> String {
    format!("{ENV_AES_KEY} (environment)")
}

/// Decodes standard padded base64 into exactly 32 bytes. The error never echoes
/// the input: it is a secret.
fn decode_aes_key(key: &str, value: &str) -> Result<[u8; 32], ConfigError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| {
            ConfigError::invalid(
                key,
                "must be base64 of exactly 32 bytes (it is not standard padded base64)",
            )
        })?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        ConfigError::invalid(
            key,
            format!(
                "must be base64 of exactly 32 bytes (it decodes to {} bytes)",
                bytes.len()
            ),
        )
    })
}
