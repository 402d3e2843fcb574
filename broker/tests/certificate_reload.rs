//! `SIGHUP` (and `POST /api/reload`) reload `[tls]` with the rest, all or
//! nothing: a new server certificate serves the next handshakes (broker
//! port and admin endpoint) while open connections keep their session; a
//! file that cannot be used keeps everything running as it was, ACL
//! included, and says which file. With `tls.crl_path`, a revoked client
//! certificate fails the handshake, and a reloaded CRL closes the open
//! connections of the certificates it newly revokes, idle ones included.
//! The real binary does it on `SIGHUP`.

mod common;

use std::path::{Path, PathBuf};

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use ciphermq_testkit::ca::{serial_of, TestCa};
use common::ca::tls_dir;
use common::process::BrokerProcess;
use common::*;

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

/// Writes the config of a broker whose `[tls]` files are in `tls` (and,
/// with `crl`, whose CRL is `tls/ca.crl`), with `extra` sections; returns
/// its path (in `tls` too).
fn write_config(tls: &Path, data: &Path, shards: usize, extra: &str, crl: bool) -> PathBuf {
    let mut text = config_text(tls, data, shards, extra);
    if crl {
        let ca_line = format!("ca_cert_path = \"{}/ca.crt\"\n", tls.display());
        let with_crl = format!("{ca_line}crl_path = \"{}/ca.crl\"\n", tls.display());
        text = text.replace(&ca_line, &with_crl);
    }
    let path = tls.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// The DER of the server certificate a connection was served with.
fn served_certificate(conn: &Connection) -> Vec<u8> {
    let (_, session) = conn.tls().get_ref();
    session.peer_certificates().expect("server certificate")[0].to_vec()
}

/// The DER of the first certificate in a PEM file.
fn der_of(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(path)
        .expect("PEM certificate")
        .to_vec()
}

/// The server certificate the admin endpoint presents to a new connection.
async fn admin_certificate(addr: std::net::SocketAddr) -> Vec<u8> {
    let connector = TlsClientOptions::for_cn(&pki().certs, "admin")
        .connector()
        .expect("client TLS config");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(TIMEOUT, connector.connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("handshake");
    tls.get_ref().1.peer_certificates().expect("certificate")[0].to_vec()
}

/// Connecting as `cn` fails at the TLS level (no greeting, no refusal line).
async fn assert_handshake_fails(broker: &TestBroker, cn: &str) {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    let result = tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &opts))
        .await
        .expect("an answer in time");
    match result {
        Ok(c) => panic!("{cn}: connected and greeted as {:?}", c.hello()),
        Err(ClientError::Refused(line)) => {
            panic!("{cn}: the handshake succeeded and the broker sent {line:?}")
        }
        Err(ClientError::Tls(_) | ClientError::Io(_) | ClientError::Closed) => {}
        Err(other) => panic!("{cn}: unexpected error {other}"),
    }
}

