//! `ciphermq-pki` commands through the real binary, on real files in temp dirs:
//! nothing that exists is re-issued unless asked, issued certificates chain to the
//! CA, the CA key lives apart with mode 0600, and errors say what to do.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// Runs `ciphermq-pki args…` in `dir`.
fn pki(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ciphermq-pki"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run ciphermq-pki")
}

/// Runs it and insists on success; returns stdout and stderr.
fn ok(dir: &Path, args: &[&str]) -> (String, String) {
    let out = pki(dir, args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    (stdout, stderr)
}

/// Runs it and insists on failure; returns stderr.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = pki(dir, args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    stderr
}

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    let path = path.as_ref();
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn mode(path: impl AsRef<Path>) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn cert_der(path: impl AsRef<Path>) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path.as_ref()).unwrap()
}

fn roots(ca_crt: &Path) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(cert_der(ca_crt)).unwrap();
    Arc::new(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies `certs/{cn}.crt` as a client certificate against `certs/ca.crt` with
/// rustls' webpki verifier, the way the broker does.
fn verify_client(certs: &Path, cn: &str) {
    client_verdict(certs, cn, Vec::new()).unwrap_or_else(|e| panic!("{cn}: {e}"));
}

/// The webpki client verifier's verdict on `certs/{cn}.crt`, with `crls`.
fn client_verdict(
    certs: &Path,
    cn: &str,
    crls: Vec<rustls::pki_types::CertificateRevocationListDer<'static>>,
) -> Result<(), rustls::Error> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(&certs.join("ca.crt")), provider())
            .with_crls(crls)
            .build()
            .unwrap();
    verifier
        .verify_client_cert(
            &cert_der(certs.join(format!("{cn}.crt"))),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

/// Verifies `certs/server.crt` for `name` against `certs/ca.crt`, as clients do.
fn verify_server(certs: &Path, name: &str) -> Result<(), rustls::Error> {
    let verifier =
        WebPkiServerVerifier::builder_with_provider(roots(&certs.join("ca.crt")), provider())
            .build()
            .unwrap();
    verifier
        .verify_server_cert(
            &cert_der(certs.join("server.crt")),
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

/// The CN of a PEM certificate file.
fn cn_of(path: impl AsRef<Path>) -> String {
    let der = cert_der(path);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    cn
}

/// Every regular file under `dir` with its bytes, for "nothing changed" checks.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for sub in ["certs", "keys", "ca"] {
        let Ok(entries) = fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            files.push((path.clone(), read(&path)));
        }
    }
    files.sort();
    files
}

#[test]
fn init_twice_keeps_the_ca_and_the_server_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (first, _) = ok(d, &["init"]);
    assert!(first.contains("generated a new CA"), "{first}");
    let before = snapshot(d);
    assert!(d.join("certs/server.crt").exists());
    assert!(d.join("certs/aes.key").exists());
    assert!(!d.join("certs/admin.crt").exists(), "init makes no clients");

    let (second, stderr) = ok(d, &["init"]);
    assert!(second.contains("reused the existing CA"), "{second}");
    assert!(second.contains("kept     certs/server.crt"), "{second}");
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(snapshot(d), before, "a second init changes no file");

    // The same --san names again are no change either.
    ok(d, &["init", "--force", "--san", "broker.example"]);
    let before = snapshot(d);
    ok(d, &["init", "--san", "broker.example"]);
    ok(d, &["init"]);
    assert_eq!(snapshot(d), before);
}

#[test]
fn a_run_without_a_command_is_init_plus_the_demo_clients_and_can_be_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["--out", "certs", "--keys", "keys"]);
    for cn in ["admin", "sender_1", "sender_2", "receiver_1", "receiver_2"] {
        verify_client(&d.join("certs"), cn);
    }
    for cn in ["receiver_1", "receiver_2"] {
        assert!(d.join(format!("keys/{cn}_private.key")).exists());
    }
    let before = snapshot(d);
    let (_, stderr) = ok(d, &[]);
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(snapshot(d), before, "nothing re-issued on a second run");
}

