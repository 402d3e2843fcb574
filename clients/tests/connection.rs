//! The client side of `ciphermq/1` against a small in-test mTLS echo server.

mod common;

use ciphermq_clients::{ClientError, Connection, TlsClientOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ciphermq_testkit::pki::generate as make_pki;
use common::{start_echo_server, REFUSAL, REFUSED_CN};

#[tokio::test]
async fn connect_reads_hello_and_request_gets_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();

    let tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    let mut conn = Connection::connect(&addr, &tls).await.unwrap();
    assert_eq!(conn.hello().client_id, "sender_1");
    assert_eq!(conn.hello().role, "sender");

    assert_eq!(conn.request("heartbeat").await.unwrap(), "heartbeat");
    let body = r#"publish ex key {"message_id":"m 1","a":"b c"}"#;
    assert_eq!(conn.request(body).await.unwrap(), body);
}

#[tokio::test]
async fn crlf_is_stripped_and_raw_bytes_are_sent_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let mut conn = Connection::connect(&addr, &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"))
        .await
        .unwrap();

    conn.queue_bytes(b"one\r\ntw");
    conn.queue_bytes(b"o\n\n");
    conn.flush().await.unwrap();
    assert_eq!(conn.read_line().await.unwrap().as_deref(), Some("one"));
    assert_eq!(conn.read_line().await.unwrap().as_deref(), Some("two"));
    assert_eq!(conn.read_line().await.unwrap().as_deref(), Some(""));

    conn.queue_bytes(b"\xff\xfe\n");
    conn.flush().await.unwrap();
    assert!(matches!(conn.read_line().await, Err(ClientError::NotUtf8)));
    // The bad line was consumed; the connection goes on.
    assert_eq!(conn.request("after").await.unwrap(), "after");
}

#[tokio::test]
async fn pipelined_lines_queue_until_flush_and_replies_keep_order() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let mut conn = Connection::connect(&addr, &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"))
        .await
        .unwrap();

    // Small enough to sit in socket buffers without a concurrent reader.
    for i in 0..500 {
        conn.queue_line(&format!("heartbeat {i}"));
    }
    conn.flush().await.unwrap();
    for i in 0..500 {
        assert_eq!(
            conn.read_line().await.unwrap().unwrap(),
            format!("heartbeat {i}")
        );
    }
}