/// The value of a sample line `name{labels} value` in a metrics text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_server_certificate_serves_new_handshakes_and_open_ones_go_on() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let config = write_config(tls.path(), data.path(), 2, ADMIN, false);
    let broker = TestBroker::start_from_file(&config, 2);
    let admin = broker.admin_addr().expect("admin endpoint");
    let reload = broker.handle().file_reloader();

    let original = der_of(&pki().certs.join("server.crt"));
    let mut before = connect_as(&broker, "sender_1").await;
    assert_eq!(served_certificate(&before), original);
    assert_eq!(admin_certificate(admin).await, original);

    // A new pair (new key, serial and lifetime) in place of the old files.
    let fresh = ca.server(tls.path(), "server", 30);
    reload().expect("the new certificate loads");

    for cn in ["sender_2", "receiver_1", "admin"] {
        let mut after = connect_as(&broker, cn).await;
        assert_eq!(served_certificate(&after), fresh.der, "{cn}");
        check(&mut after, "heartbeat", "OK heartbeat").await;
    }
    assert_eq!(admin_certificate(admin).await, fresh.der, "admin endpoint");
    // Opened before the reload: same session, still served.
    check(&mut before, "heartbeat", "OK heartbeat").await;
    assert_eq!(served_certificate(&before), original);

    // The expiry exported is the new certificate's (30 days, not 825).
    let reply = common::admin_http::request(admin, Some("admin"), "GET", "/metrics")
        .await
        .expect("metrics");
    let left = sample(
        &reply.body,
        "ciphermq_tls_certificate_expiry_seconds{certificate=\"server\"}",
    )
    .expect("server certificate expiry exported");
    let days = left / 86_400.0;
    assert!((29.0..=30.0).contains(&days), "{days} days left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_makes_the_broker_process_serve_its_new_certificate() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let config = write_config(tls.path(), data.path(), 1, "", false);
    let broker = BrokerProcess::start(&config);
    let mut before = broker.connect("sender_1").await;

    let fresh = ca.server(tls.path(), "server", 30);
    let sent = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(broker.pid().to_string())
        .status()
        .expect("kill -HUP");
    assert!(sent.success());
    // The reload runs on the signal thread: new handshakes get the new
    // certificate soon after.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let mut after = broker.connect("sender_2").await;
        if served_certificate(&after) == fresh.der {
            check(&mut after, "heartbeat", "OK heartbeat").await;
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still the old certificate {TIMEOUT:?} after SIGHUP"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    check(&mut before, "heartbeat", "OK heartbeat").await;
    assert!(broker.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_an_unusable_tls_file_changes_nothing_and_names_the_file() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let config = write_config(tls.path(), data.path(), 1, ADMIN, false);
    let broker = TestBroker::start_from_file(&config, 1);
    let reload = broker.handle().file_reloader();
    let original = der_of(&pki().certs.join("server.crt"));
    let mut open = connect_as(&broker, "sender_1").await;

    // The same reload also drops sender_1 from the ACL: refused with the
    // rest, all or nothing.
    let text = std::fs::read_to_string(&config).expect("config");
    let without_sender_1 = text.replace("sender_cns = [\"sender_1\", ", "sender_cns = [");
    assert_ne!(without_sender_1, text);
    std::fs::write(&config, &without_sender_1).expect("config");

    let key = tls.path().join("server.key");
    let good_key = std::fs::read(&key).expect("key");
    let other = ca.server(tls.path(), "other", 30);
    let cases: [(&str, PathBuf, Vec<u8>); 4] = [
        ("tls.key_path", key.clone(), b"not a key\n".to_vec()),
        // A valid key, of another certificate.
        (
            "tls.key_path",
            key.clone(),
            std::fs::read(&other.key).expect("other key"),
        ),
        (
            "tls.cert_path",
            tls.path().join("server.crt"),
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
        ),
        (
            "tls.ca_cert_path",
            tls.path().join("ca.crt"),
            b"no certificate here\n".to_vec(),
        ),
    ];
    for (what, file, bad) in cases {
        let good = std::fs::read(&file).expect("file");
        std::fs::write(&file, &bad).expect("write bad file");
        let error = reload()
            .expect_err("an unusable file is refused")
            .to_string();
        // POST /api/reload is the same path, and says the same.
        let admin = broker.admin_addr().expect("admin endpoint");
        let reply = common::admin_http::request(admin, Some("admin"), "POST", "/api/reload")
            .await
            .expect("an answer");
        assert_eq!(reply.status, 422, "{}", reply.body);
        assert!(reply.body.contains(what), "{}", reply.body);
        for part in [
            what,
            &file.display().to_string(),
            "keeping the running ACL, rate limits and TLS configuration",
        ] {
            assert!(error.contains(part), "{what}: {part:?} not in {error:?}");
        }
        std::fs::write(&file, good).expect("restore");

        // Nothing changed: the same certificate, the same ACL.
        let mut again = connect_as(&broker, "sender_1").await;
        assert_eq!(served_certificate(&again), original, "{what}");
        check(&mut again, "heartbeat", "OK heartbeat").await;
        check(&mut open, "heartbeat", "OK heartbeat").await;
    }
    assert_eq!(std::fs::read(&key).expect("key"), good_key);

    // With every file usable again, the same reload applies, ACL included.
    reload().expect("a good reload");
    assert_closed(&mut open).await;
    let refused = Connection::connect(
        &broker.addr,
        &TlsClientOptions::for_cn(&pki().certs, "sender_1"),
    )
    .await
    .expect_err("sender_1 lost its role");
    assert!(
        matches!(&refused, ClientError::Refused(line) if line.contains("unknown client")),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_crl_closes_revoked_sessions_and_refuses_their_handshakes() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let crl = tls.path().join("ca.crl");
    std::fs::write(&crl, ca.crl(&[], 7, true)).expect("empty CRL");
    let config = write_config(tls.path(), data.path(), 2, "", true);
    let broker = TestBroker::start_from_file(&config, 2);
    let reload = broker.handle().file_reloader();

    // Idle connections on both shards, one of them busy with a consumer.
    let mut kept = connect_as(&broker, "sender_1").await;
    let mut kept_receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut kept_receiver, "receiver_1").await;
    let mut revoked = connect_as(&broker, "sender_2").await;
    let mut revoked_receiver = connect_as(&broker, "receiver_2").await;
    check(
        &mut revoked_receiver,
        "declare_queue receiver_2_queue",
        "OK declare_queue receiver_2_queue",
    )
    .await;

    let serials = [
        serial_of(&pki().certs.join("sender_2.crt")),
        serial_of(&pki().certs.join("receiver_2.crt")),
    ];
    let serials: Vec<&[u8]> = serials.iter().map(Vec::as_slice).collect();
    std::fs::write(&crl, ca.crl(&serials, 7, true)).expect("CRL");
    reload().expect("the CRL loads");

    // Closed without a command from them: woken by the reload.
    assert_closed(&mut revoked).await;
    assert_closed(&mut revoked_receiver).await;
    // Refused at the handshake from now on.
    assert_handshake_fails(&broker, "sender_2").await;
    assert_handshake_fails(&broker, "receiver_2").await;
    // The others stay, and still work together.
    check(&mut kept, "heartbeat", "OK heartbeat").await;
    check(
        &mut kept,
        &format!("publish ex receiver_1 {}", body("m1", "receiver_1")),
        "ACK m1",
    )
    .await;
    let got = fetch(&mut kept_receiver, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["m1"]);
    let mut again = connect_as(&broker, "sender_1").await;
    check(&mut again, "heartbeat", "OK heartbeat").await;

    // The same CRL again closes nothing more.
    reload().expect("the same CRL");
    check(&mut kept, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_past_its_next_update_still_revokes_and_a_foreign_crl_is_refused() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let crl = tls.path().join("ca.crl");
    // DER this time, and due for renewal yesterday.
    let sender_3 = serial_of(&pki().certs.join("sender_3.crt"));
    std::fs::write(&crl, ca.crl(&[&sender_3], -1, false)).expect("CRL");
    let config = write_config(tls.path(), data.path(), 1, ADMIN, true);
    let broker = TestBroker::start_from_file(&config, 1);
    let reload = broker.handle().file_reloader();

    assert_handshake_fails(&broker, "sender_3").await;
    let mut kept = connect_as(&broker, "sender_1").await;
    // Overdue, and said so.
    let reply = common::admin_http::request(
        broker.admin_addr().expect("admin"),
        Some("admin"),
        "GET",
        "/metrics",
    )
    .await
    .expect("metrics");
    let due = sample(&reply.body, "ciphermq_tls_crl_next_update_seconds")
        .expect("CRL next update exported");
    assert!(due < 0.0, "{due}");

    // A CRL of another CA, one signed by an impostor with our CA's name,
    // garbage, or no CRL at all: refused, naming the file; the running CRL
    // stays.
    let impostor = TestCa::load_from(&pki().rogue_certs);
    let other = TestCa::generate("Other CA");
    for (bad, why) in [
        (other.crl(&[], 7, true), "not a CA of tls.ca_cert_path"),
        (impostor.crl(&[], 7, true), "its signature does not verify"),
        (b"garbage".to_vec(), "cannot be parsed"),
        (
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
            "no PEM X509 CRL",
        ),
    ] {
        let good = std::fs::read(&crl).expect("CRL");
        std::fs::write(&crl, &bad).expect("bad CRL");
        let error = reload().expect_err("refused").to_string();
        for part in ["tls.crl_path", &crl.display().to_string(), why] {
            assert!(error.contains(part), "{part:?} not in {error:?}");
        }
        std::fs::write(&crl, good).expect("restore");
        assert_handshake_fails(&broker, "sender_3").await;
        check(&mut kept, "heartbeat", "OK heartbeat").await;
    }

    // Taking the revocation back lets sender_3 in again.
    std::fs::write(&crl, ca.crl(&[], 7, true)).expect("CRL");
    reload().expect("a fresh CRL");
    let mut back = connect_as(&broker, "sender_3").await;
    check(&mut back, "heartbeat", "OK heartbeat").await;
}