#[test]
fn init_with_a_new_san_refuses_and_force_reissues_with_old_and_new_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    ok(d, &["init", "--san", "broker-a.example"]);
    let server = read(certs.join("server.crt"));
    let ca = (read(certs.join("ca.crt")), read(d.join("ca/ca.key")));

    let stderr = fails(d, &["init", "--san", "broker-b.example"]);
    assert!(stderr.contains("certs/server.crt"), "{stderr}");
    assert!(stderr.contains("broker-b.example"), "{stderr}");
    assert!(stderr.contains("init --force"), "{stderr}");
    assert_eq!(read(certs.join("server.crt")), server, "nothing re-issued");
    verify_server(&certs, "broker-b.example").expect_err("b is not covered yet");

    let (stdout, _) = ok(d, &["init", "--force", "--san", "broker-b.example"]);
    assert!(stdout.contains("replaced certs/server.crt"), "{stdout}");
    assert_ne!(read(certs.join("server.crt")), server);
    assert_eq!(
        (read(certs.join("ca.crt")), read(d.join("ca/ca.key"))),
        ca,
        "--force never touches the CA"
    );
    // The union: the old name survives, the new one is added, the defaults stay.
    for name in [
        "broker-a.example",
        "broker-b.example",
        "localhost",
        "127.0.0.1",
        "::1",
    ] {
        verify_server(&certs, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    // --force alone renews the certificate with the names it has.
    let renewed = read(certs.join("server.crt"));
    ok(d, &["init", "--force"]);
    assert_ne!(read(certs.join("server.crt")), renewed);
    verify_server(&certs, "broker-a.example").unwrap();
    verify_server(&certs, "broker-b.example").unwrap();
}

#[test]
fn issue_makes_a_client_certificate_signed_by_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    ok(d, &["init"]);
    let (stdout, _) = ok(d, &["issue", "alice", "svc.eu-1:worker"]);
    assert!(stdout.contains("created  certs/alice.crt"), "{stdout}");
    for cn in ["alice", "svc.eu-1:worker"] {
        verify_client(&certs, cn);
        assert_eq!(cn_of(certs.join(format!("{cn}.crt"))), cn);
        assert_eq!(mode(certs.join(format!("{cn}.key"))), 0o600);
        assert_eq!(mode(certs.join(format!("{cn}.crt"))), 0o644);
    }
    // The signature itself, checked with x509-parser against the CA's public key.
    let ca_der = cert_der(certs.join("ca.crt"));
    let leaf_der = cert_der(certs.join("alice.crt"));
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
    leaf.verify_signature(Some(ca.public_key())).unwrap();
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth);
    assert!(
        !d.join("keys/alice_private.key").exists(),
        "issue makes no X25519 keys"
    );
}

#[test]
fn issue_of_an_existing_cn_refuses_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    ok(d, &["init"]);
    ok(d, &["issue", "alice"]);
    let crt = read(certs.join("alice.crt"));
    let key = read(certs.join("alice.key"));

    let stderr = fails(d, &["issue", "alice"]);
    assert!(
        stderr.contains("certs/alice.crt already exists"),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");
    // One existing CN stops the whole command before anything is written.
    let stderr = fails(d, &["issue", "bob", "alice"]);
    assert!(stderr.contains("alice"), "{stderr}");
    assert!(!certs.join("bob.crt").exists());
    assert_eq!(
        (read(certs.join("alice.crt")), read(certs.join("alice.key"))),
        (crt.clone(), key)
    );

    let (stdout, _) = ok(d, &["issue", "--force", "alice"]);
    assert!(stdout.contains("replaced certs/alice.crt"), "{stdout}");
    assert_ne!(read(certs.join("alice.crt")), crt);
    verify_client(&certs, "alice");
}

#[test]
fn issue_without_a_ca_says_to_run_init() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for args in [&["issue", "alice"][..], &["receiver", "bob"]] {
        let stderr = fails(d, args);
        assert!(stderr.contains("run `ciphermq-pki init` first"), "{stderr}");
        assert!(stderr.contains("certs/ca.crt"), "{stderr}");
        assert!(stderr.contains("ca/ca.key"), "{stderr}");
    }
    assert!(!d.join("certs").exists() && !d.join("ca").exists() && !d.join("keys").exists());
}

