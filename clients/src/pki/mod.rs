//! The CipherMQ PKI: a CA, the broker's server certificate, client certificates
//! (the CN is the identity the broker's ACL sees), the receivers' X25519 key pairs
//! for end-to-end encryption, and the broker's AES key for sealing stored public
//! keys.
//!
//! Layout, for one [`PkiOptions`]:
//! - `out_dir` (`certs/`): `ca.crt`, `server.crt` and `server.key`, `{cn}.crt` and
//!   `{cn}.key` per client, `aes.key`: what the broker and the clients read.
//! - `keys_dir` (`keys/`): `{cn}_private.key` and `{cn}_public.key` per receiver.
//! - `ca_dir` (`ca/`, mode 0700, see [`default_ca_dir`]): `ca.key` alone, apart from
//!   the leaf keys, so copying `certs/` to a host never copies the key that mints
//!   identities. A `ca.key` in `out_dir` (the old layout) is still used, with a
//!   warning saying how to move it.
//!
//! Entry points, one per `ciphermq-pki` command:
//! - [`generate`] (`init`, and the demo set when run without a command): makes what
//!   is missing and keeps what exists. Running it twice changes nothing.
//! - [`issue`] (`issue`, `receiver`): client certificates, and receivers' key pairs,
//!   signed by an existing CA; a CN that already has a certificate is refused.
//! - [`inventory()`] (`list`): what exists, with expiry dates and SANs.
//! - [`revoke`] (`revoke`): the CA's revocation list, `ca.crl`, with the
//!   certificates of the CNs named added (the broker's `tls.crl_path`).
//!
//! Nothing that exists is replaced unless asked: a certificate is re-issued only
//! with [`PkiOptions::force`] (a re-issued server certificate keeps every name it
//! had, plus the new ones), the CA only with [`PkiOptions::force_ca`] (which also
//! re-issues the certificates this run handles, since the old CA's no longer
//! verify), and X25519 pairs and `aes.key` never. Every input is checked, and
//! every decision taken, before the first file is written.
//!
//! Modules: `plan` (checked inputs, what happens to each certificate, carrying it
//! out), `names` (CN and SAN rules), `ca` (where the CA is, loading, creating),
//! `leaf` (signing leaf certificates, judging one on disk), `revocation` (`ca.crl`), `secrets` (X25519 pairs
//! and the AES key), `files` (atomic writes with their modes, errors naming the
//! path), `inventory` (`list`), `error`.
//!
//! Every file is written to a temporary name in the same directory, fsynced and
//! renamed, so a crash never leaves half a key; private keys are created with mode
//! 0600 from the start.

mod ca;
mod error;
mod files;
mod inventory;
mod leaf;
mod names;
mod plan;
mod revocation;
mod secrets;

use std::fmt;
use std::path::{Path, PathBuf};

use rand::rngs::OsRng;
use rand::RngCore;
use rcgen::{DistinguishedName, DnType, SerialNumber};
use time::{Duration, OffsetDateTime};

pub use error::PkiError;
pub use inventory::{inventory, CaEntry, CertEntry, Inventory, KeysEntry};
pub use revocation::{revoke, RevocationReport, RevokedEntry, DEFAULT_CRL_DAYS};
pub use secrets::X25519Keys;

use ca::CaFiles;
use files::exists;
use plan::{Job, Run, Strictness};
use secrets::PairPlan;

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

/// A kept certificate that expires within this many days is reported, so renewal
/// is not discovered by a failing handshake.
pub const EXPIRY_WARNING_DAYS: i64 = 30;

/// Certificates are valid from slightly in the past, so a peer whose clock lags by a
/// few minutes does not reject a freshly issued certificate.
const CLOCK_SKEW: Duration = Duration::minutes(5);

/// What to generate or issue and where; the input of [`generate`], [`issue`] and
/// [`inventory()`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiOptions {
    /// Directory of `ca.crt`, the leaf certificates, their private keys and
    /// `aes.key` (created if missing).
    pub out_dir: PathBuf,
    /// Directory of the receivers' X25519 key pairs (created if missing).
    pub keys_dir: PathBuf,
    /// Directory of the CA's private key, apart from the leaf keys (created with
    /// mode 0700 if missing); `None` is [`default_ca_dir`] of `out_dir`. It must
    /// differ from `out_dir` and `keys_dir`.
    pub ca_dir: Option<PathBuf>,
    /// Extra subject alternative names of the server certificate beyond `localhost`,
    /// `127.0.0.1` and `::1`; IP addresses become IP SANs, anything else a DNS SAN
    /// (in lower case). Used by [`generate`].
    pub server_sans: Vec<String>,
    /// One client certificate (clientAuth) per CN; the CN is the identity the
    /// broker maps to a role.
    pub client_cns: Vec<String>,
    /// CNs that get an X25519 key pair for end-to-end encryption. [`generate`] needs
    /// them listed in `client_cns` too for a certificate; [`issue`] adds them.
    pub receiver_cns: Vec<String>,
    /// Replace an existing CA (used by [`generate`]). Every certificate issued by
    /// the old one stops being trusted, so this is opt-in.
    pub force_ca: bool,
    /// Re-issue the certificates this run names even though they exist and are
    /// good (renewal, new server names). Never touches the CA, X25519 pairs or
    /// `aes.key`.
    pub force: bool,
    /// Lifetime of the server and client certificates in days (at least 1).
    pub validity_days: u32,
}

