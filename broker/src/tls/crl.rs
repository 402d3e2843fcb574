//! `tls.crl_path`: certificate revocation lists, checked before rustls gets
//! them and kept as the set of revoked certificates, so a reload can close
//! the connections of certificates it newly revokes.
//!
//! Rules (checked at start and on every reload; a file breaking one is
//! refused, naming it, and the running configuration is kept):
//! - the file holds PEM `X509 CRL` blocks, or one DER CRL;
//! - every CRL is issued and signed by a CA of `tls.ca_cert_path`, at most
//!   one per CA, and every CA of `tls.ca_cert_path` has one (an empty CRL
//!   will do): the handshake checks the client's own certificate against
//!   its issuer's CRL, and a certificate whose status cannot be told is
//!   refused, so a CA without a CRL would lock all its clients out;
//! - a CRL past its `nextUpdate` still applies (it still knows what it
//!   lists) and is logged at warn on every load: refusing every client
//!   because a refresh was missed would turn a late CRL into an outage.
//!   `ciphermq_tls_crl_next_update_seconds` lets an alert catch it first.

use std::collections::HashSet;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateRevocationListDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::revocation_list::CertificateRevocationList;

use crate::access::identity::CertId;
use crate::tls::material::TlsError;

/// The certificates the configured CRLs revoke.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Revocations {
    revoked: HashSet<CertId>,
}

impl Revocations {
    /// Whether `cert` is revoked.
    pub(crate) fn contains(&self, cert: &CertId) -> bool {
        self.revoked.contains(cert)
    }

    /// How many certificates are revoked.
    pub(crate) fn len(&self) -> usize {
        self.revoked.len()
    }

    /// Whether `self` revokes a certificate `before` did not.
    pub(crate) fn adds_to(&self, before: &Revocations) -> bool {
        !self.revoked.is_subset(&before.revoked)
    }
}

impl FromIterator<CertId> for Revocations {
    fn from_iter<I: IntoIterator<Item = CertId>>(ids: I) -> Self {
        Revocations {
            revoked: ids.into_iter().collect(),
        }
    }
}

/// `tls.crl_path`, read and checked.
pub(crate) struct LoadedCrls {
    /// For rustls's client verifier.
    pub(crate) ders: Vec<CertificateRevocationListDer<'static>>,
    /// What they revoke.
    pub(crate) revoked: Revocations,
    /// The earliest `nextUpdate` (Unix seconds), when any CRL has one.
    pub(crate) next_update: Option<i64>,
}

fn load_error(path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Load {
        key: "tls.crl_path",
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Reads the CRLs at `path` and checks them against the CAs `cas` (those of
/// `tls.ca_cert_path`).
pub(crate) fn load(path: &Path, cas: &[X509Certificate<'_>]) -> Result<LoadedCrls, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| load_error(path, e.to_string()))?;
    let ders: Vec<CertificateRevocationListDer<'static>> =
        if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
            CertificateRevocationListDer::pem_slice_iter(&bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| load_error(path, e.to_string()))?
        } else {
            vec![CertificateRevocationListDer::from(bytes)]
        };
    if ders.is_empty() {
        return Err(load_error(path, "no PEM X509 CRL in the file"));
    }
    let mut covered = vec![false; cas.len()];
    let mut revoked = HashSet::new();
    let mut next_update: Option<i64> = None;
    let now = x509_parser::time::ASN1Time::now();
    for (i, der) in ders.iter().enumerate() {
        let which = format!("CRL #{}", i + 1);
        let (_, crl): (_, CertificateRevocationList<'_>) =
            x509_parser::parse_x509_crl(der.as_ref())
                .map_err(|e| load_error(path, format!("{which}: cannot be parsed: {e}")))?;
        let issuer = crl.issuer();
        let Some(ca) = cas
            .iter()
            .position(|ca| ca.subject().as_raw() == issuer.as_raw())
        else {
            return Err(load_error(
                path,
                format!("{which} is issued by \"{issuer}\", which is not a CA of tls.ca_cert_path"),
            ));
        };
        if std::mem::replace(&mut covered[ca], true) {
            return Err(load_error(
                path,
                format!("two CRLs of the CA \"{issuer}\": keep only the newest"),
            ));
        }
        crl.verify_signature(cas[ca].public_key()).map_err(|e| {
            load_error(
                path,
                format!(
                    "{which}: its signature does not verify with the key of \"{issuer}\" ({e})"
                ),
            )
        })?;
        if let Some(next) = crl.next_update() {
            next_update = Some(next_update.map_or(next.timestamp(), |t| t.min(next.timestamp())));
            if next < now {
                tracing::warn!(
                    path = %path.display(),
                    issuer = %issuer,
                    next_update = %next,
                    "tls.crl_path: this CRL is past its nextUpdate; it still revokes what it lists, \
                     but certificates revoked since are unknown: publish a fresh CRL and reload"
                );
            }
        }
        for entry in crl.iter_revoked_certificates() {
            revoked.insert(CertId::new(issuer.as_raw(), entry.raw_serial()));
        }
    }
    if let Some(missing) = covered.iter().position(|&c| !c) {
        return Err(load_error(
            path,
            format!(
                "no CRL of the CA \"{}\" of tls.ca_cert_path: with tls.crl_path set, \
                 every CA needs one (an empty CRL will do)",
                cas[missing].subject()
            ),
        ));
    }
    Ok(LoadedCrls {
        ders,
        revoked: Revocations { revoked },
        next_update,
    })
}