#[test]
fn receiver_writes_a_certificate_and_the_x25519_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    let keys = d.join("keys");
    ok(d, &["init"]);
    ok(d, &["receiver", "bob"]);
    verify_client(&certs, "bob");
    let private = keys.join("bob_private.key");
    let public = keys.join("bob_public.key");
    assert_eq!(mode(&private), 0o600);
    assert_eq!(mode(&public), 0o644);
    // The formats the receiver and the sender read.
    let secret = ciphermq_clients::key_file::read_secret_key(&private).unwrap();
    let public_key = ciphermq_clients::key_file::read_public_key(&public).unwrap();
    assert_eq!(secret.public_key(), public_key);

    // Everything exists: refused; --force re-issues the certificate, keeps the pair.
    let stderr = fails(d, &["receiver", "bob"]);
    assert!(stderr.contains("certs/bob.crt already exists"), "{stderr}");
    let pair = (read(&private), read(&public));
    let crt = read(certs.join("bob.crt"));
    ok(d, &["receiver", "--force", "bob"]);
    assert_ne!(read(certs.join("bob.crt")), crt);
    assert_eq!(
        (read(&private), read(&public)),
        pair,
        "the key pair is kept"
    );

    // A client that becomes a receiver keeps its certificate and gains a pair.
    ok(d, &["issue", "carol"]);
    let crt = read(certs.join("carol.crt"));
    let (stdout, _) = ok(d, &["receiver", "carol"]);
    assert!(stdout.contains("kept     certs/carol.crt"), "{stdout}");
    assert_eq!(read(certs.join("carol.crt")), crt);
    assert!(keys.join("carol_private.key").exists());
}

#[test]
fn list_shows_the_ca_the_server_names_the_clients_and_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init", "--san", "broker.example", "--san", "10.0.0.5"]);
    ok(d, &["issue", "alice"]);
    ok(d, &["receiver", "bob"]);

    let (table, _) = ok(d, &["list"]);
    assert!(table.contains("certs/ca.crt"), "{table}");
    assert!(table.contains("key ca/ca.key"), "{table}");
    assert!(
        table.contains("names: localhost, 127.0.0.1, ::1, broker.example, 10.0.0.5"),
        "{table}"
    );
    let row = |cn: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(cn))
            .unwrap_or_else(|| panic!("no row for {cn}: {table}"))
            .to_owned()
    };
    assert!(row("alice").trim_end().ends_with('-'), "{table}");
    assert!(row("bob").contains("pair"), "{table}");
    assert!(row("bob").contains("UTC"), "{table}");

    let (json, _) = ok(d, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ca"]["key"], "ca/ca.key");
    assert_eq!(v["ca"]["key_beside_leaf_keys"], false);
    assert_eq!(v["server"]["cn"], "ciphermq-server");
    assert_eq!(
        v["server"]["sans"],
        serde_json::json!([
            "localhost",
            "127.0.0.1",
            "::1",
            "broker.example",
            "10.0.0.5"
        ])
    );
    let clients = v["clients"].as_array().unwrap();
    let client = |cn: &str| clients.iter().find(|c| c["cn"] == cn).unwrap().clone();
    assert_eq!(client("alice")["x25519"], "none");
    assert_eq!(client("bob")["x25519"], "pair");
    assert!(client("bob")["problem"].is_null(), "{json}");
    assert!(
        client("alice")["days_left"].as_i64().unwrap() >= 824,
        "{json}"
    );
    assert!(client("alice")["not_after"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    // A certificate from elsewhere is shown with its problem, not hidden.
    fs::copy(d.join("certs/server.crt"), d.join("certs/stray.crt")).unwrap();
    let (table, _) = ok(d, &["list"]);
    let stray = table
        .lines()
        .find(|l| l.starts_with("ciphermq-server"))
        .unwrap();
    assert!(stray.contains("not \"stray\""), "{table}");
    assert!(stray.contains("certs/stray.key is missing"), "{table}");

    // An empty directory lists as such.
    let empty = tempfile::tempdir().unwrap();
    let (table, _) = ok(empty.path(), &["list"]);
    assert!(table.contains("run `ciphermq-pki init`"), "{table}");
}

#[test]
fn the_ca_key_has_mode_0600_in_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &[]);
    let ca_key = d.join("ca/ca.key");
    assert_eq!(mode(&ca_key), 0o600);
    assert_eq!(mode(d.join("ca")), 0o700);
    assert!(!d.join("certs/ca.key").exists(), "not beside the leaf keys");
    assert!(!d.join("keys/ca.key").exists());
    for key in ["server", "admin", "sender_1", "receiver_1"] {
        assert_eq!(mode(d.join(format!("certs/{key}.key"))), 0o600, "{key}");
    }
    // The directory keeps itself out of version control.
    assert_eq!(
        fs::read_to_string(d.join("ca/.gitignore"))
            .unwrap()
            .lines()
            .last(),
        Some("*")
    );

    // --ca-dir puts it elsewhere; the certificate directory is refused.
    ok(d, &["--out", "c2", "--ca-dir", "private/ca", "init"]);
    assert_eq!(mode(d.join("private/ca/ca.key")), 0o600);
    assert!(!d.join("c2/ca.key").exists());
    let stderr = fails(d, &["init", "--out", "c3", "--ca-dir", "c3"]);
    assert!(stderr.contains("apart from the leaf keys"), "{stderr}");
    let stderr = fails(d, &["init", "--out", "c3", "--ca-dir", "keys"]);
    assert!(stderr.contains("keys directory"), "{stderr}");
}

