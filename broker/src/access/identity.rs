//! Who a client is, read from its verified certificate: its identity (the
//! client id every part of the broker uses: placement, the ACL, `HELLO`, the
//! limits) and the certificate's issuer and serial (what a CRL names).
//!
//! `tls.identity` chooses the source:
//! - `"cn"` (default): the Subject Common Name. A subject with several CN
//!   attributes names no client: which one counts is not agreed (tools and
//!   verifiers take the first, or the last, or all), so a certificate that
//!   shows one name to an operator's tool could act as another here.
//! - `"uri_san"`: the certificate's URI SubjectAltName, in the spirit of
//!   SPIFFE and of FluxMQ's local principals (an exact, configured mapping;
//!   anything else fails closed): the certificate must carry exactly one URI
//!   SAN, it must start with `tls.uri_san_prefix` (compared byte for byte),
//!   and the rest must be a valid name (`[A-Za-z0-9_.:-]{1,255}`, not `.` or
//!   `..`). `spiffe://ciphermq/receiver_1` with the default prefix is
//!   `receiver_1`; `spiffe://ciphermq/team/receiver_1` is refused (a `/` is
//!   not a name character). The CN is ignored.

use std::fmt;
use std::sync::Arc;

use ciphermq_proto::name::is_valid_name;
use rustls::pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::config::{TlsConfig, TlsIdentity};

/// How an identity is read from a certificate (`tls.identity`,
/// `tls.uri_san_prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IdentityRule {
    /// The Subject CN.
    Cn,
    /// The one URI SAN, this prefix stripped.
    UriSan {
        /// `tls.uri_san_prefix`.
        prefix: Arc<str>,
    },
}

impl IdentityRule {
    /// The rule `[tls]` configures.
    pub(crate) fn from_config(tls: &TlsConfig) -> IdentityRule {
        match tls.identity {
            TlsIdentity::Cn => IdentityRule::Cn,
            TlsIdentity::UriSan => IdentityRule::UriSan {
                prefix: Arc::from(tls.uri_san_prefix.as_str()),
            },
        }
    }
}

/// A certificate as a CRL names it: its issuer's distinguished name (DER)
/// and its serial number (big-endian, without leading zero bytes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct CertId {
    issuer: Box<[u8]>,
    serial: Box<[u8]>,
}

impl CertId {
    /// The id of the certificate by `issuer` (a DER `Name`) with the serial
    /// whose big-endian bytes are `serial`.
    pub(crate) fn new(issuer: &[u8], serial: &[u8]) -> CertId {
        let first = serial.iter().position(|&b| b != 0).unwrap_or(serial.len());
        CertId {
            issuer: issuer.into(),
            serial: serial[first..].into(),
        }
    }

    /// The serial in hex, as `openssl x509 -serial` prints it (for logs).
    pub(crate) fn serial_hex(&self) -> String {
        if self.serial.is_empty() {
            return "00".to_owned();
        }
        self.serial.iter().map(|b| format!("{b:02X}")).collect()
    }
}

impl fmt::Debug for CertId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertId(serial {})", self.serial_hex())
    }
}

/// A verified client certificate, as the broker knows its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerCertificate {
    /// The client id.
    pub identity: String,
    /// What a CRL would name it by.
    pub cert: CertId,
}

