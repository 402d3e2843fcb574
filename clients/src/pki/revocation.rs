//! Revocation: `{out_dir}/ca.crl`, the CA's certificate revocation list, which
//! the broker checks at every handshake when `tls.crl_path` names it and
//! re-reads on reload (closing the sessions of certificates newly listed).
//!
//! Each run re-signs the whole list: what the previous `ca.crl` listed stays
//! listed (its signature is checked against the CA first, so a list from
//! another CA is never carried over), the certificates of the CNs named are
//! added, the CRL number goes up by one, and `nextUpdate` moves to
//! `next_update_days` from now. With no CN it only renews the list (or, the
//! first time, writes an empty one, which `tls.crl_path` needs to start).

use std::fmt;
use std::path::Path;

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevokedCertParams, SerialNumber};
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::FromDer;

use super::ca::{self, Ca};
use super::error::rcgen_err;
use super::files::{exists, write_file};
use super::{names, PkiError, PkiFile, PkiOptions};

/// `nextUpdate` of a list written without `--next-update-days`: renew within a
/// month (the broker warns, and its `ciphermq_tls_crl_next_update_seconds`
/// turns negative, once a list is past it; it still applies it).
pub const DEFAULT_CRL_DAYS: u32 = 30;

/// One certificate on the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedEntry {
    /// Its serial number, hex with `:` between bytes (as `openssl x509 -serial`
    /// and `ciphermq-pki list` print it, bar the colons).
    pub serial: String,
    /// The CN, when this run revoked it (earlier entries carry only the serial).
    pub cn: Option<String>,
    /// When it was listed.
    pub revoked_at: OffsetDateTime,
}

/// What [`revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationReport {
    /// The list written.
    pub crl: PkiFile,
    /// Certificates this run added.
    pub added: Vec<RevokedEntry>,
    /// CNs named whose certificate was listed already.
    pub already: Vec<String>,
    /// How many certificates the list holds now.
    pub listed: usize,
    /// Its CRL number.
    pub crl_number: u64,
    /// When it should be renewed by.
    pub next_update: OffsetDateTime,
}

impl fmt::Display for RevocationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in &self.added {
            let cn = entry.cn.as_deref().unwrap_or("?");
            writeln!(f, "revoked {cn} (serial {})", entry.serial)?;
        }
        for cn in &self.already {
            writeln!(f, "{cn}: already revoked")?;
        }
        writeln!(
            f,
            "{}: {} certificate(s) revoked, CRL number {}, next update {}",
            self.crl.path.display(),
            self.listed,
            self.crl_number,
            super::inventory::human_time(self.next_update),
        )
    }
}

