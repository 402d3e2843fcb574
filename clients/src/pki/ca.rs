//! The CA: where its files are (the key apart from the leaf keys, or beside them in
//! the old layout), loading and checking an existing one, creating a new one.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
use time::{Duration, OffsetDateTime};

use super::error::rcgen_err;
use super::files::{exists, read_to_string, write_file};
use super::{
    distinguished_name, random_serial, PkiError, PkiFile, CA_COMMON_NAME, CA_MIN_VALIDITY_DAYS,
    CLOCK_SKEW,
};

/// The CA that signs this run's certificates.
pub(super) struct Ca {
    /// An issuer object with the CA's subject and key identifier (for an existing CA
    /// this is a re-signed copy that is never written: only its names are used).
    pub(super) cert: Certificate,
    /// The CA's private key.
    pub(super) key: KeyPair,
    /// The CA certificate as on disk (DER), whose public key checks signatures.
    pub(super) der: Vec<u8>,
    /// The CA's expiry; issued certificates never outlive it.
    pub(super) not_after: OffsetDateTime,
}

/// Where the CA's two files are.
#[derive(Debug, Clone)]
pub(super) struct CaFiles {
    /// `{out_dir}/ca.crt`: beside the leaf certificates, which clients and the
    /// broker read.
    pub(super) crt: PathBuf,
    /// The key in use: `{ca_dir}/ca.key`, or `{out_dir}/ca.key` in the old layout.
    pub(super) key: PathBuf,
    /// The key sits beside the leaf keys (the old layout): used, with a warning.
    pub(super) legacy: bool,
}

/// Finds the CA's files: the key in `ca_dir`, or (the old layout) beside the leaf
/// keys in `out_dir` when only that one exists. Both existing is an error.
pub(super) fn locate(out_dir: &Path, ca_dir: &Path) -> Result<CaFiles, PkiError> {
    let crt = out_dir.join("ca.crt");
    let current = ca_dir.join("ca.key");
    let legacy = out_dir.join("ca.key");
    match (exists(&current)?, exists(&legacy)?) {
        (true, true) => Err(PkiError::TwoCaKeys { current, legacy }),
        (false, true) => Ok(CaFiles {
            crt,
            key: legacy,
            legacy: true,
        }),
        _ => Ok(CaFiles {
            crt,
            key: current,
            legacy: false,
        }),
    }
}

/// The one-line warning for a CA key in the old place.
pub(super) fn legacy_warning(key: &Path, ca_dir: &Path) -> String {
    let target = ca_dir.join("ca.key");
    format!(
        "the CA key {} sits beside the leaf keys (old layout, still used); move it apart: mkdir -m 700 {} && mv {} {}",
        key.display(),
        ca_dir.display(),
        key.display(),
        target.display()
    )
}

/// Makes a new CA (not written yet: see [`write_ca`]).
pub(super) fn create_ca(validity_days: u32, now: OffsetDateTime) -> Result<Ca, PkiError> {
    let key =
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).map_err(rcgen_err("the CA key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + Duration::days(i64::from(validity_days.max(CA_MIN_VALIDITY_DAYS)));
    params.serial_number = Some(random_serial());
    let not_after = params.not_after;
    let cert = params
        .self_signed(&key)
        .map_err(rcgen_err("the CA certificate"))?;
    Ok(Ca {
        der: cert.der().to_vec(),
        cert,
        key,
        not_after,
    })
}

/// Writes a new CA, key first: a crash in between leaves a partial CA that the
/// next run refuses to guess about.
pub(super) fn write_ca(ca: &Ca, files: &CaFiles, out: &mut Vec<PkiFile>) -> Result<(), PkiError> {
    out.push(write_file(
        &files.key,
        ca.key.serialize_pem().as_bytes(),
        true,
    )?);
    out.push(write_file(&files.crt, ca.cert.pem().as_bytes(), false)?);
    Ok(())
}

/// Loads the CA for a command that needs one and never makes one: both files
/// must be there ([`PkiError::NoCa`], [`PkiError::PartialCa`] otherwise).
pub(super) fn load_existing(files: &CaFiles, now: OffsetDateTime) -> Result<Ca, PkiError> {
    match (exists(&files.crt)?, exists(&files.key)?) {
        (true, true) => load_ca(files, now),
        (false, false) => Err(PkiError::NoCa {
            crt: files.crt.clone(),
            key: files.key.clone(),
        }),
        (true, false) => Err(PkiError::PartialCa {
            present: files.crt.clone(),
            missing: files.key.clone(),
        }),
        (false, true) => Err(PkiError::PartialCa {
            present: files.key.clone(),
            missing: files.crt.clone(),
        }),
    }
}

/// Loads the CA on disk, checking that it is a CA, that the key belongs to the
/// certificate and that it has not expired.
pub(super) fn load_ca(files: &CaFiles, now: OffsetDateTime) -> Result<Ca, PkiError> {
    let (crt_path, key_path) = (&files.crt, &files.key);
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
    let der = first_certificate(&crt_pem).map_err(|reason| existing(crt_path, reason))?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| existing(crt_path, e.to_string()))?;
    if parsed.public_key().raw != key.public_key_der().as_slice() {
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
        der,
        not_after,
    })
}

/// The DER of the first certificate in `pem`.
pub(super) fn first_certificate(pem: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map(|der| der.to_vec())
        .map_err(|e| format!("not a PEM certificate: {e}"))
}
