//! A test PKI's CA, loaded with rcgen to issue what `ciphermq-pki` does
//! not: a re-issued server certificate, client certificates with URI SANs
//! or two CNs, CRLs. Everything it issues is trusted by brokers and clients
//! of the PKI it was loaded from; [`TestCa::generate`] makes one nobody
//! trusts.

use std::path::{Path, PathBuf};

use rcgen::{
    CertificateParams, CertificateRevocationListParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, Ia5String, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams,
    SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// The CA of a test PKI, able to sign: certificates and CRLs that tests
/// need and `ciphermq-pki` does not make.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate issued by [`TestCa`]: where its files are, and its serial.
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Its DER, as a peer sees it.
    pub der: Vec<u8>,
    /// Its serial number (big-endian).
    pub serial: Vec<u8>,
}

/// The serial of the first certificate in the PEM file `path`.
pub fn serial_of(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).expect("certificate file");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM");
    let cert = pem.parse_x509().expect("certificate");
    cert.raw_serial().to_vec()
}

impl TestCa {
    /// Loads `ca.crt` from `dir` (a PKI's certificates, see
    /// [`crate::pki`]) and its key from where `ciphermq-pki` keeps it,
    /// apart from the leaf keys.
    pub fn load_from(dir: &Path) -> TestCa {
        let read = |path: std::path::PathBuf| {
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let ca_dir = ciphermq_clients::pki::default_ca_dir(dir);
        let key = KeyPair::from_pem(&read(ca_dir.join("ca.key"))).expect("CA key");
        let params =
            CertificateParams::from_ca_cert_pem(&read(dir.join("ca.crt"))).expect("CA params");
        // Same subject and key as the real CA: what it signs verifies
        // against `ca.crt`.
        let cert = params.self_signed(&key).expect("CA issuer");
        TestCa { cert, key }
    }

    /// A new CA named `name`, trusted by nobody.
    pub fn generate(name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    fn issue(
        &self,
        dir: &Path,
        stem: &str,
        mut params: CertificateParams,
        usage: ExtendedKeyUsagePurpose,
    ) -> Issued {
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::minutes(5);
        if params.not_after <= now {
            params.not_after = now + Duration::days(30);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let serial: Vec<u8> = (0..16).map(|_| rand::random::<u8>()).collect();
        let mut serial = serial;
        serial[0] = (serial[0] & 0x7f) | 0x01;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let key = KeyPair::generate().expect("key pair");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("certificate");
        let (cert_path, key_path) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Issued {
            cert: cert_path,
            key: key_path,
            der: cert.der().to_vec(),
            serial,
        }
    }

    /// A server certificate for `localhost`, valid `days` days, written to
    /// `dir/{stem}.crt` and `dir/{stem}.key`.
    pub fn server(&self, dir: &Path, stem: &str, days: i64) -> Issued {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "ciphermq-server (re-issued)");
        params.not_after = OffsetDateTime::now_utc() + Duration::days(days);
        self.issue(dir, stem, params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate with Subject CN `cn` (if any) and the URI SANs
    /// `uris`, written to `dir/{stem}.crt` and `dir/{stem}.key`.
    pub fn client(&self, dir: &Path, stem: &str, cn: Option<&str>, uris: &[&str]) -> Issued {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(Ia5String::try_from(*u).expect("IA5 URI")))
            .collect();
        self.issue(dir, stem, params, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate whose subject holds two CN attributes, `first`
    /// then `second`, written to `dir/{stem}.crt` and `dir/{stem}.key`
    /// (rcgen keeps one value per attribute type, so the second goes in
    /// under the CN's OID spelled as a custom type).
    pub fn client_with_two_cns(&self, dir: &Path, stem: &str, first: &str, second: &str) -> Issued {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, first);
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 3]), second);
        self.issue(dir, stem, params, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A CRL revoking `serials`, next update `next_update_days` from now
    /// (negative: already past due); PEM or DER.
    pub fn crl(&self, serials: &[&[u8]], next_update_days: i64, pem: bool) -> Vec<u8> {
        let now = OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - Duration::days(next_update_days.abs() + 1),
            next_update: now + Duration::days(next_update_days),
            crl_number: SerialNumber::from(rand::random::<u32>() as u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|serial| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(serial),
                    revocation_time: now - Duration::minutes(1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.cert, &self.key).expect("CRL");
        if pem {
            crl.pem().expect("CRL PEM").into_bytes()
        } else {
            crl.der().to_vec()
        }
    }
}
