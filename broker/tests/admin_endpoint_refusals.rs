//! The admin endpoint judges every request, not only the handshake: on a
//! kept-alive HTTP/1.1 connection, a certificate a reloaded CRL revokes is
//! refused at its next request and the connection closed, and a CN that a
//! reload took out of `acl.monitor_cns` is refused at its next request. A
//! request that changes the broker (`POST /api/reload`) is refused when it
//! may come from another web site: without `X-CipherMQ-Request: 1`, or
//! with an `Origin` or `Sec-Fetch-Site` naming another site.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use ciphermq_testkit::ca::{serial_of, TestCa};
use common::ca::tls_dir;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

/// Writes the config of a broker whose `[tls]` files are in `tls`, its CRL
/// `tls/ca.crl` (when `crl`), its admin endpoint on; returns its path.
fn write_config(tls: &Path, data: &Path, crl: bool) -> PathBuf {
    let mut text = config_text(tls, data, 1, ADMIN);
    if crl {
        let ca_line = format!("ca_cert_path = \"{}/ca.crt\"\n", tls.display());
        let with_crl = format!("{ca_line}crl_path = \"{}/ca.crl\"\n", tls.display());
        text = text.replace(&ca_line, &with_crl);
    }
    let path = tls.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// One response read off a kept-alive connection.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 connection to the admin endpoint, kept alive across
/// requests, with a client certificate.
struct KeptAlive {
    tls: TlsStream<TcpStream>,
    /// Bytes read past the last response.
    buf: Vec<u8>,
}

impl KeptAlive {
    async fn open(addr: SocketAddr, cn: &str) -> KeptAlive {
        let connector = TlsClientOptions::for_cn(&pki().certs, cn)
            .connector()
            .expect("client TLS config");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let tls = tokio::time::timeout(TIMEOUT, async {
            let tcp = TcpStream::connect(addr).await?;
            connector.connect(name, tcp).await
        })
        .await
        .expect("handshake in time")
        .expect("handshake");
        KeptAlive {
            tls,
            buf: Vec::new(),
        }
    }

    /// Sends `method path` with `headers` (besides `Host: localhost`), and
    /// reads its response (`Content-Length` framed, as the endpoint sends).
    async fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        tokio::time::timeout(TIMEOUT, async {
            self.tls.write_all(head.as_bytes()).await?;
            self.tls.flush().await?;
            self.read_response().await
        })
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    async fn read_response(&mut self) -> std::io::Result<Reply> {
        let head_end = loop {
            if let Some(at) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.strip_prefix("HTTP/1.1 "))
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line in {head:?}")))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no Content-Length in {head:?}")))?;
        let body_start = head_end + 4;
        while self.buf.len() < body_start + len {
            self.fill().await?;
        }
        let body = String::from_utf8_lossy(&self.buf[body_start..body_start + len]).into_owned();
        self.buf.drain(..body_start + len);
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Reads more bytes; the end of the stream is an error here.
    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        match self.tls.read(&mut chunk).await? {
            0 => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the endpoint closed the connection",
            )),
            n => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }

    /// Asserts the endpoint closes the connection with nothing more sent.
    async fn assert_closed(&mut self) {
        let mut rest = Vec::new();
        // The end of the stream, or an error for a close without
        // close_notify: closed either way.
        let read = tokio::time::timeout(TIMEOUT, self.tls.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "still open {TIMEOUT:?} after the refusal");
        assert!(
            rest.is_empty(),
            "sent more: {:?}",
            String::from_utf8_lossy(&rest)
        );
    }
}

