//! A client certificate whose subject holds several CN attributes names no
//! client (`tls.identity = "cn"`): which CN counts would be a guess, and a
//! guess an operator's tool may make differently (the first, the last). The
//! broker port refuses it with one `Access denied: …` line naming why, the
//! admin endpoint closes the connection unanswered, and both log the reason.

mod common;

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use ciphermq_testkit::ca::{Issued, TestCa};
use common::ca::tls_dir;
use common::process::BrokerProcess;
use common::*;

const REFUSAL: &str =
    "Access denied: the client certificate has 2 Subject CNs; exactly one is required";

fn options(issued: &Issued) -> TlsClientOptions {
    TlsClientOptions {
        ca_cert: pki().certs.join("ca.crt"),
        cert: issued.cert.clone(),
        key: issued.key.clone(),
        server_name: "localhost".to_owned(),
        check_hostname: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_with_two_cns_is_refused_and_the_reason_logged() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let dir = tls.path();
    // `admin` first: a broker taking the first CN would greet it as admin.
    let two = ca.client_with_two_cns(dir, "two", "admin", "sender_1");
    let one = ca.client(dir, "one", Some("sender_1"), &[]);
    let text = config_text(
        dir,
        data.path(),
        1,
        "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n",
    )
    .replace("console = false", "console = true\nlevel = \"info\"");
    let config = dir.join("config.toml");
    std::fs::write(&config, text).expect("config");
    let broker = BrokerProcess::start(&config);

    let refused = tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &options(&two)))
        .await
        .expect("an answer in time");
    match refused {
        Err(ClientError::Refused(line)) => assert_eq!(line, REFUSAL),
        Ok(c) => panic!("greeted as {:?}", c.hello()),
        Err(other) => panic!("{other}"),
    }
    // The same CA, one CN: served.
    let mut served =
        tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &options(&one)))
            .await
            .expect("an answer in time")
            .expect("one CN is an identity");
    assert_eq!(served.hello().client_id, "sender_1");
    check(&mut served, "heartbeat", "OK heartbeat").await;

    // The admin endpoint answers it nothing.
    let admin = broker
        .admin
        .as_deref()
        .expect("admin endpoint")
        .parse()
        .expect("address");
    let reply = admin_request(admin, &two).await;
    assert!(
        reply.is_empty(),
        "answered: {}",
        String::from_utf8_lossy(&reply)
    );

    // Both refusals are logged with the reason.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let reason = "2 Subject CNs; exactly one is required";
    while !(broker.logged(&["refused: no identity in the client certificate", reason])
        && broker.logged(&[
            "admin endpoint: no identity in the client certificate",
            reason,
        ]))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not logged:\n{}",
            broker.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(broker.stop().success());
}

/// `GET /api/status` on the admin endpoint with `issued`'s certificate:
/// what came back before the endpoint closed.
async fn admin_request(addr: std::net::SocketAddr, issued: &Issued) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = options(issued).connector().expect("client TLS");
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"GET /api/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        tls.flush().await?;
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        Ok::<_, std::io::Error>(raw)
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .expect("an answer or a close in time")
        .unwrap_or_default()
}
