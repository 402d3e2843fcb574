//! `tls.identity = "uri_san"`: a client's identity is its certificate's one
//! URI SubjectAltName with `tls.uri_san_prefix` stripped; its CN is ignored.
//! `HELLO`, the ACL, placement and the admin endpoint all use that
//! identity; a certificate without exactly one URI SAN under the prefix,
//! naming a valid client id, is refused with one `Access denied: …` line.

mod common;

use std::path::Path;

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use ciphermq_testkit::ca::{Issued, TestCa};
use common::ca::tls_dir;
use common::*;
use tokio_rustls::TlsConnector;

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

fn options(issued: &Issued) -> TlsClientOptions {
    TlsClientOptions {
        ca_cert: pki().certs.join("ca.crt"),
        cert: issued.cert.clone(),
        key: issued.key.clone(),
        server_name: "localhost".to_owned(),
        check_hostname: true,
    }
}

async fn connect_with(broker: &TestBroker, issued: &Issued) -> Result<Connection, ClientError> {
    tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &options(issued)))
        .await
        .expect("an answer in time")
}

/// A broker of the test ACL whose identities come from URI SANs.
fn start(tls: &Path, data: &Path) -> TestBroker {
    let text = config_text(tls, data, 2, ADMIN).replace(
        "[tls]\n",
        "[tls]\nidentity = \"uri_san\"\nuri_san_prefix = \"spiffe://ciphermq/\"\n",
    );
    let path = tls.join("config.toml");
    std::fs::write(&path, text).expect("config");
    TestBroker::start_from_file(&path, 2)
}

/// `GET path` on the admin endpoint with `issued`'s certificate: the status,
/// or `None` when the endpoint closed without an answer.
async fn admin_get(addr: std::net::SocketAddr, issued: &Issued, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector: TlsConnector = options(issued).connector().expect("client TLS");
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await?;
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        tls.write_all(head.as_bytes()).await?;
        tls.flush().await?;
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .expect("an answer or a close in time")
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&raw);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uri_san_names_the_client_everywhere() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let dir = tls.path();
    // CNs that the ACL would give other roles, or none: ignored.
    let receiver = ca.client(dir, "r", Some("admin"), &["spiffe://ciphermq/receiver_1"]);
    let sender = ca.client(dir, "s", Some("stranger"), &["spiffe://ciphermq/sender_1"]);
    let admin = ca.client(dir, "a", None, &["spiffe://ciphermq/admin"]);
    let broker = start(dir, data.path());

    let mut r = connect_with(&broker, &receiver).await.expect("receiver");
    assert_eq!(
        (r.hello().client_id.as_str(), r.hello().role.as_str()),
        ("receiver_1", "receiver")
    );
    let mut s = connect_with(&broker, &sender).await.expect("sender");
    assert_eq!(
        (s.hello().client_id.as_str(), s.hello().role.as_str()),
        ("sender_1", "sender")
    );

    // The ACL judges the identity: receiver_1's own resources only.
    setup_receiver(&mut r, "receiver_1").await;
    let denied = ask(&mut r, "declare_queue receiver_2_queue").await;
    assert_denied(&denied, "receiver", "another receiver's queue");
    let denied = ask(&mut s, "declare_queue receiver_1_queue").await;
    assert_denied(&denied, "sender", "a sender declaring");
    // And messages flow between identities, wherever they are placed.
    check(
        &mut s,
        &format!("publish ex receiver_1 {}", body("u-1", "receiver_1")),
        "ACK u-1",
    )
    .await;
    let got = fetch(&mut r, "receiver_1_queue", 10).await;
    assert_eq!(ids(&got), ["u-1"]);

    // The admin endpoint reads the same identity.
    let endpoint = broker.admin_addr().expect("admin endpoint");
    assert_eq!(admin_get(endpoint, &admin, "/api/status").await, Some(200));
    assert_eq!(admin_get(endpoint, &sender, "/api/status").await, Some(403));
    // A certificate whose CN is `admin` but with no URI SAN gets nothing.
    let cn_only = ca.client(dir, "cn_only", Some("admin"), &[]);
    assert_eq!(admin_get(endpoint, &cn_only, "/api/status").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_without_one_usable_uri_san_is_refused_with_the_reason() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let dir = tls.path();
    let broker = start(dir, data.path());
    let cases: [(&str, Option<&str>, &[&str], &str); 5] = [
        (
            "no_uri",
            Some("admin"),
            &[],
            "Access denied: the client certificate has no URI SubjectAltName (tls.identity = uri_san)",
        ),
        (
            "two_uris",
            None,
            &["spiffe://ciphermq/sender_1", "spiffe://ciphermq/sender_2"],
            "Access denied: the client certificate has 2 URI SubjectAltNames; exactly one is required (tls.identity = uri_san)",
        ),
        (
            "foreign",
            None,
            &["spiffe://elsewhere/sender_1"],
            "Access denied: URI SubjectAltName \"spiffe://elsewhere/sender_1\" does not start with \"spiffe://ciphermq/\" (tls.uri_san_prefix)",
        ),
        (
            "nested",
            None,
            &["spiffe://ciphermq/team/sender_1"],
            "Access denied: URI SubjectAltName \"spiffe://ciphermq/team/sender_1\": \"team/sender_1\" after the prefix is not a valid client id ([A-Za-z0-9_.:-]{1,255})",
        ),
        // A valid name the ACL does not list: an unknown client, as with CNs.
        (
            "unlisted",
            None,
            &["spiffe://ciphermq/nobody"],
            "Access denied: unknown client (role=unknown)",
        ),
    ];
    for (stem, cn, uris, line) in cases {
        let issued = ca.client(dir, stem, cn, uris);
        match connect_with(&broker, &issued).await {
            Err(ClientError::Refused(got)) => assert_eq!(got, line, "{stem}"),
            Ok(c) => panic!("{stem}: greeted as {:?}", c.hello()),
            Err(other) => panic!("{stem}: {other}"),
        }
    }
    // The broker still serves proper identities.
    let sender = ca.client(dir, "s", None, &["spiffe://ciphermq/sender_2"]);
    let mut s = connect_with(&broker, &sender).await.expect("sender_2");
    assert_eq!(s.hello().client_id, "sender_2");
    check(&mut s, "heartbeat", "OK heartbeat").await;
}