impl PkiOptions {
    /// Options with no clients, no extra SANs, nothing forced, the default CA
    /// directory and [`DEFAULT_VALIDITY_DAYS`]; the starting point for builders and
    /// tests.
    pub fn new(out_dir: impl Into<PathBuf>, keys_dir: impl Into<PathBuf>) -> Self {
        PkiOptions {
            out_dir: out_dir.into(),
            keys_dir: keys_dir.into(),
            ca_dir: None,
            server_sans: Vec::new(),
            client_cns: Vec::new(),
            receiver_cns: Vec::new(),
            force_ca: false,
            force: false,
            validity_days: DEFAULT_VALIDITY_DAYS,
        }
    }

    /// The CA directory in use: [`PkiOptions::ca_dir`] or its default.
    pub fn ca_dir(&self) -> PathBuf {
        self.ca_dir
            .clone()
            .unwrap_or_else(|| default_ca_dir(&self.out_dir))
    }
}

/// Where the CA key lives unless told otherwise: beside `out_dir`, in `ca` when
/// `out_dir` is named `certs` (the usual `certs/ ca/ keys/`), else in `<name>-ca`
/// (`/tmp/x/rogue` → `/tmp/x/rogue-ca`), so two PKIs in one directory never share
/// a CA key. A directory without a name (`.`, `/`) gets `ca` inside it.
pub fn default_ca_dir(out_dir: &Path) -> PathBuf {
    match (out_dir.parent(), out_dir.file_name()) {
        (Some(parent), Some(name)) if name == "certs" => parent.join("ca"),
        (Some(parent), Some(name)) => {
            let mut dir = name.to_owned();
            dir.push("-ca");
            parent.join(dir)
        }
        _ => out_dir.join("ca"),
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
    /// The file was deleted (the old layout's CA key, once a new CA is written in
    /// the CA directory).
    Removed,
}

/// One file of the PKI and what this run did to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiFile {
    /// Where the file is.
    pub path: PathBuf,
    /// Created, replaced, kept or removed.
    pub action: FileAction,
    /// True for private keys and other secrets (mode 0600), so callers can warn about
    /// where they are copied.
    pub secret: bool,
}

/// The outcome of a run: what the operator needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PkiReport {
    /// Whether the CA is new (old certificates are no longer trusted) or reused.
    pub ca: CaOrigin,
    /// Every file of the PKI this run handled, in order.
    pub files: Vec<PkiFile>,
    /// Things the operator should fix that did not stop the run (the CA key in the
    /// old place, loose permissions, certificates near or past expiry), one line
    /// each. Not part of the `Display` form: tools print them to stderr.
    pub warnings: Vec<String>,
}

impl fmt::Display for PkiReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ca {
            CaOrigin::Generated => writeln!(f, "CA: generated a new CA")?,
            CaOrigin::Reused => writeln!(f, "CA: reused the existing CA")?,
        }
        for file in &self.files {
            let action = match file.action {
                FileAction::Created => "created ",
                FileAction::Replaced => "replaced",
                FileAction::Kept => "kept    ",
                FileAction::Removed => "removed ",
            };
            let secret = if file.secret && file.action != FileAction::Removed {
                "  (secret, mode 0600)"
            } else {
                ""
            };
            writeln!(f, "  {action} {}{secret}", file.path.display())?;
        }
        Ok(())
    }
}

