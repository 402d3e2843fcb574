//! docs/ARCHITECTURE.md "Identity and access", docs/PROTOCOL.md "Greeting":
//! mutual TLS decides who a client is. A certificate from another CA or no
//! certificate fails the handshake; a valid certificate whose CN has no role is
//! refused with one line; every role is greeted with
//! `HELLO ciphermq/1 <cn> <role>`, on every shard.

mod common;

use std::io;
use std::sync::Arc;

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

const REFUSAL: &str = "Access denied: unknown client (role=unknown)";

/// Builds a value of the connector type `TlsClientOptions::connector` returns
/// (tokio-rustls' `TlsConnector`) from our own rustls configuration.
fn connector_like<T: From<Arc<ClientConfig>>>(
    _like: fn(&TlsClientOptions) -> Result<T, ClientError>,
    config: ClientConfig,
) -> T {
    T::from(Arc::new(config))
}

fn roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki().certs.join("ca.crt")).expect("ca.crt") {
        roots.add(cert.expect("CA certificate")).expect("add CA");
    }
    roots
}

fn versions(tls12_only: bool) -> Vec<&'static rustls::SupportedProtocolVersion> {
    if tls12_only {
        vec![&rustls::version::TLS12]
    } else {
        vec![&rustls::version::TLS13]
    }
}

/// Trusts the broker's CA but presents no client certificate.
fn no_client_cert_config(tls12_only: bool) -> ClientConfig {
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&versions(tls12_only))
        .expect("protocol versions")
        .with_root_certificates(roots())
        .with_no_client_auth()
}

/// A correct client identity for `cn`, restricted to one protocol version.
fn client_config(cn: &str, tls12_only: bool) -> ClientConfig {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki().certs.join(format!("{cn}.crt")))
            .expect("cert file")
            .collect::<Result<_, _>>()
            .expect("certs");
    let key = PrivateKeyDer::from_pem_file(pki().certs.join(format!("{cn}.key"))).expect("key");
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&versions(tls12_only))
        .expect("protocol versions")
        .with_root_certificates(roots())
        .with_client_auth_cert(certs, key)
        .expect("client auth")
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost".to_owned()).expect("server name")
}

/// A certificate for `sender_1` issued by an unrelated CA (we still trust the
/// broker's real CA, so only the client side is wrong).
fn rogue_sender() -> TlsClientOptions {
    let rogue = &pki().rogue_certs;
    TlsClientOptions {
        ca_cert: pki().certs.join("ca.crt"),
        cert: rogue.join("sender_1.crt"),
        key: rogue.join("sender_1.key"),
        server_name: "localhost".to_owned(),
        check_hostname: true,
    }
}

/// Reads until EOF or an error, bounded: the plaintext received and the error.
async fn read_to_end_raw<S: AsyncRead + Unpin>(stream: &mut S) -> (Vec<u8>, Option<io::Error>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let result = tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Some(e),
            }
        }
    })
    .await;
    match result {
        Ok(err) => (got, err),
        Err(_) => panic!(
            "connection neither closed nor failed within {TIMEOUT:?}; got {:?}",
            String::from_utf8_lossy(&got)
        ),
    }
}

/// Reads one `\n`-terminated line of raw plaintext, bounded.
async fn read_raw_line<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let n = stream.read(&mut byte).await.expect("read");
            assert_ne!(n, 0, "EOF after {:?}", String::from_utf8_lossy(&got));
            if byte[0] == b'\n' {
                break;
            }
            got.push(byte[0]);
        }
    })
    .await
    .expect("a line within the timeout");
    String::from_utf8(got).expect("UTF-8 line")
}