#[test]
fn an_old_layout_is_used_with_a_one_line_warning() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &[]);
    // The old layout: the CA key beside the leaf keys, no CA directory.
    fs::rename(d.join("ca/ca.key"), d.join("certs/ca.key")).unwrap();
    fs::remove_dir_all(d.join("ca")).unwrap();
    let before = snapshot(d);

    let (_, stderr) = ok(d, &[]);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("warning"), "{stderr}");
    assert!(
        stderr.contains("mv certs/ca.key ca/ca.key"),
        "says how to move it: {stderr}"
    );
    assert_eq!(snapshot(d), before, "nothing moved or re-issued");

    let (_, stderr) = ok(d, &["issue", "alice"]);
    assert!(stderr.contains("certs/ca.key"), "{stderr}");
    verify_client(&d.join("certs"), "alice");
    let (_, stderr) = ok(d, &["list"]);
    assert!(stderr.contains("certs/ca.key"), "{stderr}");

    // Moved as suggested (mkdir -m 700), it is found there.
    fs::DirBuilder::new()
        .mode(0o700)
        .create(d.join("ca"))
        .unwrap();
    fs::rename(d.join("certs/ca.key"), d.join("ca/ca.key")).unwrap();
    let (_, stderr) = ok(d, &["issue", "bob"]);
    assert!(stderr.is_empty(), "{stderr}");
    // A CA directory others may enter is pointed out.
    fs::set_permissions(d.join("ca"), fs::Permissions::from_mode(0o755)).unwrap();
    let (_, stderr) = ok(d, &["issue", "dave"]);
    assert!(stderr.contains("chmod 700 ca"), "{stderr}");
    verify_client(&d.join("certs"), "bob");

    // Both places at once is not guessed at.
    fs::copy(d.join("ca/ca.key"), d.join("certs/ca.key")).unwrap();
    let stderr = fails(d, &["issue", "carol"]);
    assert!(stderr.contains("two CA keys"), "{stderr}");
}

#[test]
fn bad_cns_are_refused_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    let long = "a".repeat(256);
    for cn in [
        "has space",
        "../evil",
        "a/b",
        "ünï",
        "",
        "..",
        "ca",
        "server",
        "aes",
        &long,
    ] {
        for command in ["issue", "receiver"] {
            let stderr = fails(d, &[command, cn]);
            assert!(
                stderr.contains("invalid name"),
                "{command} {cn:?}: {stderr}"
            );
        }
    }
    let stderr = fails(d, &["issue", "has space"]);
    assert!(stderr.contains("[A-Za-z0-9_.:-]{1,255}"), "{stderr}");
    // The rule allows 255 bytes, file names (with the atomic writer's temporary
    // name) fewer: said before anything is written.
    let stderr = fails(d, &["issue", &"a".repeat(255)]);
    assert!(stderr.contains("at most 243 bytes"), "{stderr}");
    let stderr = fails(d, &["receiver", &"b".repeat(236)]);
    assert!(stderr.contains("at most 235 bytes"), "{stderr}");
    ok(d, &["issue", &"a".repeat(243)]);
    ok(d, &["receiver", &"b".repeat(235)]);
    // Nothing else was written.
    let names: Vec<String> = fs::read_dir(d.join("certs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 8, "{names:?}"); // ca.crt server.* aes.key + 2 × 2
}

#[test]
fn errors_name_the_file_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);

    fs::write(d.join("certs/ca.crt"), "not a certificate").unwrap();
    let stderr = fails(d, &["issue", "alice"]);
    assert!(stderr.contains("certs/ca.crt"), "{stderr}");
    let stderr = fails(d, &["init"]);
    assert!(stderr.contains("certs/ca.crt"), "{stderr}");

    // An unreadable file (a directory where a key should be) is named too.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["init"]);
    fs::remove_file(d.join("ca/ca.key")).unwrap();
    fs::create_dir(d.join("ca/ca.key")).unwrap();
    let stderr = fails(d, &["issue", "alice"]);
    assert!(stderr.contains("ca/ca.key"), "{stderr}");

    // A command's options before the command are refused, not ignored.
    let stderr = fails(d, &["--san", "x.example", "init"]);
    assert!(stderr.contains("after the command"), "{stderr}");
}