/// Connecting as `cn` to the broker port fails at the TLS level.
async fn assert_handshake_fails(broker: &TestBroker, cn: &str) {
    let opts = TlsClientOptions::for_cn(&pki().certs, cn);
    match tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &opts))
        .await
        .expect("an answer in time")
    {
        Ok(c) => panic!("{cn}: connected and greeted as {:?}", c.hello()),
        Err(ClientError::Tls(_) | ClientError::Io(_) | ClientError::Closed) => {}
        Err(other) => panic!("{cn}: unexpected error {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_of_a_revoked_certificate_is_refused_at_its_next_request() {
    let ca = TestCa::load_from(&pki().certs);
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let crl = tls.path().join("ca.crl");
    std::fs::write(&crl, ca.crl(&[], 7, true)).expect("empty CRL");
    let config = write_config(tls.path(), data.path(), true);
    let broker = TestBroker::start_from_file(&config, 1);
    let addr = broker.admin_addr().expect("admin endpoint");
    let reload = broker.handle().file_reloader();

    let mut revoked = KeptAlive::open(addr, "admin").await;
    let mut kept = KeptAlive::open(addr, "monitor_1").await;
    for conn in [&mut revoked, &mut kept] {
        for _ in 0..2 {
            let reply = conn.request("GET", "/api/status", &[]).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
    }

    let serial = serial_of(&pki().certs.join("admin.crt"));
    std::fs::write(&crl, ca.crl(&[&serial], 7, true)).expect("CRL");
    reload().expect("the CRL loads");

    // Same connection, next request: refused, and the connection closes.
    let reply = revoked.request("GET", "/api/status", &[]).await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(
        reply.body.contains("forbidden")
            && reply.body.contains("revoked by tls.crl_path")
            && reply.body.contains("closing the connection"),
        "{}",
        reply.body
    );
    assert_eq!(reply.header("connection"), Some("close"));
    revoked.assert_closed().await;
    // A new connection fails its handshake, on both ports.
    assert!(
        common::admin_http::request(addr, Some("admin"), "GET", "/api/status")
            .await
            .is_err(),
        "a revoked certificate completed a handshake with the admin endpoint"
    );
    assert_handshake_fails(&broker, "admin").await;
    // Another certificate's kept-alive connection goes on.
    let reply = kept.request("GET", "/api/status", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cn_that_lost_its_role_is_refused_at_its_next_request() {
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let config = write_config(tls.path(), data.path(), false);
    let broker = TestBroker::start_from_file(&config, 1);
    let addr = broker.admin_addr().expect("admin endpoint");
    let reload = broker.handle().file_reloader();

    let mut monitor = KeptAlive::open(addr, "monitor_1").await;
    let reply = monitor.request("GET", "/metrics", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    let text = std::fs::read_to_string(&config).expect("config");
    let without = text.replace(r#"monitor_cns = ["monitor_1"]"#, "monitor_cns = []");
    assert_ne!(without, text);
    std::fs::write(&config, without).expect("config");
    reload().expect("reloaded");

    let reply = monitor.request("GET", "/metrics", &[]).await;
    assert_eq!(reply.status, 403, "{}", reply.body);
    assert!(reply.body.contains("forbidden"), "{}", reply.body);
    // What any certificate the CA signed may read, it still may.
    let reply = monitor.request("GET", "/health", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_may_come_from_another_site_is_refused_and_changes_nothing() {
    let tls = tls_dir();
    let data = tempfile::tempdir().expect("tempdir");
    let config = write_config(tls.path(), data.path(), false);
    let broker = TestBroker::start_from_file(&config, 1);
    let addr = broker.admin_addr().expect("admin endpoint");

    // The file now lets `stranger` in as a sender; only a reload applies it.
    let text = std::fs::read_to_string(&config).expect("config");
    let widened = text.replace(
        r#"sender_cns = ["sender_1""#,
        r#"sender_cns = ["stranger", "sender_1""#,
    );
    assert_ne!(widened, text);
    std::fs::write(&config, widened).expect("config");
    let stranger_refused = || async {
        let opts = TlsClientOptions::for_cn(&pki().certs, "stranger");
        match Connection::connect(&broker.addr, &opts).await {
            Err(ClientError::Refused(line)) => assert!(line.contains("unknown client"), "{line}"),
            other => panic!("stranger: {other:?}"),
        }
    };

    let mut admin = KeptAlive::open(addr, "admin").await;
    let header = ("X-CipherMQ-Request", "1");
    let refused: [(&[(&str, &str)], &str); 5] = [
        // A form posted from another site carries no header of its own.
        (&[], "X-CipherMQ-Request: 1"),
        (
            &[
                ("Origin", "https://evil.example"),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            "Sec-Fetch-Site: cross-site",
        ),
        (
            &[header, ("Origin", "https://evil.example")],
            "Origin: https://evil.example",
        ),
        (&[header, ("Sec-Fetch-Site", "same-site")], "Sec-Fetch-Site"),
        (&[("X-CipherMQ-Request", "yes")], "X-CipherMQ-Request: 1"),
    ];
    for (headers, why) in refused {
        let reply = admin.request("POST", "/api/reload", headers).await;
        assert_eq!(reply.status, 403, "{headers:?}: {}", reply.body);
        assert!(
            reply.body.contains("forbidden") && reply.body.contains(why),
            "{headers:?}: {}",
            reply.body
        );
    }
    // A preflight is never approved.
    let reply = admin
        .request(
            "OPTIONS",
            "/api/reload",
            &[
                ("Origin", "https://evil.example"),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "x-ciphermq-request"),
            ],
        )
        .await;
    assert_eq!(reply.status, 405, "{}", reply.body);
    assert!(
        reply.header("access-control-allow-origin").is_none(),
        "{reply:?}"
    );
    stranger_refused().await;

    // With the header (and from the endpoint's own origin, as a browser on
    // its own page would say): reloaded.
    for headers in [
        &[header][..],
        &[
            header,
            ("Origin", "https://localhost"),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    ] {
        let reply = admin.request("POST", "/api/reload", headers).await;
        assert_eq!(reply.status, 200, "{headers:?}: {}", reply.body);
        assert!(reply.body.contains("reloaded"), "{}", reply.body);
    }
    let mut stranger = connect_as(&broker, "stranger").await;
    check(&mut stranger, "heartbeat", "OK heartbeat").await;
}
