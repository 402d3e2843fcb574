//! Leaf certificates (the server's and the clients'): signing a new one, and
//! deciding whether one on disk can be kept.

use std::net::IpAddr;
use std::path::Path;

use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use super::ca::{first_certificate, Ca};
use super::error::rcgen_err;
use super::files::{exists, read_to_string, with_extension, write_file};
use super::names::San;
use super::{distinguished_name, random_serial, PkiError, PkiFile};

/// A certificate on disk that this run may keep.
#[derive(Debug, Clone)]
pub(super) struct Existing {
    /// Its expiry.
    pub(super) not_after: OffsetDateTime,
    /// Its subject alternative names (the server's; clients have none).
    pub(super) sans: Vec<San>,
}

/// What is on disk at a leaf's place.
#[derive(Debug, Clone)]
pub(super) enum LeafState {
    /// No certificate.
    Missing,
    /// A certificate for the expected CN, with its key, signed by the CA in use.
    Good(Existing),
    /// A certificate that cannot be kept, and why (its SANs, if readable, so a
    /// re-issue keeps them).
    Bad {
        /// What is wrong.
        reason: String,
        /// The names it had.
        sans: Vec<San>,
    },
}

/// Looks at `{stem}.crt` and `{stem}.key`. `ca` is the CA that signs this run, or
/// `None` when a new CA is being made (then nothing on disk chains to it).
pub(super) fn inspect(stem: &Path, cn: &str, ca: Option<&Ca>) -> Result<LeafState, PkiError> {
    let crt = with_extension(stem, "crt");
    let key = with_extension(stem, "key");
    if !exists(&crt)? {
        return Ok(LeafState::Missing);
    }
    let pem = read_to_string(&crt)?;
    let der = match first_certificate(&pem) {
        Ok(der) => der,
        Err(reason) => {
            return Ok(LeafState::Bad {
                reason,
                sans: Vec::new(),
            })
        }
    };
    let cert = match x509_parser::parse_x509_certificate(&der) {
        Ok((_, cert)) => cert,
        Err(e) => {
            return Ok(LeafState::Bad {
                reason: format!("not a readable certificate: {e}"),
                sans: Vec::new(),
            })
        }
    };
    let sans = sans_of(&cert);
    let bad = |reason: String| {
        Ok(LeafState::Bad {
            reason,
            sans: sans.clone(),
        })
    };
    let subject = common_name(&cert).unwrap_or_default();
    if subject != cn {
        return bad(format!("its CN is {subject:?}, not {cn:?}"));
    }
    if !exists(&key)? {
        return bad(format!("its private key {} is missing", key.display()));
    }
    let key_pair = match KeyPair::from_pem(&read_to_string(&key)?) {
        Ok(key_pair) => key_pair,
        Err(e) => {
            return bad(format!(
                "{} is not a usable private key: {e}",
                key.display()
            ))
        }
    };
    if key_pair.public_key_der().as_slice() != cert.public_key().raw {
        return bad(format!("{} is not its private key", key.display()));
    }
    match ca {
        None => return bad("it was issued by the CA being replaced".into()),
        Some(ca) => {
            if let Err(reason) = signed_by(&cert, &ca.der) {
                return bad(reason);
            }
        }
    }
    Ok(LeafState::Good(Existing {
        not_after: cert.validity().not_after.to_datetime(),
        sans,
    }))
}

/// Checks that `cert` carries a valid signature of the CA certificate `ca_der`.
pub(super) fn signed_by(cert: &X509Certificate<'_>, ca_der: &[u8]) -> Result<(), String> {
    let (_, ca) = x509_parser::parse_x509_certificate(ca_der).map_err(|e| e.to_string())?;
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|_| "it was not issued by this CA (its signature does not verify)".to_owned())
}

/// The first Common Name of the subject.
pub(super) fn common_name(cert: &X509Certificate<'_>) -> Option<String> {
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// The DNS and IP subject alternative names of `cert`, DNS names in lower case.
pub(super) fn sans_of(cert: &X509Certificate<'_>) -> Vec<San> {
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(San::Dns(dns.to_ascii_lowercase())),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                _ => None,
            }
            .map(San::Ip),
            _ => None,
        })
        .collect()
}

/// Issues a leaf certificate signed by the CA and writes `{stem}.key` then
/// `{stem}.crt`.
pub(super) fn sign(
    ca: &Ca,
    cn: &str,
    sans: &[San],
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
    params.subject_alt_names = sans.iter().map(San::to_rcgen).collect::<Result<_, _>>()?;
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
