//! The CipherMQ PKI in one call: a CA, the broker's server certificate, client
//! certificates (the CN is the identity the broker's ACL sees), the receivers' X25519
//! key pairs for end-to-end encryption, and the broker's AES key for sealing stored
//! public keys.
//!
//! What is precious is never overwritten: an existing CA is reused (every certificate
//! ever issued by it stays valid) unless [`PkiOptions::force_ca`] is set, and existing
//! X25519 key pairs and `aes.key` are kept (a receiver's key is its identity for
//! senders; the AES key opens the broker's sealed key store). Server and client
//! certificates are cheap and are re-issued on every run.
//!
//! Every file is written to a temporary name in the same directory, fsynced and
//! renamed, so a crash never leaves half a key; private keys are created with mode
//! 0600 from the start.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, Ia5String, IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// Common Name of the CA certificate, so operators recognise it in trust stores.
pub const CA_COMMON_NAME: &str = "CipherMQ CA";

/// Common Name of the broker's server certificate.
pub const SERVER_COMMON_NAME: &str = "ciphermq-server";

/// Default lifetime of issued certificates in days (the CA/Browser Forum's old
/// maximum, which most TLS stacks still accept without complaint).
pub const DEFAULT_VALIDITY_DAYS: u32 = 825;

/// A new CA lives at least this many days (or [`PkiOptions::validity_days`] if
/// longer), so re-issuing leaf certificates never runs into the CA's own expiry.
pub const CA_MIN_VALIDITY_DAYS: u32 = 3650;

/// File stems that belong to the PKI itself and so cannot be client CNs: a client
/// named `ca` would overwrite `ca.crt`/`ca.key`, one named `aes` the AES key.
const RESERVED_STEMS: [&str; 3] = ["ca", "server", "aes"];

/// Certificates are valid from slightly in the past, so a peer whose clock lags by a
/// few minutes does not reject a freshly issued certificate.
const CLOCK_SKEW: Duration = Duration::minutes(5);

/// File mode of private keys and secrets.
const SECRET_MODE: u32 = 0o600;

/// File mode of certificates and public keys.
const PUBLIC_MODE: u32 = 0o644;

/// What to generate and where; the input of [`generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiOptions {
    /// Directory of the certificates, their private keys and `aes.key` (created if
    /// missing).
    pub out_dir: PathBuf,
    /// Directory of the receivers' X25519 key pairs (created if missing).
    pub keys_dir: PathBuf,
    /// Extra subject alternative names of the server certificate beyond `localhost`,
    /// `127.0.0.1` and `::1`; IP addresses become IP SANs, anything else a DNS SAN.
    pub server_sans: Vec<String>,
    /// One client certificate (clientAuth) is issued per CN; the CN is the identity
    /// the broker maps to a role.
    pub client_cns: Vec<String>,
    /// CNs that get an X25519 key pair for end-to-end encryption (they need a client
    /// certificate too, so list them in `client_cns` as well).
    pub receiver_cns: Vec<String>,
    /// Replace an existing CA. Every certificate issued by the old one stops being
    /// trusted, so this is opt-in.
    pub force_ca: bool,
    /// Lifetime of the server and client certificates in days (at least 1).
    pub validity_days: u32,
}

impl PkiOptions {
    /// Options with no clients, no extra SANs, no forced CA and
    /// [`DEFAULT_VALIDITY_DAYS`]; the starting point for builders and tests.
    pub fn new(out_dir: impl Into<PathBuf>, keys_dir: impl Into<PathBuf>) -> Self {
        PkiOptions {
            out_dir: out_dir.into(),
            keys_dir: keys_dir.into(),
            server_sans: Vec::new(),
            client_cns: Vec::new(),
            receiver_cns: Vec::new(),
            force_ca: false,
            validity_days: DEFAULT_VALIDITY_DAYS,
        }
    }
}

/// Whether this run created the CA or reused the one on disk; operators must know
/// when old certificates stopped being trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    /// A new CA was generated (none existed, or [`PkiOptions::force_ca`] was set).
    Generated,
    /// The CA on disk was loaded and signed this run's certificates.
    Reused,
}

/// What happened to one file, so the report tells created from replaced from kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAction {
    /// The file did not exist and was written.
    Created,
    /// The file existed and was replaced atomically.
    Replaced,
    /// The file existed, was checked, and was left untouched.
    Kept,
}