/// Asserts that a connection attempt failed at the TLS level, not with a
/// greeting or a refusal line.
fn assert_tls_failure(result: Result<Connection, ClientError>, what: &str) {
    match result {
        Ok(c) => panic!("{what}: connected and greeted as {:?}", c.hello()),
        Err(ClientError::Refused(line)) => {
            panic!("{what}: handshake succeeded and the broker sent {line:?}")
        }
        Err(ClientError::Tls(_) | ClientError::Io(_) | ClientError::Closed) => {}
        Err(other) => panic!("{what}: unexpected error {other}"),
    }
}

/// A live connection still answers.
async fn still_serving(broker: &TestBroker, cn: &str) {
    let mut c = connect_as(broker, cn).await;
    check(&mut c, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_from_another_ca_fails_the_handshake() {
    let broker = TestBroker::start(2);
    let mut before = connect_as(&broker, "sender_2").await;
    let result = tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &rogue_sender()))
        .await
        .expect("rogue connect finishes");
    assert_tls_failure(result, "rogue CA certificate");
    // A raw look: not one byte of plaintext reaches the rogue client.
    if let Ok(Ok(mut raw)) = tokio::time::timeout(
        TIMEOUT,
        Connection::connect_raw(&broker.addr, &rogue_sender()),
    )
    .await
    {
        let (got, _) = read_to_end_raw(&mut raw).await;
        assert!(
            got.is_empty(),
            "rogue client received {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // The broker keeps serving old and new connections.
    check(&mut before, "heartbeat", "OK heartbeat").await;
    still_serving(&broker, "sender_1").await;
    still_serving(&broker, "receiver_2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_without_certificate_fails_the_handshake_tls13() {
    let broker = TestBroker::start(2);
    let connector = connector_like(TlsClientOptions::connector, no_client_cert_config(false));
    let result = tokio::time::timeout(
        TIMEOUT,
        Connection::connect_with(&broker.addr, &connector, localhost()),
    )
    .await
    .expect("connect finishes");
    assert_tls_failure(result, "no client certificate (TLS 1.3)");
    // Raw: the client side of a TLS 1.3 handshake may complete, but reading
    // must end in an error or EOF, never in a greeting.
    let tcp = tokio::net::TcpStream::connect(&broker.addr)
        .await
        .expect("tcp");
    if let Ok(Ok(mut tls)) =
        tokio::time::timeout(TIMEOUT, connector.connect(localhost(), tcp)).await
    {
        let _ = tls.write_all(b"heartbeat\n").await;
        let _ = tls.flush().await;
        let (got, _) = read_to_end_raw(&mut tls).await;
        assert!(
            got.is_empty(),
            "certificate-less client received {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    still_serving(&broker, "sender_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_without_certificate_fails_the_handshake_tls12() {
    let broker = TestBroker::start(1);
    let connector = connector_like(TlsClientOptions::connector, no_client_cert_config(true));
    let tcp = tokio::net::TcpStream::connect(&broker.addr)
        .await
        .expect("tcp");
    let outcome = tokio::time::timeout(TIMEOUT, connector.connect(localhost(), tcp))
        .await
        .expect("handshake finishes");
    if let Ok(mut tls) = outcome {
        // In TLS 1.2 the server's verdict comes before our Finished is accepted;
        // if the client thinks it is done, nothing may follow but an error/EOF.
        let (got, _) = read_to_end_raw(&mut tls).await;
        assert!(
            got.is_empty(),
            "certificate-less TLS 1.2 client received {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    still_serving(&broker, "sender_1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_client_with_valid_certificate_is_greeted() {
    let broker = TestBroker::start(1);
    let connector = connector_like(TlsClientOptions::connector, client_config("sender_1", true));
    let mut c = tokio::time::timeout(
        TIMEOUT,
        Connection::connect_with(&broker.addr, &connector, localhost()),
    )
    .await
    .expect("connect finishes")
    .expect("TLS 1.2 is accepted");
    assert_eq!(
        c.tls().get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(
        (c.hello().client_id.as_str(), c.hello().role.as_str()),
        ("sender_1", "sender")
    );
    check(&mut c, "heartbeat", "OK heartbeat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_cn_is_refused_with_one_line() {
    let broker = TestBroker::start(2);
    let opts = TlsClientOptions::for_cn(&pki().certs, "stranger");
    let result = tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &opts))
        .await
        .expect("connect finishes");
    match result {
        Err(ClientError::Refused(line)) => assert_eq!(line, REFUSAL),
        Ok(c) => panic!("stranger was greeted: {:?}", c.hello()),
        Err(e) => panic!("expected a refusal line, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_cn_gets_the_refusal_then_eof_and_no_command_runs() {
    let broker = TestBroker::start(2);
    let opts = TlsClientOptions::for_cn(&pki().certs, "stranger");
    let mut raw = tokio::time::timeout(TIMEOUT, Connection::connect_raw(&broker.addr, &opts))
        .await
        .expect("handshake finishes")
        .expect("a CA-signed certificate completes the handshake");
    // Commands sent right away are never executed.
    let _ = raw
        .write_all(b"heartbeat\ndeclare_exchange stranger_ex\n")
        .await;
    let _ = raw.flush().await;
    let (got, _err) = read_to_end_raw(&mut raw).await;
    assert_eq!(String::from_utf8_lossy(&got), format!("{REFUSAL}\n"));
    // And the exchange does not exist.
    let mut admin = connect_as(&broker, "admin").await;
    check(
        &mut admin,
        "declare_queue orders",
        "OK declare_queue orders",
    )
    .await;
    check(
        &mut admin,
        "bind orders stranger_ex k",
        "Error: unknown exchange stranger_ex",
    )
    .await;
}

async fn hello_lines(shards: usize) {
    let broker = TestBroker::start(shards);
    for (cn, role) in [
        ("admin", "admin"),
        ("sender_1", "sender"),
        ("sender_2", "sender"),
        ("sender_3", "sender"),
        ("sender_4", "sender"),
        ("receiver_1", "receiver"),
        ("receiver_2", "receiver"),
        ("receiver_1_2", "receiver"),
    ] {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        let mut raw = tokio::time::timeout(TIMEOUT, Connection::connect_raw(&broker.addr, &opts))
            .await
            .expect("handshake finishes")
            .expect("handshake");
        assert_eq!(
            read_raw_line(&mut raw).await,
            format!("HELLO ciphermq/1 {cn} {role}"),
            "greeting of {cn}"
        );
        let c = connect_as(&broker, cn).await;
        assert_eq!(
            (c.hello().client_id.as_str(), c.hello().role.as_str()),
            (cn, role)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_names_client_and_role_one_shard() {
    hello_lines(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_names_client_and_role_two_shards() {
    hello_lines(2).await;
}

/// Commands written immediately after the handshake (before the greeting is
/// read, so they may travel with the connection's hand-off to its shard) are
/// answered after the HELLO, in order.
async fn early_commands(shards: usize) {
    let broker = TestBroker::start(shards);
    for cn in ["sender_1", "sender_2", "receiver_1", "receiver_2"] {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        let mut raw = tokio::time::timeout(TIMEOUT, Connection::connect_raw(&broker.addr, &opts))
            .await
            .expect("handshake finishes")
            .expect("handshake");
        raw.write_all(b"heartbeat\nresend\nheartbeat\n")
            .await
            .expect("write");
        raw.flush().await.expect("flush");
        assert!(read_raw_line(&mut raw)
            .await
            .starts_with(&format!("HELLO ciphermq/1 {cn} ")));
        assert_eq!(read_raw_line(&mut raw).await, "OK heartbeat", "{cn}");
        assert_eq!(read_raw_line(&mut raw).await, "OK resend 0", "{cn}");
        assert_eq!(read_raw_line(&mut raw).await, "OK heartbeat", "{cn}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_sent_with_the_handshake_are_answered_after_hello_one_shard() {
    early_commands(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_sent_with_the_handshake_are_answered_after_hello_two_shards() {
    early_commands(2).await;
}
