//! `ciphermq_clients::pki`: what it writes, what it keeps, and that rustls accepts it.

mod common;

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ciphermq_clients::pki::{self, CaOrigin, FileAction, PkiError, PkiOptions};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use x509_parser::extensions::GeneralName;

fn demo_options(dir: &Path) -> PkiOptions {
    let mut opts = PkiOptions::new(dir.join("certs"), dir.join("keys"));
    opts.server_sans = vec![
        "broker.example".into(),
        "10.0.0.5".into(),
        "localhost".into(),
    ];
    opts.client_cns = ["admin", "sender_1", "receiver_1", "receiver.eu"]
        .map(String::from)
        .to_vec();
    opts.receiver_cns = ["receiver_1", "receiver.eu"].map(String::from).to_vec();
    opts
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn cert_der(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

fn roots(certs: &Path) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(cert_der(&certs.join("ca.crt"))).unwrap();
    Arc::new(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies `server.crt` for `localhost` and every client certificate against
/// `ca.crt`, the way the broker and clients will.
fn assert_chain_verifies(certs: &Path, clients: &[&str]) {
    let now = UnixTime::now();
    let server_verifier = WebPkiServerVerifier::builder_with_provider(roots(certs), provider())
        .build()
        .unwrap();
    server_verifier
        .verify_server_cert(
            &cert_der(&certs.join("server.crt")),
            &[],
            &ServerName::try_from("localhost").unwrap(),
            &[],
            now,
        )
        .expect("server certificate verifies");
    let client_verifier = WebPkiClientVerifier::builder_with_provider(roots(certs), provider())
        .build()
        .unwrap();
    for cn in clients {
        client_verifier
            .verify_client_cert(&cert_der(&certs.join(format!("{cn}.crt"))), &[], now)
            .unwrap_or_else(|e| panic!("{cn}: {e}"));
    }
}

#[test]
fn generates_every_file_with_private_modes_for_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    let report = pki::generate(&opts).unwrap();
    assert_eq!(report.ca, CaOrigin::Generated);
    assert!(
        report.files.iter().all(|f| f.action == FileAction::Created),
        "{report}"
    );

    let certs = &opts.out_dir;
    let keys = &opts.keys_dir;
    for secret in [
        "server.key",
        "admin.key",
        "sender_1.key",
        "receiver_1.key",
        "receiver.eu.key",
        "aes.key",
    ] {
        assert_eq!(mode(&certs.join(secret)), 0o600, "{secret}");
    }
    for public in [
        "ca.crt",
        "server.crt",
        "admin.crt",
        "sender_1.crt",
        "receiver_1.crt",
        "receiver.eu.crt",
    ] {
        assert_eq!(mode(&certs.join(public)), 0o644, "{public}");
    }
    for cn in ["receiver_1", "receiver.eu"] {
        assert_eq!(mode(&keys.join(format!("{cn}_private.key"))), 0o600);
        assert_eq!(mode(&keys.join(format!("{cn}_public.key"))), 0o644);
    }
    // The CA key lives apart from the leaf keys, in a directory only its owner reads.
    let ca_dir = dir.path().join("ca");
    assert_eq!(opts.ca_dir(), ca_dir);
    assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);
    assert_eq!(mode(&ca_dir), 0o700);
    assert!(!certs.join("ca.key").exists());
    assert!(!keys.join("ca.key").exists());
    // No temp files left behind.
    for dir in [certs, keys, &ca_dir] {
        for entry in fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(!name.ends_with(".tmp"), "{name}");
        }
    }
    // Every entry of the report exists.
    for file in &report.files {
        assert!(file.path.exists(), "{}", file.path.display());
    }
}