/// One file of the PKI and what this run did to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiFile {
    /// Where the file is.
    pub path: PathBuf,
    /// Created, replaced or kept.
    pub action: FileAction,
    /// True for private keys and other secrets (mode 0600), so callers can warn about
    /// where they are copied.
    pub secret: bool,
}

/// The outcome of [`generate`]: what the operator needs to know about the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiReport {
    /// Whether the CA is new (old certificates are no longer trusted) or reused.
    pub ca: CaOrigin,
    /// Every file of the PKI in the order it was handled.
    pub files: Vec<PkiFile>,
}

impl fmt::Display for PkiReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ca {
            CaOrigin::Generated => writeln!(f, "CA: generated a new CA")?,
            CaOrigin::Reused => writeln!(
                f,
                "CA: reused the existing CA (use --force-ca to replace it)"
            )?,
        }
        for file in &self.files {
            let action = match file.action {
                FileAction::Created => "created ",
                FileAction::Replaced => "replaced",
                FileAction::Kept => "kept    ",
            };
            let secret = if file.secret {
                "  (secret, mode 0600)"
            } else {
                ""
            };
            writeln!(f, "  {action} {}{secret}", file.path.display())?;
        }
        Ok(())
    }
}

/// Why [`generate`] failed; each variant names the file or the input at fault.
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
    /// Only one of `ca.crt` and `ca.key` exists, so the CA cannot be reused and
    /// silently replacing it could orphan certificates in use.
    #[error("{} exists but {} is missing; restore it, or pass --force-ca to create a new CA", present.display(), missing.display())]
    PartialCa {
        /// The half that exists.
        present: PathBuf,
        /// The half that is missing.
        missing: PathBuf,
    },
    /// The existing CA files cannot be used.
    #[error("{}: cannot reuse the existing CA: {reason} (pass --force-ca to create a new CA)", path.display())]
    ExistingCa {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong.
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

/// The CA that signs this run's certificates.
struct Ca {
    /// An issuer object with the CA's subject and key identifier (for an existing CA
    /// this is a re-signed copy that is never written: only its names are used).
    cert: Certificate,
    /// The CA's private key.
    key: KeyPair,
    /// The CA's expiry; issued certificates never outlive it.
    not_after: OffsetDateTime,
}

/// Generates (or completes) the PKI described by `opts` and reports every file.
///
/// Files: `{out_dir}/ca.crt`, `ca.key`, `server.crt`, `server.key`, `{cn}.crt` and
/// `{cn}.key` per client CN, `aes.key`, and `{keys_dir}/{cn}_private.key`,
/// `{cn}_public.key` per receiver CN. All inputs are validated before anything is
/// written.
pub fn generate(opts: &PkiOptions) -> Result<PkiReport, PkiError> {
    if opts.validity_days == 0 {
        return Err(PkiError::InvalidOption(
            "validity_days must be at least 1".into(),
        ));
    }
    let clients = dedup(&opts.client_cns);
    let receivers = dedup(&opts.receiver_cns);
    for cn in clients.iter().chain(&receivers) {
        validate_cn(cn)?;
    }
    let server_sans = server_sans(&opts.server_sans)?;
    check_collisions(opts, &clients, &receivers)?;

    create_dir(&opts.out_dir)?;
    create_dir(&opts.keys_dir)?;

    let now = OffsetDateTime::now_utc();
    let mut files = Vec::new();
    let ca_crt = opts.out_dir.join("ca.crt");
    let ca_key = opts.out_dir.join("ca.key");
    let (ca, origin) = match (exists(&ca_crt)?, exists(&ca_key)?, opts.force_ca) {
        (true, true, false) => {
            let ca = load_ca(&ca_crt, &ca_key, now)?;
            files.push(kept(&ca_crt, false));
            files.push(kept(&ca_key, true));
            (ca, CaOrigin::Reused)
        }
        (true, false, false) => {
            return Err(PkiError::PartialCa {
                present: ca_crt,
                missing: ca_key,
            });
        }
        (false, true, false) => {
            return Err(PkiError::PartialCa {
                present: ca_key,
                missing: ca_crt,
            });
        }
        _ => (
            create_ca(opts, now, &ca_crt, &ca_key, &mut files)?,
            CaOrigin::Generated,
        ),
    };

    let leaf_not_after = (now + Duration::days(i64::from(opts.validity_days))).min(ca.not_after);
    let validity = (now - CLOCK_SKEW, leaf_not_after);

    issue(
        &ca,
        SERVER_COMMON_NAME,
        server_sans,
        ExtendedKeyUsagePurpose::ServerAuth,
        validity,
        &opts.out_dir.join("server"),
        &mut files,
    )?;
    for cn in &clients {
        issue(
            &ca,
            cn,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            validity,
            &opts.out_dir.join(cn),
            &mut files,
        )?;
    }
    for cn in &receivers {
        x25519_pair(&opts.keys_dir, cn, &mut files)?;
    }
    aes_key(&opts.out_dir.join("aes.key"), &mut files)?;

    Ok(PkiReport { ca: origin, files })
}

/// The names in order of first appearance, without repeats.
fn dedup(names: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect()
}

/// A CN becomes a file name and a broker identity: it must follow the protocol's name
/// rule `[A-Za-z0-9_.:-]{1,255}`, must not be `.`/`..`, and must not shadow a file of
/// the PKI itself.
fn validate_cn(cn: &str) -> Result<(), PkiError> {
    let invalid = |reason: &str| PkiError::InvalidName {
        name: cn.to_owned(),
        reason: reason.to_owned(),
    };
    if cn.is_empty() || cn.len() > 255 {
        return Err(invalid("a CN must be 1 to 255 bytes long"));
    }
    if !cn
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
    {
        return Err(invalid("a CN may only contain A-Z a-z 0-9 _ . : -"));
    }
    if cn == "." || cn == ".." {
        return Err(invalid("a CN cannot be a directory name"));
    }
    if RESERVED_STEMS.contains(&cn) {
        return Err(invalid(
            "this name is used by the PKI's own files (ca, server, aes)",
        ));
    }
    Ok(())
}

/// The server certificate's SANs: localhost, 127.0.0.1 and ::1, then the extra names
/// (IPs as IP SANs, the rest as DNS SANs), without repeats.
fn server_sans(extra: &[String]) -> Result<Vec<SanType>, PkiError> {
    let mut sans = Vec::new();
    let mut push = |san: SanType| {
        if !sans.contains(&san) {
            sans.push(san);
        }
    };
    push(SanType::DnsName(dns_name("localhost")?));
    push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    for name in extra {
        match name.parse::<IpAddr>() {
            Ok(ip) => push(SanType::IpAddress(ip)),
            Err(_) => push(SanType::DnsName(dns_name(name)?)),
        }
    }
    Ok(sans)
}

/// Checks a DNS SAN: ASCII letters, digits, `-`, `.`, and a leading `*.` wildcard.
fn dns_name(name: &str) -> Result<Ia5String, PkiError> {
    let invalid = |reason: String| PkiError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    let host = name.strip_prefix("*.").unwrap_or(name);
    if host.is_empty() || name.len() > 253 {
        return Err(invalid("a DNS name must be 1 to 253 bytes long".into()));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(invalid(
            "not an IP address, and a DNS name may only contain A-Z a-z 0-9 - .".into(),
        ));
    }
    Ia5String::try_from(name).map_err(|e| invalid(e.to_string()))
}

/// Refuses inputs that would make two outputs share a file, before anything is
/// written.
fn check_collisions(
    opts: &PkiOptions,
    clients: &[String],
    receivers: &[String],
) -> Result<(), PkiError> {
    let mut paths = vec![
        opts.out_dir.join("ca.crt"),
        opts.out_dir.join("ca.key"),
        opts.out_dir.join("server.crt"),
        opts.out_dir.join("server.key"),
        opts.out_dir.join("aes.key"),
    ];
    for cn in clients {
        paths.push(opts.out_dir.join(format!("{cn}.crt")));
        paths.push(opts.out_dir.join(format!("{cn}.key")));
    }
    for cn in receivers {
        paths.push(opts.keys_dir.join(format!("{cn}_private.key")));
        paths.push(opts.keys_dir.join(format!("{cn}_public.key")));
    }
    let mut seen = HashSet::new();
    for path in paths {
        if !seen.insert(path.clone()) {
            return Err(PkiError::PathCollision(path));
        }
    }
    Ok(())
}

/// Makes a new CA and writes it (key first: a crash in between leaves a partial CA
/// that the next run refuses to guess about).
fn create_ca(
    opts: &PkiOptions,
    now: OffsetDateTime,
    crt_path: &Path,
    key_path: &Path,
    files: &mut Vec<PkiFile>,
) -> Result<Ca, PkiError> {
    let key =
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).map_err(rcgen_err("the CA key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - CLOCK_SKEW;
    params.not_after =
        now + Duration::days(i64::from(opts.validity_days.max(CA_MIN_VALIDITY_DAYS)));
    params.serial_number = Some(random_serial());
    let not_after = params.not_after;
    let cert = params
        .self_signed(&key)
        .map_err(rcgen_err("the CA certificate"))?;
    files.push(write_file(key_path, key.serialize_pem().as_bytes(), true)?);
    files.push(write_file(crt_path, cert.pem().as_bytes(), false)?);
    Ok(Ca {
        cert,
        key,
        not_after,
    })
}

/// Loads the CA on disk, checking that it is a CA, that the key belongs to the
/// certificate and that it has not expired.
fn load_ca(crt_path: &Path, key_path: &Path, now: OffsetDateTime) -> Result<Ca, PkiError> {
    let existing = |path: &Path, reason: String| PkiError::ExistingCa {
        path: path.to_owned(),
        reason,
    };
    let key_pem = read_to_string(key_path)?;
    let key = KeyPair::from_pem(&key_pem)
        .map_err(|e| existing(key_path, format!("not a usable private key: {e}")))?;
    let crt_pem = read_to_string(crt_path)?;
    let params = CertificateParams::from_ca_cert_pem(&crt_pem)
        .map_err(|e| existing(crt_path, format!("not a readable certificate: {e}")))?;
    if !matches!(params.is_ca, IsCa::Ca(_)) {
        return Err(existing(
            crt_path,
            "not a CA certificate (basicConstraints CA:FALSE or missing)".into(),
        ));
    }
    let spki = certificate_spki(&crt_pem).map_err(|reason| existing(crt_path, reason))?;
    if spki != key.public_key_der() {
        return Err(existing(
            key_path,
            format!("this key does not belong to {}", crt_path.display()),
        ));
    }
    if params.not_after <= now {
        return Err(existing(
            crt_path,
            format!("the CA expired on {}", params.not_after),
        ));
    }
    let not_after = params.not_after;
    // rcgen 0.13 signs with a `Certificate` as issuer; re-signing the parsed params
    // yields one with the CA's subject and key identifier. It is never written.
    let cert = params
        .self_signed(&key)
        .map_err(rcgen_err("the CA issuer"))?;
    Ok(Ca {
        cert,
        key,
        not_after,
    })
}

/// The DER SubjectPublicKeyInfo of the first certificate in `pem`.
fn certificate_spki(pem: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| e.to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    Ok(cert.public_key().raw.to_vec())
}

/// Issues a leaf certificate signed by the CA and writes `{stem}.key` then
/// `{stem}.crt`.
fn issue(
    ca: &Ca,
    cn: &str,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
    (not_before, not_after): (OffsetDateTime, OffsetDateTime),
    stem: &Path,
    files: &mut Vec<PkiFile>,
) -> Result<(), PkiError> {
    // P-256 leaves: the cheapest ECDSA handshake for the many connections a load
    // test opens; the CA's P-384 key signs them.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(rcgen_err(&format!("the key of {cn}")))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(cn);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(random_serial());
    let cert = params
        .signed_by(&key, &ca.cert, &ca.key)
        .map_err(rcgen_err(&format!("the certificate of {cn}")))?;
    files.push(write_file(
        &with_extension(stem, "key"),
        key.serialize_pem().as_bytes(),
        true,
    )?);
    files.push(write_file(
        &with_extension(stem, "crt"),
        cert.pem().as_bytes(),
        false,
    )?);
    Ok(())
}

/// Makes or checks a receiver's X25519 key pair. An existing private key is kept; its
/// public key is derived and must match the public key file if there is one.
fn x25519_pair(keys_dir: &Path, cn: &str, files: &mut Vec<PkiFile>) -> Result<(), PkiError> {
    let private = keys_dir.join(format!("{cn}_private.key"));
    let public = keys_dir.join(format!("{cn}_public.key"));
    match (exists(&private)?, exists(&public)?) {
        (true, public_exists) => {
            let secret = crypto_box::SecretKey::from_bytes(read_key32(&private)?);
            let derived = secret.public_key().to_bytes();
            files.push(kept(&private, true));
            if public_exists {
                if read_key32(&public)? != derived {
                    return Err(PkiError::BadKeyFile {
                        path: public,
                        reason: format!(
                            "does not match the public key of {}; delete the wrong one",
                            private.display()
                        ),
                    });
                }
                files.push(kept(&public, false));
            } else {
                files.push(write_file(
                    &public,
                    encode_line(&derived).as_bytes(),
                    false,
                )?);
            }
        }
        (false, true) => return Err(PkiError::OrphanPublicKey { public, private }),
        (false, false) => {
            let mut bytes = [0u8; 32];
            OsRng.fill_bytes(&mut bytes);
            let secret = crypto_box::SecretKey::from_bytes(bytes);
            files.push(write_file(
                &private,
                encode_line(&secret.to_bytes()).as_bytes(),
                true,
            )?);
            files.push(write_file(
                &public,
                encode_line(secret.public_key().as_bytes()).as_bytes(),
                false,
            )?);
        }
    }
    Ok(())
}

/// Writes the broker's 256-bit AES key unless one exists (then it is checked).
fn aes_key(path: &Path, files: &mut Vec<PkiFile>) -> Result<(), PkiError> {
    if exists(path)? {
        read_key32(path)?;
        files.push(kept(path, true));
    } else {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        files.push(write_file(path, encode_line(&key).as_bytes(), true)?);
    }
    Ok(())
}

/// Reads a file holding the standard padded base64 of exactly 32 bytes.
fn read_key32(path: &Path) -> Result<[u8; 32], PkiError> {
    let text = read_to_string(path)?;
    let bad = |reason: String| PkiError::BadKeyFile {
        path: path.to_owned(),
        reason,
    };
    let bytes = BASE64
        .decode(text.trim())
        .map_err(|e| bad(format!("not standard base64: {e}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| bad(format!("holds {} bytes, expected 32", bytes.len())))
}

/// Base64 of `bytes` followed by a newline, the on-disk form of every raw key.
fn encode_line(bytes: &[u8]) -> String {
    let mut line = BASE64.encode(bytes);
    line.push('\n');
    line
}

/// Writes `contents` to `path` atomically (temp file created with its final mode,
/// fsync, rename, directory fsync) with mode 0600 for secrets and 0644 otherwise.
fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<PkiFile, PkiError> {
    let action = if exists(path)? {
        FileAction::Replaced
    } else {
        FileAction::Created
    };
    let mode = if secret { SECRET_MODE } else { PUBLIC_MODE };
    crate::key_file::replace_file(path, contents, mode).map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })?;
    Ok(PkiFile {
        path: path.to_owned(),
        action,
        secret,
    })
}

/// `create_dir_all` with the path in the error.
fn create_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|error| PkiError::Io {
        path: dir.to_owned(),
        error,
    })
}

/// `Path::try_exists` with the path in the error (a permission problem is an error,
/// not "missing").
fn exists(path: &Path) -> Result<bool, PkiError> {
    path.try_exists().map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })
}

/// `fs::read_to_string` with the path in the error.
fn read_to_string(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(|error| PkiError::Io {
        path: path.to_owned(),
        error,
    })
}

/// `stem` plus `.ext`, even when the stem contains dots (`receiver.eu` →
/// `receiver.eu.crt`, where `Path::with_extension` would drop `.eu`).
fn with_extension(stem: &Path, ext: &str) -> PathBuf {
    let mut name = stem.as_os_str().to_owned();
    name.push(".");
    name.push(ext);
    PathBuf::from(name)
}

/// A report entry for a file left as it was.
fn kept(path: &Path, secret: bool) -> PkiFile {
    PkiFile {
        path: path.to_owned(),
        action: FileAction::Kept,
        secret,
    }
}

/// A subject with just a Common Name: the CN is all the broker reads.
fn distinguished_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// A random positive 128-bit serial, so re-issued certificates never share one.
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    OsRng.fill_bytes(&mut bytes);
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// Wraps an rcgen error with what was being generated.
fn rcgen_err(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError {
    let what = what.to_owned();
    move |error| PkiError::Rcgen { what, error }
}