/// Why a verified certificate names no client; the text is sent to the
/// client after `Access denied: ` and logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum IdentityError {
    /// No certificate (never after a verified handshake).
    #[error("no client certificate")]
    NoCertificate,
    /// x509-parser cannot read what rustls verified.
    #[error("the client certificate cannot be parsed")]
    Unparsable,
    /// `tls.identity = "cn"` and the subject has no readable CN.
    #[error("the client certificate has no Subject CN")]
    NoCommonName,
    /// `tls.identity = "cn"` and the subject has more than one CN: which one
    /// names the client would be a guess.
    #[error("the client certificate has {0} Subject CNs; exactly one is required")]
    SeveralCommonNames(usize),
    /// `tls.identity = "uri_san"` and the certificate has no URI SAN.
    #[error("the client certificate has no URI SubjectAltName (tls.identity = uri_san)")]
    NoUriSan,
    /// `tls.identity = "uri_san"` and the certificate has more than one.
    #[error("the client certificate has {0} URI SubjectAltNames; exactly one is required (tls.identity = uri_san)")]
    SeveralUriSans(usize),
    /// The URI SAN does not start with `tls.uri_san_prefix`.
    #[error("URI SubjectAltName {uri:?} does not start with {prefix:?} (tls.uri_san_prefix)")]
    ForeignUri {
        /// The URI (shortened).
        uri: String,
        /// `tls.uri_san_prefix`.
        prefix: String,
    },
    /// What follows the prefix is not a valid client id.
    #[error("URI SubjectAltName {uri:?}: {rest:?} after the prefix is not a valid client id ([A-Za-z0-9_.:-]{{1,255}})")]
    InvalidName {
        /// The URI (shortened).
        uri: String,
        /// The part after the prefix (shortened).
        rest: String,
    },
}

/// Longest piece of a certificate quoted in a message: the text goes to the
/// log and back to the client.
const QUOTE_MAX: usize = 128;

fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// Reads the identity and the issuer and serial of the end-entity
/// certificate of `certs` (as rustls verified them) under `rule`.
pub(crate) fn identify(
    certs: &[CertificateDer<'_>],
    rule: &IdentityRule,
) -> Result<PeerCertificate, IdentityError> {
    let der = certs.first().ok_or(IdentityError::NoCertificate)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(der.as_ref()).map_err(|_| IdentityError::Unparsable)?;
    let identity = match rule {
        IdentityRule::Cn => common_name(&cert)?,
        IdentityRule::UriSan { prefix } => uri_san_identity(&cert, prefix)?,
    };
    let cert_id = CertId::new(cert.issuer().as_raw(), cert.raw_serial());
    Ok(PeerCertificate {
        identity,
        cert: cert_id,
    })
}

/// The subject's one CN; several (in one RDN or in several) are refused.
fn common_name(cert: &X509Certificate<'_>) -> Result<String, IdentityError> {
    let mut cns = cert.subject().iter_common_name();
    match (cns.next(), cns.count()) {
        (None, _) => Err(IdentityError::NoCommonName),
        (Some(cn), 0) => cn
            .as_str()
            .map(str::to_owned)
            .map_err(|_| IdentityError::NoCommonName),
        (Some(_), more) => Err(IdentityError::SeveralCommonNames(more + 1)),
    }
}

fn uri_san_identity(cert: &X509Certificate<'_>, prefix: &str) -> Result<String, IdentityError> {
    // A certificate with two SAN extensions is malformed: no identity.
    let san = cert
        .subject_alternative_name()
        .map_err(|_| IdentityError::Unparsable)?;
    let mut uris = san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        });
    let uri = match (uris.next(), uris.count()) {
        (None, _) => return Err(IdentityError::NoUriSan),
        (Some(uri), 0) => uri,
        (Some(_), more) => return Err(IdentityError::SeveralUriSans(more + 1)),
    };
    let Some(rest) = uri.strip_prefix(prefix) else {
        return Err(IdentityError::ForeignUri {
            uri: quote(uri),
            prefix: prefix.to_owned(),
        });
    };
    if !is_valid_name(rest) {
        return Err(IdentityError::InvalidName {
            uri: quote(uri),
            rest: quote(rest),
        });
    }
    Ok(rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, Ia5String, KeyPair, SanType, SerialNumber,
    };

    fn cert(cn: Option<&str>, uris: &[&str], serial: &[u8]) -> CertificateDer<'static> {
        cert_with_cns(cn.as_slice(), uris, serial)
    }

    /// A certificate whose subject holds the CN attributes `cns` (at most
    /// two: rcgen keeps one value per attribute type, so the second goes in
    /// under the CN's OID spelled as a custom type).
    fn cert_with_cns(cns: &[&str], uris: &[&str], serial: &[u8]) -> CertificateDer<'static> {
        assert!(cns.len() <= 2, "rcgen writes at most two CNs this way");
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let types = [DnType::CommonName, DnType::CustomDnType(vec![2, 5, 4, 3])];
        for (ty, cn) in types.into_iter().zip(cns) {
            params.distinguished_name.push(ty, *cn);
        }
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(Ia5String::try_from(*u).expect("IA5")))
            .collect();
        params.serial_number = Some(SerialNumber::from_slice(serial));
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("certificate").der().clone()
    }

    fn uri_rule() -> IdentityRule {
        IdentityRule::UriSan {
            prefix: Arc::from("spiffe://ciphermq/"),
        }
    }

    #[test]
    fn cn_rule_reads_the_common_name() {
        let der = cert(Some("sender_1"), &["spiffe://ciphermq/other"], &[1, 2]);
        let peer = identify(&[der], &IdentityRule::Cn).unwrap();
        assert_eq!(peer.identity, "sender_1");
        assert_eq!(peer.cert.serial_hex(), "0102");
        let der = cert(None, &[], &[1]);
        assert_eq!(
            identify(&[der], &IdentityRule::Cn),
            Err(IdentityError::NoCommonName)
        );
        assert_eq!(
            identify(&[], &IdentityRule::Cn),
            Err(IdentityError::NoCertificate)
        );
    }

    #[test]
    fn cn_rule_refuses_a_subject_with_two_cns() {
        let der = cert_with_cns(&["admin", "sender_1"], &[], &[3]);
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        assert_eq!(
            parsed.subject().iter_common_name().count(),
            2,
            "two CNs made"
        );
        let refused = identify(&[der], &IdentityRule::Cn).unwrap_err();
        assert_eq!(refused, IdentityError::SeveralCommonNames(2));
        assert_eq!(
            refused.to_string(),
            "the client certificate has 2 Subject CNs; exactly one is required"
        );
        // The URI SAN rule ignores CNs, however many.
        let der = cert_with_cns(&["admin", "sender_1"], &["spiffe://ciphermq/r"], &[4]);
        assert_eq!(identify(&[der], &uri_rule()).unwrap().identity, "r");
    }

    #[test]
    fn uri_rule_strips_the_prefix_and_ignores_the_cn() {
        let der = cert(Some("sender_1"), &["spiffe://ciphermq/receiver_1"], &[7]);
        assert_eq!(
            identify(&[der], &uri_rule()).unwrap().identity,
            "receiver_1"
        );
    }

    #[test]
    fn uri_rule_fails_closed() {
        let refused =
            |uris: &[&str]| identify(&[cert(Some("admin"), uris, &[1])], &uri_rule()).unwrap_err();
        assert_eq!(refused(&[]), IdentityError::NoUriSan);
        assert_eq!(
            refused(&["spiffe://ciphermq/a", "spiffe://ciphermq/b"]),
            IdentityError::SeveralUriSans(2)
        );
        assert!(matches!(
            refused(&["spiffe://other/admin"]),
            IdentityError::ForeignUri { .. }
        ));
        // Prefixes compare byte for byte: no case folding.
        assert!(matches!(
            refused(&["SPIFFE://ciphermq/admin"]),
            IdentityError::ForeignUri { .. }
        ));
        for bad in ["team/admin", "", "..", "a b", "admin?x=1"] {
            let uri = format!("spiffe://ciphermq/{bad}");
            assert!(
                matches!(refused(&[&uri]), IdentityError::InvalidName { .. }),
                "{uri}"
            );
        }
        let long = format!("spiffe://ciphermq/{}", "a".repeat(256));
        let e = refused(&[&long]);
        assert!(matches!(e, IdentityError::InvalidName { .. }));
        assert!(
            e.to_string().len() < 400,
            "quoted pieces are shortened: {e}"
        );
    }

    #[test]
    fn serials_compare_without_leading_zeros() {
        assert_eq!(
            CertId::new(b"ca", &[0, 0x80, 1]),
            CertId::new(b"ca", &[0x80, 1])
        );
        assert_ne!(CertId::new(b"ca", &[1]), CertId::new(b"other", &[1]));
        assert_eq!(CertId::new(b"ca", &[0]).serial_hex(), "00");
    }
}