#[test]
fn every_file_loads_with_rustls_pki_types() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    for entry in fs::read_dir(&opts.out_dir).unwrap() {
        let path = entry.unwrap().path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("crt") => {
                let certs: Vec<_> = CertificateDer::pem_file_iter(&path)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert_eq!(certs.len(), 1, "{}", path.display());
            }
            Some("key") if path.file_name().unwrap() != "aes.key" => {
                let key = PrivateKeyDer::from_pem_file(&path).unwrap();
                assert!(
                    matches!(key, PrivateKeyDer::Pkcs8(_)),
                    "{}: PKCS#8",
                    path.display()
                );
            }
            _ => {}
        }
    }
    let aes = BASE64
        .decode(
            fs::read_to_string(opts.out_dir.join("aes.key"))
                .unwrap()
                .trim(),
        )
        .unwrap();
    assert_eq!(aes.len(), 32);
}

#[test]
fn client_certificates_carry_the_cn_and_client_auth() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    for cn in ["admin", "sender_1", "receiver.eu"] {
        let der = cert_der(&opts.out_dir.join(format!("{cn}.crt")));
        assert_eq!(common::common_name(&der), cn);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let eku = cert
            .extended_key_usage()
            .unwrap()
            .expect("EKU present")
            .value;
        assert!(eku.client_auth && !eku.server_auth, "{cn}");
        assert!(!cert.is_ca());
        let issuer = cert
            .issuer()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap();
        assert_eq!(issuer, pki::CA_COMMON_NAME);
    }
}

#[test]
fn ca_and_server_certificate_have_the_promised_shape() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();

    let ca_der = cert_der(&opts.out_dir.join("ca.crt"));
    assert_eq!(common::common_name(&ca_der), pki::CA_COMMON_NAME);
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let bc = ca.basic_constraints().unwrap().unwrap().value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0));
    let ku = ca.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    assert_eq!(
        ca.signature_algorithm.algorithm,
        x509_parser::oid_registry::OID_SIG_ECDSA_WITH_SHA384
    );

    let der = cert_der(&opts.out_dir.join("server.crt"));
    assert_eq!(common::common_name(&der), pki::SERVER_COMMON_NAME);
    let (_, server) = x509_parser::parse_x509_certificate(&der).unwrap();
    let eku = server.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth);
    let sans = &server
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names;
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for san in sans {
        match san {
            GeneralName::DNSName(name) => dns.push(name.to_string()),
            GeneralName::IPAddress(bytes) => ips.push(match bytes.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).unwrap()),
                _ => IpAddr::from(<[u8; 16]>::try_from(*bytes).unwrap()),
            }),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    assert_eq!(
        dns,
        ["localhost", "broker.example"],
        "localhost is not repeated"
    );
    let expected: Vec<IpAddr> = ["127.0.0.1", "::1", "10.0.0.5"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(ips, expected);

    assert_chain_verifies(
        &opts.out_dir,
        &["admin", "sender_1", "receiver_1", "receiver.eu"],
    );
}