#[test]
fn force_ca_replaces_the_ca_and_names_the_certificates_it_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &[]);
    ok(d, &["issue", "alice"]);
    let old_ca = read(d.join("certs/ca.crt"));
    let (_, stderr) = ok(d, &["init", "--force-ca"]);
    assert_ne!(read(d.join("certs/ca.crt")), old_ca);
    verify_server(&d.join("certs"), "localhost").unwrap();
    assert!(stderr.contains("alice"), "{stderr}");
    assert!(stderr.contains("issue --force"), "{stderr}");
    // They are not re-issued behind the operator's back: a run without a command
    // names them and asks for --force.
    let stderr = fails(d, &[]);
    assert!(stderr.contains("not issued by this CA"), "{stderr}");
    ok(d, &["--force"]);
    ok(d, &["issue", "--force", "alice"]);
    for cn in ["admin", "sender_1", "receiver_1", "alice"] {
        verify_client(&d.join("certs"), cn);
    }
}

/// Verifies `certs/{cn}.crt` as the broker does with `tls.crl_path =
/// certs/ca.crl`.
fn verify_client_with_crl(certs: &Path, cn: &str) -> Result<(), rustls::Error> {
    use rustls::pki_types::CertificateRevocationListDer;
    let crls: Vec<CertificateRevocationListDer<'static>> =
        CertificateRevocationListDer::pem_file_iter(certs.join("ca.crl"))
            .unwrap()
            .map(|crl| crl.unwrap())
            .collect();
    client_verdict(certs, cn, crls)
}

#[test]
fn revoke_lists_certificates_in_a_crl_that_keeps_earlier_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["--client", "sender_1", "--client", "sender_2"]);
    ok(d, &["issue", "sender_3"]);
    // No CN: an empty list to start with.
    let (out, _) = ok(d, &["revoke"]);
    assert!(
        out.contains("0 certificate(s) revoked, CRL number 1"),
        "{out}"
    );
    verify_client_with_crl(&d.join("certs"), "sender_2").expect("not revoked yet");

    let (out, err) = ok(d, &["revoke", "sender_2"]);
    assert!(out.contains("revoked sender_2 (serial "), "{out}");
    assert!(
        out.contains("1 certificate(s) revoked, CRL number 2"),
        "{out}"
    );
    assert!(err.contains("tls.crl_path"), "{err}");
    assert_eq!(mode(d.join("certs/ca.crl")), 0o644);
    let certs = d.join("certs");
    match verify_client_with_crl(&certs, "sender_2") {
        Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)) => {}
        other => panic!("sender_2 should be revoked: {other:?}"),
    }
    verify_client_with_crl(&certs, "sender_1").expect("sender_1 is not revoked");

    // A second run keeps sender_2 listed; naming it again changes nothing.
    let (out, _) = ok(
        d,
        &["revoke", "sender_3", "sender_2", "--next-update-days", "7"],
    );
    assert!(out.contains("sender_2: already revoked"), "{out}");
    assert!(
        out.contains("2 certificate(s) revoked, CRL number 3"),
        "{out}"
    );
    for cn in ["sender_2", "sender_3"] {
        assert!(
            verify_client_with_crl(&certs, cn).is_err(),
            "{cn} should be revoked"
        );
    }
    verify_client_with_crl(&certs, "sender_1").expect("sender_1 is not revoked");
    // The certificate files stay.
    assert!(certs.join("sender_2.crt").is_file());
}

#[test]
fn revoke_refuses_an_unknown_cn_and_a_list_of_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = fails(d, &["revoke", "sender_1"]);
    assert!(err.contains("run `ciphermq-pki init` first"), "{err}");
    ok(d, &["--client", "sender_1"]);
    let err = fails(d, &["revoke", "nobody"]);
    assert!(
        err.contains("no certificate for CN nobody") && err.contains("nobody.crt"),
        "{err}"
    );
    assert!(!d.join("certs/ca.crl").exists(), "nothing written");
    // A list signed by another CA is not carried over.
    let other = tempfile::tempdir().unwrap();
    ok(other.path(), &["--client", "x"]);
    ok(other.path(), &["revoke", "x"]);
    fs::copy(other.path().join("certs/ca.crl"), d.join("certs/ca.crl")).unwrap();
    let before = read(d.join("certs/ca.crl"));
    let err = fails(d, &["revoke", "sender_1"]);
    assert!(
        err.contains("ca.crl") && err.contains("not signed by this CA"),
        "{err}"
    );
    assert_eq!(read(d.join("certs/ca.crl")), before, "left as it was");
}
