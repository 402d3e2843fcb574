//! [`PkiError`]: every failure names the file or the input at fault and, where
//! there is one, the command that gets the operator further.

use std::io;
use std::path::PathBuf;

/// Why a PKI operation failed; each variant names the file or the input at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// Reading, writing or creating a file or directory failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// A CN or SAN cannot be used (bad characters, reserved, or too long).
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// Two outputs would be written to the same file (for example a client CN
    /// `x_private` next to a receiver `x` when both go to the same directory).
    #[error("{}: two outputs would be written to this file; rename a CN or use separate directories", .0.display())]
    PathCollision(PathBuf),
    /// There is no CA to sign with: [`issue`](super::issue) never creates one.
    #[error("no CA: {} and {} do not exist; run `ciphermq-pki init` first (with the same --out and --ca-dir)", crt.display(), key.display())]
    NoCa {
        /// Where the CA certificate was looked for.
        crt: PathBuf,
        /// Where the CA key was looked for.
        key: PathBuf,
    },
    /// Only one of `ca.crt` and `ca.key` exists, so the CA cannot be reused and
    /// silently replacing it could orphan certificates in use.
    #[error("{} exists but {} is missing; restore it (if the key belongs to another PKI, give this one its own --ca-dir), or pass --force-ca to create a new CA", present.display(), missing.display())]
    PartialCa {
        /// The half that exists.
        present: PathBuf,
        /// The half that is missing.
        missing: PathBuf,
    },
    /// A CA key exists both in the CA directory and, from the old layout, beside
    /// the leaf keys; which one signs is not ours to guess.
    #[error("two CA keys: {} and {} (the old place, beside the leaf keys); keep the one that belongs to ca.crt in {} and delete the other", current.display(), legacy.display(), current.display())]
    TwoCaKeys {
        /// The key in the CA directory.
        current: PathBuf,
        /// The key in the certificate directory.
        legacy: PathBuf,
    },
    /// The existing CA files cannot be used.
    #[error("{}: cannot reuse the existing CA: {reason} (pass --force-ca to create a new CA)", path.display())]
    ExistingCa {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A certificate that was asked for already exists and nobody said to replace it.
    #[error("{} already exists (CN {cn}, valid until {not_after}); pass --force to re-issue it", path.display())]
    CertificateExists {
        /// The existing certificate.
        path: PathBuf,
        /// Its CN.
        cn: String,
        /// Its expiry, `YYYY-MM-DD HH:MM UTC`.
        not_after: String,
    },
    /// The server certificate on disk does not carry every requested name;
    /// re-issuing it is the operator's call, not a side effect.
    #[error("{} does not cover {} (it has {}); to re-issue it with its names and the new ones, run `ciphermq-pki init --force` with the same --san flags", path.display(), missing.join(", "), present.join(", "))]
    ServerSans {
        /// The server certificate.
        path: PathBuf,
        /// Requested names the certificate lacks.
        missing: Vec<String>,
        /// The names it has.
        present: Vec<String>,
    },
    /// An existing certificate cannot be kept (unreadable, its key missing or not
    /// matching, issued by another CA, another CN).
    #[error("cannot keep {}: {reason}; pass --force to re-issue it", path.display())]
    ExistingCertificate {
        /// The certificate.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A CN to revoke has no certificate where it would be.
    #[error("no certificate for CN {cn}: {} does not exist (same --out as when it was issued?)", path.display())]
    NoCertificate {
        /// The CN.
        cn: String,
        /// Where its certificate was looked for.
        path: PathBuf,
    },
    /// The revocation list on disk cannot be carried over.
    #[error("{}: {reason}", path.display())]
    BadCrl {
        /// The list.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rcgen refused to build a key or certificate.
    #[error("cannot generate {what}: {error}")]
    Rcgen {
        /// Which key or certificate.
        what: String,
        /// The underlying error.
        error: rcgen::Error,
    },
    /// An existing key file (X25519 or AES) is not what it should be.
    #[error("{}: {reason}", path.display())]
    BadKeyFile {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A receiver's public key exists without its private key: generating a new pair
    /// would silently change the receiver's identity, keeping it would leave a
    /// receiver that cannot decrypt.
    #[error("{} exists but its private key {} is missing; restore the private key, or delete the public key to create a new pair", public.display(), private.display())]
    OrphanPublicKey {
        /// The public key file.
        public: PathBuf,
        /// The missing private key file.
        private: PathBuf,
    },
}

/// Wraps an rcgen error with what was being generated.
pub(super) fn rcgen_err(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError {
    let what = what.to_owned();
    move |error| PkiError::Rcgen { what, error }
}