#[test]
fn a_second_run_reuses_the_ca_and_keeps_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    let read = |path: &Path| fs::read(path).unwrap();
    let ca_crt = read(&opts.out_dir.join("ca.crt"));
    let ca_key = read(&opts.ca_dir().join("ca.key"));
    let server_crt = read(&opts.out_dir.join("server.crt"));
    let client_crt = read(&opts.out_dir.join("sender_1.crt"));
    let aes = read(&opts.out_dir.join("aes.key"));
    let private = read(&opts.keys_dir.join("receiver_1_private.key"));
    let public = read(&opts.keys_dir.join("receiver_1_public.key"));

    let report = pki::generate(&opts).unwrap();
    assert_eq!(report.ca, CaOrigin::Reused);
    assert!(report.to_string().contains("reused"), "{report}");
    assert_eq!(read(&opts.out_dir.join("ca.crt")), ca_crt);
    assert_eq!(read(&opts.ca_dir().join("ca.key")), ca_key);
    assert_eq!(
        read(&opts.out_dir.join("server.crt")),
        server_crt,
        "an existing server certificate is kept"
    );
    assert_eq!(read(&opts.out_dir.join("sender_1.crt")), client_crt);
    assert_eq!(read(&opts.out_dir.join("aes.key")), aes);
    assert_eq!(read(&opts.keys_dir.join("receiver_1_private.key")), private);
    assert_eq!(read(&opts.keys_dir.join("receiver_1_public.key")), public);
    let action = |path: &Path| report.files.iter().find(|f| f.path == path).unwrap().action;
    assert_eq!(action(&opts.out_dir.join("ca.crt")), FileAction::Kept);
    assert_eq!(action(&opts.out_dir.join("server.crt")), FileAction::Kept);
    assert!(
        report.files.iter().all(|f| f.action == FileAction::Kept),
        "{report}"
    );
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(
        action(&opts.keys_dir.join("receiver_1_private.key")),
        FileAction::Kept
    );

    // Certificates issued by the reused CA chain to the original ca.crt.
    assert_chain_verifies(
        &opts.out_dir,
        &["admin", "sender_1", "receiver_1", "receiver.eu"],
    );
    let ca_der = cert_der(&opts.out_dir.join("ca.crt"));
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let der = cert_der(&opts.out_dir.join("sender_1.crt"));
    let (_, leaf) = x509_parser::parse_x509_certificate(&der).unwrap();
    let ski = ca
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(id) => {
                Some(id.0.to_vec())
            }
            _ => None,
        })
        .expect("CA has a subject key identifier");
    let aki = leaf
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => None,
        })
        .expect("leaf has an authority key identifier");
    assert_eq!(aki, ski);
}

#[test]
fn force_ca_replaces_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    let ca_crt = fs::read(opts.out_dir.join("ca.crt")).unwrap();
    let aes = fs::read(opts.out_dir.join("aes.key")).unwrap();
    opts.force_ca = true;
    let report = pki::generate(&opts).unwrap();
    assert_eq!(report.ca, CaOrigin::Generated);
    assert_ne!(fs::read(opts.out_dir.join("ca.crt")).unwrap(), ca_crt);
    assert_eq!(
        fs::read(opts.out_dir.join("aes.key")).unwrap(),
        aes,
        "the AES key is never replaced"
    );
    assert_eq!(mode(&opts.ca_dir().join("ca.key")), 0o600);
    // The certificates this run names are re-issued by the new CA.
    assert_chain_verifies(&opts.out_dir, &["admin", "sender_1"]);
}

#[test]
fn x25519_keys_are_base64_pairs_and_a_lost_public_key_is_rederived() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    let decode = |path: &Path| -> [u8; 32] {
        let text = fs::read_to_string(path).unwrap();
        BASE64.decode(text.trim()).unwrap().try_into().unwrap()
    };
    let private_path = opts.keys_dir.join("receiver_1_private.key");
    let public_path = opts.keys_dir.join("receiver_1_public.key");
    let secret = crypto_box::SecretKey::from_bytes(decode(&private_path));
    assert_eq!(secret.public_key().to_bytes(), decode(&public_path));
    assert_ne!(
        decode(&public_path),
        decode(&opts.keys_dir.join("receiver.eu_public.key"))
    );

    let public = fs::read(&public_path).unwrap();
    fs::remove_file(&public_path).unwrap();
    pki::generate(&opts).unwrap();
    assert_eq!(fs::read(&public_path).unwrap(), public);

    // A public key that does not match its private key is an error naming the file.
    fs::write(&public_path, BASE64.encode([7u8; 32])).unwrap();
    let err = pki::generate(&opts).unwrap_err();
    assert!(
        matches!(err, PkiError::BadKeyFile { ref path, .. } if *path == public_path),
        "{err}"
    );

    // A public key without its private key is refused rather than replaced.
    fs::remove_file(&private_path).unwrap();
    let err = pki::generate(&opts).unwrap_err();
    assert!(matches!(err, PkiError::OrphanPublicKey { .. }), "{err}");
    assert!(err.to_string().contains("receiver_1_private.key"), "{err}");
}