/// Revokes the certificates of `cns` (`{out_dir}/{cn}.crt`, which must exist and
/// be signed by the CA) by rewriting `{out_dir}/ca.crl`, signed by the CA on
/// disk. Everything is checked before the file is written; the certificates
/// themselves are left where they are.
pub fn revoke(
    opts: &PkiOptions,
    cns: &[String],
    next_update_days: u32,
) -> Result<RevocationReport, PkiError> {
    if next_update_days == 0 {
        return Err(PkiError::InvalidOption(
            "--next-update-days must be at least 1".into(),
        ));
    }
    for cn in cns {
        names::validate_cn(cn)?;
    }
    let now = OffsetDateTime::now_utc();
    let ca_dir = opts.ca_dir();
    let ca_files = ca::locate(&opts.out_dir, &ca_dir)?;
    let ca = ca::load_existing(&ca_files, now)?;
    let path = opts.out_dir.join("ca.crl");
    let (mut entries, previous_number) = if exists(&path)? {
        read_list(&path, &ca)?
    } else {
        (Vec::new(), 0)
    };

    let mut added = Vec::new();
    let mut already = Vec::new();
    for cn in cns {
        let serial = serial_of(&opts.out_dir.join(format!("{cn}.crt")), cn, &ca)?;
        if entries.iter().any(|e: &Listed| e.serial == serial) {
            already.push(cn.clone());
            continue;
        }
        // Listed a second ago, so a handshake at this very second fails too.
        let revoked_at = now - Duration::seconds(1);
        added.push(RevokedEntry {
            serial: hex(&serial),
            cn: Some(cn.clone()),
            revoked_at,
        });
        entries.push(Listed { serial, revoked_at });
    }

    let crl_number = previous_number.saturating_add(1);
    let next_update = now + Duration::days(i64::from(next_update_days));
    let params = CertificateRevocationListParams {
        this_update: now - Duration::minutes(5),
        next_update,
        crl_number: SerialNumber::from(crl_number),
        issuing_distribution_point: None,
        revoked_certs: entries
            .iter()
            .map(|e| RevokedCertParams {
                serial_number: SerialNumber::from_slice(&e.serial),
                revocation_time: e.revoked_at,
                reason_code: None,
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params
        .signed_by(&ca.cert, &ca.key)
        .map_err(rcgen_err("the revocation list"))?;
    let pem = crl.pem().map_err(rcgen_err("the revocation list's PEM"))?;
    let crl = write_file(&path, pem.as_bytes(), false)?;
    Ok(RevocationReport {
        crl,
        added,
        already,
        listed: entries.len(),
        crl_number,
        next_update,
    })
}

/// A certificate on the list being written.
struct Listed {
    /// The serial's bytes, as in the certificate.
    serial: Vec<u8>,
    revoked_at: OffsetDateTime,
}

/// The entries and CRL number of the list at `path`, which must be the CA's.
fn read_list(path: &Path, ca: &Ca) -> Result<(Vec<Listed>, u64), PkiError> {
    let bad = |reason: String| PkiError::BadCrl {
        path: path.to_owned(),
        reason,
    };
    let text = super::files::read_to_string(path)?;
    let der = pem_crl(&text).map_err(bad)?;
    let (_, crl) = x509_parser::revocation_list::CertificateRevocationList::from_der(&der)
        .map_err(|e| bad(format!("not a readable CRL: {e}")))?;
    let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca.der)
        .map_err(|e| bad(format!("the CA certificate cannot be read: {e}")))?;
    crl.verify_signature(ca_cert.public_key())
        .map_err(|_| bad("not signed by this CA (move it away to start a new list)".into()))?;
    let number = crl
        .crl_number()
        .map(|n| match n.to_u64_digits().as_slice() {
            [] => 0,
            [one] => *one,
            _ => u64::MAX - 1,
        })
        .unwrap_or(0);
    let entries = crl
        .iter_revoked_certificates()
        .map(|r| Listed {
            serial: r.raw_serial().to_vec(),
            revoked_at: OffsetDateTime::from_unix_timestamp(r.revocation_date.timestamp())
                .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        })
        .collect();
    Ok((entries, number))
}

/// The DER of the `X509 CRL` block of `pem`.
fn pem_crl(pem: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateRevocationListDer::from_pem_slice(pem.as_bytes())
        .map(|der| der.to_vec())
        .map_err(|e| format!("not a PEM CRL: {e}"))
}

/// The serial of the certificate at `path`, which must be `cn`'s and the CA's.
fn serial_of(path: &Path, cn: &str, ca: &Ca) -> Result<Vec<u8>, PkiError> {
    let bad = |reason: String| PkiError::ExistingCertificate {
        path: path.to_owned(),
        reason,
    };
    if !exists(path)? {
        return Err(PkiError::NoCertificate {
            cn: cn.to_owned(),
            path: path.to_owned(),
        });
    }
    let text = super::files::read_to_string(path)?;
    let der = ca::first_certificate(&text).map_err(bad)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| bad(format!("unreadable: {e}")))?;
    super::leaf::signed_by(&cert, &ca.der).map_err(bad)?;
    if super::leaf::common_name(&cert).as_deref() != Some(cn) {
        return Err(bad(format!("its CN is not {cn}")));
    }
    Ok(cert.raw_serial().to_vec())
}

/// `0a:1b:…`.
fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