#[tokio::test]
async fn split_connection_pipelines_ten_thousand_lines() {
    const LINES: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let mut conn = Connection::connect(&addr, &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"))
        .await
        .unwrap();
    // Queued before the split: must carry over to the writer.
    conn.queue_line("first");
    let (mut reader, mut writer) = conn.into_split();
    assert_eq!(reader.hello().client_id, "sender_1");

    let body = "x".repeat(100);
    let expected_body = body.clone();
    let writing = tokio::spawn(async move {
        for i in 0..LINES {
            writer.queue_line(&format!("publish ex key {i} {body}"));
            if i % 1000 == 999 {
                writer.flush().await.unwrap();
            }
        }
        writer.queue_line("quit");
        writer.flush().await.unwrap();
        writer
    });

    assert_eq!(reader.read_line().await.unwrap().unwrap(), "first");
    for i in 0..LINES {
        let line = reader.read_line().await.unwrap().unwrap();
        assert_eq!(line, format!("publish ex key {i} {expected_body}"));
    }
    assert_eq!(reader.read_line().await.unwrap().as_deref(), Some("OK bye"));
    assert_eq!(
        reader.read_line().await.unwrap(),
        None,
        "clean end of stream"
    );
    writing.await.unwrap();
}

#[tokio::test]
async fn lines_longer_than_the_read_buffer_arrive_whole() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let conn = Connection::connect(&addr, &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"))
        .await
        .unwrap();
    let (mut reader, mut writer) = conn.into_split();

    let long: String = (0..3 * 1024 * 1024)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let sent = long.clone();
    let writing = tokio::spawn(async move {
        writer.queue_line(&sent);
        writer.queue_line("short");
        writer.flush().await.unwrap();
    });
    let got = reader.read_line().await.unwrap().unwrap();
    assert_eq!(got.len(), long.len());
    assert!(got == long);
    assert_eq!(reader.read_line().await.unwrap().as_deref(), Some("short"));
    writing.await.unwrap();
}

#[tokio::test]
async fn quit_then_clean_close_reads_as_none_and_request_as_closed() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let mut conn = Connection::connect(&addr, &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"))
        .await
        .unwrap();
    assert_eq!(conn.request("quit").await.unwrap(), "OK bye");
    assert_eq!(conn.read_line().await.unwrap(), None);
    // The server is gone: either the write or the read notices.
    assert!(conn.request("heartbeat").await.is_err());
}

#[tokio::test]
async fn check_hostname_false_skips_only_the_name_check() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();

    let mut tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    tls.server_name = "broker.elsewhere.example".into();
    let err = Connection::connect(&addr, &tls).await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{err:?}"
    );

    tls.check_hostname = false;
    let mut conn = Connection::connect(&addr, &tls).await.unwrap();
    assert_eq!(conn.request("heartbeat").await.unwrap(), "heartbeat");

    // Still no trust in a certificate from another CA.
    let other = tempfile::tempdir().unwrap();
    let other_opts = make_pki(other.path(), &["sender_1"]);
    let mut foreign = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    foreign.ca_cert = other_opts.out_dir.join("ca.crt");
    foreign.check_hostname = false;
    let err = Connection::connect(&addr, &foreign).await.unwrap_err();
    assert!(
        matches!(
            err,
            // Same CA name, other key: webpki finds the anchor by name and the
            // signature fails; an unrelated CA is an unknown issuer.
            ClientError::Tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadSignature | rustls::CertificateError::UnknownIssuer
            ))
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn ip_server_name_matches_the_ip_san() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let mut tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    tls.server_name = "127.0.0.1".into();
    let conn = Connection::connect(&addr, &tls).await.unwrap();
    assert_eq!(conn.hello().client_id, "sender_1");
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_rejected_by_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();

    let other = tempfile::tempdir().unwrap();
    let other_opts = make_pki(other.path(), &["sender_1"]);
    let mut tls = TlsClientOptions::for_cn(&other_opts.out_dir, "sender_1");
    tls.ca_cert = opts.out_dir.join("ca.crt");
    let err = Connection::connect(&addr, &tls).await.unwrap_err();
    // TLS 1.3: the server's alert arrives when the client first reads.
    assert!(
        matches!(
            err,
            ClientError::Tls(_) | ClientError::Io(_) | ClientError::Closed
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_first_line_other_than_hello_is_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1", REFUSED_CN]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let tls = TlsClientOptions::for_cn(&opts.out_dir, REFUSED_CN);
    match Connection::connect(&addr, &tls).await {
        Err(ClientError::Refused(line)) => assert_eq!(line, REFUSAL),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // connect_raw stops after the handshake: the bytes on the wire are visible.
    let mut raw = Connection::connect_raw(&addr, &tls).await.unwrap();
    let mut bytes = Vec::new();
    raw.read_to_end(&mut bytes).await.unwrap();
    assert_eq!(bytes, format!("{REFUSAL}\n").into_bytes());
}

#[tokio::test]
async fn one_connector_serves_many_connections() {
    let dir = tempfile::tempdir().unwrap();
    let opts = make_pki(dir.path(), &["sender_1"]);
    let addr = start_echo_server(&opts.out_dir).await.to_string();
    let tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    let connector = tls.connector().unwrap();
    let name = tls.server_name().unwrap();
    let mut conns = Vec::new();
    for _ in 0..20 {
        conns.push(
            Connection::connect_with(&addr, &connector, name.clone())
                .await
                .unwrap(),
        );
    }
    for (i, conn) in conns.iter_mut().enumerate() {
        assert_eq!(
            conn.request(&format!("n {i}")).await.unwrap(),
            format!("n {i}")
        );
    }
    let mut raw = Connection::connect_raw(&addr, &tls).await.unwrap();
    raw.write_all(b"quit\n").await.unwrap();
    let mut bytes = Vec::new();
    raw.read_to_end(&mut bytes).await.unwrap();
    assert_eq!(bytes, b"HELLO ciphermq/1 sender_1 sender\nOK bye\n");
}

#[tokio::test]
async fn missing_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsClientOptions::for_cn(dir.path(), "nobody");
    let err = connector_err(&tls);
    let msg = err.to_string();
    assert!(msg.contains("ca.crt"), "{msg}");
    assert!(matches!(
        err,
        ClientError::Pem {
            what: "CA certificate",
            ..
        }
    ));

    let opts = make_pki(dir.path(), &["sender_1"]);
    let mut tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    tls.key = opts.out_dir.join("sender_1.crt");
    let err = connector_err(&tls);
    assert!(
        matches!(
            err,
            ClientError::Pem {
                what: "private key",
                ..
            }
        ),
        "{err:?}"
    );

    let mut tls = TlsClientOptions::for_cn(&opts.out_dir, "sender_1");
    tls.key = opts.out_dir.join("server.key");
    assert!(matches!(connector_err(&tls), ClientError::Config(_)));

    tls.server_name = "not a name".into();
    assert!(matches!(
        tls.server_name(),
        Err(ClientError::InvalidServerName(_))
    ));

    let err = Connection::connect(
        "127.0.0.1:1",
        &TlsClientOptions::for_cn(&opts.out_dir, "sender_1"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
}

fn connector_err(tls: &TlsClientOptions) -> ClientError {
    match tls.connector() {
        Ok(_) => panic!("expected {tls:?} to fail"),
        Err(e) => e,
    }
}

#[test]
fn hello_parsing_is_strict() {
    use ciphermq_clients::Hello;
    let hello = Hello::parse("HELLO ciphermq/1 receiver_1 receiver").unwrap();
    assert_eq!(hello.client_id, "receiver_1");
    assert_eq!(hello.role, "receiver");
    for bad in [
        "HELLO ciphermq/2 a sender",
        "HELLO ciphermq/1 a",
        "HELLO ciphermq/1 a sender extra",
        "HELLO ciphermq/1  sender",
        "Error: connection limit reached",
        "",
    ] {
        assert_eq!(Hello::parse(bad), None, "{bad:?}");
    }
}