/// Makes what is missing of the PKI described by `opts` and keeps what exists:
/// the CA, the server certificate, a certificate per client CN, a key pair per
/// receiver CN, and `aes.key`.
///
/// Files: `{out_dir}/ca.crt`, `server.crt`, `server.key`, `{cn}.crt` and `{cn}.key`
/// per client CN, `aes.key`; `{ca_dir}/ca.key`; `{keys_dir}/{cn}_private.key` and
/// `{cn}_public.key` per receiver CN.
///
/// An existing server certificate is kept if it carries every requested name, and
/// refused ([`PkiError::ServerSans`]) if not; with [`PkiOptions::force`] it is
/// re-issued with its old names and the requested ones. An existing client
/// certificate is kept (re-issued with `force`). A certificate that cannot be kept
/// (key missing, another CA) is an error unless `force`, or unless this run makes a
/// new CA. All inputs are validated before anything is written.
pub fn generate(opts: &PkiOptions) -> Result<PkiReport, PkiError> {
    let job = Job::new(opts, false)?;
    let requested_sans = names::server_sans(&opts.server_sans)?;
    let now = OffsetDateTime::now_utc();
    let ca_files = ca::locate(&opts.out_dir, &job.ca_dir)?;
    let existing_ca = match (
        exists(&ca_files.crt)?,
        exists(&ca_files.key)?,
        opts.force_ca,
    ) {
        (true, true, false) => Some(ca::load_ca(&ca_files, now)?),
        (true, false, false) => {
            return Err(PkiError::PartialCa {
                present: ca_files.crt,
                missing: ca_files.key,
            })
        }
        (false, true, false) => {
            return Err(PkiError::PartialCa {
                present: ca_files.key,
                missing: ca_files.crt,
            })
        }
        _ => None,
    };

    // Decide everything before writing anything.
    let ca = existing_ca.as_ref();
    let mut leaves = vec![plan::plan_server(opts, ca, &requested_sans)?];
    for cn in &job.clients {
        leaves.push(plan::plan_client(opts, cn, ca, Strictness::KeepExisting)?);
    }
    let pairs = plan::plan_pairs(opts, &job.receivers)?;
    let aes_path = opts.out_dir.join("aes.key");
    let aes_exists = secrets::check_aes_key(&aes_path)?;

    files::create_dir(&opts.out_dir)?;
    files::create_dir(&opts.keys_dir)?;
    let mut run = Run::default();
    let (ca, origin) = match existing_ca {
        Some(ca) => {
            run.use_existing_ca(&ca_files, &job.ca_dir)?;
            (ca, CaOrigin::Reused)
        }
        None => {
            let warning = files::create_ca_dir(&job.ca_dir, &mut run.files)?;
            run.warn(warning);
            let ca = ca::create_ca(opts.validity_days, now)?;
            let target = CaFiles {
                crt: ca_files.crt.clone(),
                key: job.ca_dir.join("ca.key"),
                legacy: false,
            };
            ca::write_ca(&ca, &target, &mut run.files)?;
            if ca_files.legacy {
                run.files.push(files::remove_file(&ca_files.key, true)?);
            }
            (ca, CaOrigin::Generated)
        }
    };
    for plan in &leaves {
        run.carry_out(plan, &ca, opts.validity_days, now)?;
    }
    for (cn, plan) in &pairs {
        secrets::write_pair(&opts.keys_dir, cn, plan, &mut run.files)?;
    }
    secrets::write_aes_key(&aes_path, aes_exists, &mut run.files)?;
    if origin == CaOrigin::Generated {
        run.warn(plan::orphaned_certificates(opts, &job.clients)?);
    }
    Ok(run.report(origin))
}

/// Issues client certificates (every CN of `client_cns` and `receiver_cns`) and
/// receivers' X25519 pairs, signed by the CA on disk; never creates a CA
/// ([`PkiError::NoCa`]: run [`generate`] first).
///
/// A CN whose certificate exists is refused ([`PkiError::CertificateExists`]) unless
/// [`PkiOptions::force`] is set, so a typo never replaces someone's identity; the
/// one exception is a receiver whose certificate exists but whose key pair does
/// not: the pair is made and the certificate kept. An existing key pair is always
/// kept. Every CN is checked before anything is written.
pub fn issue(opts: &PkiOptions) -> Result<PkiReport, PkiError> {
    let job = Job::new(opts, true)?;
    if job.clients.is_empty() {
        return Err(PkiError::InvalidOption("no CN to issue".into()));
    }
    let now = OffsetDateTime::now_utc();
    let ca_files = ca::locate(&opts.out_dir, &job.ca_dir)?;
    let ca = ca::load_existing(&ca_files, now)?;

    let pairs = plan::plan_pairs(opts, &job.receivers)?;
    let mut leaves = Vec::new();
    for cn in &job.clients {
        let strictness = match pairs.iter().find(|(r, _)| r == cn) {
            Some((_, plan)) if *plan != PairPlan::Keep => Strictness::KeepForNewPair,
            _ => Strictness::RefuseExisting,
        };
        leaves.push(plan::plan_client(opts, cn, Some(&ca), strictness)?);
    }

    if !pairs.is_empty() {
        files::create_dir(&opts.keys_dir)?;
    }
    let mut run = Run::default();
    run.use_existing_ca(&ca_files, &job.ca_dir)?;
    for plan in &leaves {
        run.carry_out(plan, &ca, opts.validity_days, now)?;
    }
    for (cn, plan) in &pairs {
        secrets::write_pair(&opts.keys_dir, cn, plan, &mut run.files)?;
    }
    Ok(run.report(CaOrigin::Reused))
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