#[test]
fn half_a_ca_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    fs::remove_file(opts.ca_dir().join("ca.key")).unwrap();
    let err = pki::generate(&opts).unwrap_err();
    assert!(matches!(err, PkiError::PartialCa { .. }), "{err}");
    assert!(err.to_string().contains("ca.key"), "{err}");
    opts.force_ca = true;
    assert_eq!(pki::generate(&opts).unwrap().ca, CaOrigin::Generated);
}

#[test]
fn a_ca_key_that_does_not_match_the_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = demo_options(dir.path());
    pki::generate(&opts).unwrap();
    fs::copy(
        opts.out_dir.join("server.key"),
        opts.ca_dir().join("ca.key"),
    )
    .unwrap();
    let err = pki::generate(&opts).unwrap_err();
    assert!(matches!(err, PkiError::ExistingCa { .. }), "{err}");
}

#[test]
fn bad_names_are_refused_before_anything_is_written() {
    for (clients, receivers, sans) in [
        (vec!["../evil"], vec![], vec![]),
        (vec!["has space"], vec![], vec![]),
        (vec![".."], vec![], vec![]),
        (vec!["ca"], vec![], vec![]),
        (vec!["aes"], vec![], vec![]),
        (vec![""], vec![], vec![]),
        (vec!["ok"], vec!["bad/receiver"], vec![]),
        (vec!["ok"], vec![], vec!["bad name"]),
        (vec!["ok"], vec![], vec!["ünïcode.example"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
        opts.client_cns = clients.iter().map(|s| s.to_string()).collect();
        opts.receiver_cns = receivers.iter().map(|s| s.to_string()).collect();
        opts.server_sans = sans.iter().map(|s| s.to_string()).collect();
        let err = pki::generate(&opts).unwrap_err();
        assert!(
            matches!(err, PkiError::InvalidName { .. }),
            "{clients:?} {receivers:?} {sans:?}: {err}"
        );
        assert!(!opts.out_dir.exists(), "nothing written for {clients:?}");
    }
}

#[test]
fn outputs_that_would_share_a_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PkiOptions::new(dir.path().join("same"), dir.path().join("same"));
    opts.client_cns = vec!["x_private".into()];
    opts.receiver_cns = vec!["x".into()];
    let err = pki::generate(&opts).unwrap_err();
    assert!(matches!(err, PkiError::PathCollision(_)), "{err}");

    opts.validity_days = 0;
    assert!(matches!(
        pki::generate(&opts).unwrap_err(),
        PkiError::InvalidOption(_)
    ));
}

#[test]
fn the_binary_writes_the_demo_set_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ciphermq-pki"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("generated a new CA"), "{stdout}");
    for cn in ["admin", "sender_1", "sender_2", "receiver_1", "receiver_2"] {
        assert!(
            dir.path().join("certs").join(format!("{cn}.crt")).exists(),
            "{cn}"
        );
    }
    for cn in ["receiver_1", "receiver_2"] {
        assert!(
            dir.path()
                .join("keys")
                .join(format!("{cn}_private.key"))
                .exists(),
            "{cn}"
        );
    }
    assert!(!dir
        .path()
        .join("keys")
        .join("sender_1_private.key")
        .exists());

    // A receiver named alone also gets a client certificate; errors name the path.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ciphermq-pki"))
        .current_dir(dir.path())
        .args([
            "--receiver",
            "receiver_9",
            "--out",
            "c2",
            "--keys",
            "k2",
            "--days",
            "30",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("c2/receiver_9.crt").exists());
    assert!(dir.path().join("k2/receiver_9_public.key").exists());
    assert!(!dir.path().join("c2/admin.crt").exists());

    fs::write(dir.path().join("blocked"), "a file, not a directory").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ciphermq-pki"))
        .current_dir(dir.path())
        .args(["--out", "blocked/certs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("blocked"), "{stderr}");
}

#[test]
fn the_ca_directory_defaults_beside_the_certificates() {
    use pki::default_ca_dir;
    assert_eq!(default_ca_dir(Path::new("certs")), Path::new("ca"));
    assert_eq!(
        default_ca_dir(Path::new("/etc/ciphermq/certs")),
        Path::new("/etc/ciphermq/ca")
    );
    assert_eq!(
        default_ca_dir(Path::new("/tmp/x/rogue")),
        Path::new("/tmp/x/rogue-ca")
    );
    assert_eq!(default_ca_dir(Path::new(".")), Path::new("./ca"));
    let mut opts = PkiOptions::new("certs", "keys");
    opts.ca_dir = Some("/secure/ca".into());
    assert_eq!(opts.ca_dir(), Path::new("/secure/ca"));
}

/// Two PKIs side by side in one directory (as the broker's tests make one and a
/// rogue one) never share a CA key.
#[test]
fn two_pkis_in_one_directory_have_separate_cas() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
    opts.client_cns = vec!["sender_1".into()];
    pki::generate(&opts).unwrap();
    let mut rogue = PkiOptions::new(dir.path().join("rogue"), dir.path().join("rogue-keys"));
    rogue.client_cns = vec!["sender_1".into()];
    assert_eq!(pki::generate(&rogue).unwrap().ca, CaOrigin::Generated);
    assert_ne!(
        fs::read(opts.out_dir.join("ca.crt")).unwrap(),
        fs::read(rogue.out_dir.join("ca.crt")).unwrap()
    );
    assert!(dir.path().join("ca/ca.key").exists());
    assert!(dir.path().join("rogue-ca/ca.key").exists());
    // Each CA's clients fail against the other's trust store.
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(&opts.out_dir), provider())
        .build()
        .unwrap();
    verifier
        .verify_client_cert(
            &cert_der(&rogue.out_dir.join("sender_1.crt")),
            &[],
            UnixTime::now(),
        )
        .expect_err("the rogue certificate is not trusted");
    assert_chain_verifies(&opts.out_dir, &["sender_1"]);
    assert_chain_verifies(&rogue.out_dir, &["sender_1"]);
}

#[test]
fn a_certificate_from_another_ca_is_not_kept_silently() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
    opts.client_cns = vec!["sender_1".into()];
    pki::generate(&opts).unwrap();
    let mut other = PkiOptions::new(dir.path().join("other"), dir.path().join("other-keys"));
    other.client_cns = vec!["sender_1".into()];
    pki::generate(&other).unwrap();
    for ext in ["crt", "key"] {
        fs::copy(
            other.out_dir.join(format!("sender_1.{ext}")),
            opts.out_dir.join(format!("sender_1.{ext}")),
        )
        .unwrap();
    }
    let err = pki::generate(&opts).unwrap_err();
    assert!(
        matches!(err, PkiError::ExistingCertificate { ref path, .. } if path.ends_with("certs/sender_1.crt")),
        "{err}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    opts.force = true;
    pki::generate(&opts).unwrap();
    assert_chain_verifies(&opts.out_dir, &["sender_1"]);
}

#[test]
fn issue_needs_an_existing_ca_and_refuses_existing_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
    opts.client_cns = vec!["alice".into()];
    let err = pki::issue(&opts).unwrap_err();
    assert!(matches!(err, PkiError::NoCa { .. }), "{err}");
    assert!(err.to_string().contains("ciphermq-pki init"), "{err}");

    pki::generate(&PkiOptions::new(&opts.out_dir, &opts.keys_dir)).unwrap();
    opts.receiver_cns = vec!["bob".into()];
    let report = pki::issue(&opts).unwrap();
    assert_eq!(report.ca, CaOrigin::Reused);
    assert_chain_verifies(&opts.out_dir, &["alice", "bob"]);
    assert!(opts.keys_dir.join("bob_private.key").exists());
    let err = pki::issue(&opts).unwrap_err();
    assert!(
        matches!(err, PkiError::CertificateExists { ref cn, .. } if cn == "alice"),
        "{err}"
    );
}
