//! `sslmode` does what it says: every mode against the local server (TLS
//! on, certificate from scripts/pg-tls.sh) gives the session it promises as
//! the server sees it (`pg_stat_ssl`); a certificate the configured CA did
//! not sign, or one for another name, fails start at once with a message
//! naming the server and the CA file; and against a fake server that
//! refuses TLS, `prefer` sends its startup message in plaintext while
//! `require` sends nothing. A certificate refused on a reconnect while
//! running is logged at error level and is the link's reason in the status.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ciphermq_keystore::register_and_wait;
use ciphermq_pgbridge::{BridgeError, PgBridge, PgConfig, SslMode};
use ciphermq_shard::log::MirrorWatermarks;
use common::{server_ca, tls_from_env, wait_until, LogWriter, TestDb, PATIENCE};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const AES: [u8; 32] = [9u8; 32];

/// Error-level log lines of every test in this binary. Installed before any
/// [`TestDb`] (whose own subscriber then stands aside), because the bridge
/// logs from its own thread.
fn error_log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::ERROR)
            .with_ansi(false)
            .with_writer(move || LogWriterTo(writer.clone()))
            .try_init();
        buffer
    })
}

/// A database of its own, with [`error_log`] capturing.
fn test_db() -> TestDb {
    error_log();
    TestDb::new()
}

/// Appends what the subscriber writes to a shared buffer.
struct LogWriterTo(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriterTo {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether each of the bridge's sessions on `db` is TLS, as the server
/// sees it.
fn bridge_sessions(db: &TestDb) -> Vec<bool> {
    db.query(
        "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = current_database() AND a.application_name = 'ciphermq-pgbridge'
         ORDER BY a.pid",
        &[],
    )
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A CA of our own (not the server's) and its key.
fn other_ca() -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "not the PostgreSQL server's CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, key)
}

fn write_pem(dir: &Path, cert: &rcgen::Certificate) -> PathBuf {
    let path = dir.join("pg-ca.crt");
    std::fs::write(&path, cert.pem()).unwrap();
    path
}

#[test]
fn verify_full_with_the_servers_ca_mirrors_and_registers_over_tls() {
    let db = test_db();
    let data = tempfile::tempdir().unwrap();
    let marks = Arc::new(MirrorWatermarks::new());
    let mut w = LogWriter::new(data.path(), "q");
    for seq in 0..10 {
        w.message(seq);
    }
    w.flush();
    let config = PgConfig {
        sslmode: SslMode::VerifyFull,
        ca_cert_path: Some(server_ca()),
        ..db.config()
    };
    let bridge = PgBridge::start(config, AES, Some((data.path().to_owned(), marks))).unwrap();
    register_and_wait(bridge.key_store().as_ref(), "receiver_1", [3u8; 32]).unwrap();
    wait_until("the rows are mirrored", || {
        db.scalar("SELECT count(*) FROM message_metadata") == 10
    });
    assert_eq!(db.scalar("SELECT count(*) FROM public_keys"), 1);
    wait_until("both links (keys, mirror) are up", || {
        bridge_sessions(&db).len() == 2
    });
    assert_eq!(bridge_sessions(&db), [true, true], "both sessions are TLS");
    let versions = db.query(
        "SELECT s.version FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = current_database() AND a.application_name = 'ciphermq-pgbridge'",
        &[],
    );
    for row in versions {
        let version: String = row.get(0);
        assert!(version == "TLSv1.3" || version == "TLSv1.2", "{version}");
    }
    bridge.shutdown();
}

#[test]
fn each_sslmode_gives_the_session_it_promises() {
    let db = test_db();
    let ca = server_ca();
    for (mode, ca_cert_path, tls) in [
        (SslMode::Disable, None, false),
        (SslMode::Prefer, None, true),
        (SslMode::Require, None, true),
        (SslMode::Require, Some(ca.clone()), true),
        (SslMode::VerifyFull, Some(ca.clone()), true),
    ] {
        let config = PgConfig {
            sslmode: mode,
            ca_cert_path: ca_cert_path.clone(),
            ..db.config()
        };
        let bridge = PgBridge::start(config, AES, None)
            .unwrap_or_else(|e| panic!("{mode} with CA {ca_cert_path:?}: {e}"));
        let client = format!("client_{}", mode.as_str().replace('-', "_"));
        register_and_wait(bridge.key_store().as_ref(), &client, [4u8; 32]).unwrap();
        assert_eq!(
            bridge_sessions(&db),
            [tls],
            "{mode} with CA {ca_cert_path:?}"
        );
        bridge.shutdown();
        wait_until("the bridge's session is gone", || {
            bridge_sessions(&db).is_empty()
        });
    }
}

#[test]
fn the_test_environment_sslmode_is_the_one_used() {
    let db = test_db();
    let (mode, _) = tls_from_env();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    assert_eq!(
        bridge_sessions(&db),
        [mode != SslMode::Disable],
        "CIPHERMQ_TEST_PG_SSLMODE = {mode}"
    );
    bridge.shutdown();
}

#[test]
fn a_certificate_the_configured_ca_did_not_sign_fails_start_at_once_naming_host_and_ca() {
    let db = test_db();
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = other_ca();
    let path = write_pem(dir.path(), &ca);
    for mode in [SslMode::VerifyFull, SslMode::Require] {
        let config = PgConfig {
            sslmode: mode,
            ca_cert_path: Some(path.clone()),
            connect_timeout: PATIENCE,
            ..db.config()
        };
        let started = Instant::now();
        let err = PgBridge::start(config, AES, None).unwrap_err();
        assert!(
            started.elapsed() < PATIENCE,
            "refused without retrying for connect_timeout"
        );
        assert!(matches!(err, BridgeError::Tls { .. }), "{mode}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("PostgreSQL server 127.0.0.1:5432"), "{text}");
        assert!(
            text.contains(&format!(
                "is not signed by database.ca_cert_path = {}",
                path.display()
            )),
            "{text}"
        );
    }
    assert!(bridge_sessions(&db).is_empty());
}

/// What a fake server saw on one connection.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A startup message (protocol 3) from `user`, inside TLS or not.
    Startup { tls: bool, user: String },
    /// The client went away before a startup message.
    NoStartup { tls: bool },
}

/// A listener that answers PostgreSQL's SSLRequest with `S` and a TLS
/// handshake (`tls` given) or `N`, reads the startup message, reports what
/// it saw, and hangs up.
struct FakeServer {
    port: u16,
    seen: mpsc::Receiver<Seen>,
}

impl FakeServer {
    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let (Ok(stream), tx, tls) = (stream, tx.clone(), tls.clone()) else {
                    return;
                };
                std::thread::spawn(move || {
                    if let Some(what) = serve(stream, tls) {
                        let _ = tx.send(what);
                    }
                });
            }
        });
        FakeServer { port, seen }
    }

    /// What the next connection showed.
    fn next(&self) -> Seen {
        self.seen.recv_timeout(PATIENCE).expect("a connection")
    }

    fn config(&self, sslmode: SslMode, ca_cert_path: Option<PathBuf>) -> PgConfig {
        PgConfig {
            port: self.port,
            dbname: "fake".to_owned(),
            sslmode,
            ca_cert_path,
            connect_timeout: Duration::from_secs(1),
            ..PgConfig::default()
        }
    }
}

fn serve(mut stream: TcpStream, tls: Option<Arc<rustls::ServerConfig>>) -> Option<Seen> {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut request = [0u8; 8];
    stream.read_exact(&mut request).ok()?;
    // Length 8, code 80877103: SSLRequest.
    assert_eq!(
        request,
        [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f],
        "an SSLRequest"
    );
    match tls {
        None => {
            stream.write_all(b"N").ok()?;
            Some(read_startup(&mut stream, false))
        }
        Some(config) => {
            stream.write_all(b"S").ok()?;
            let conn = rustls::ServerConnection::new(config).unwrap();
            Some(read_startup(
                &mut rustls::StreamOwned::new(conn, stream),
                true,
            ))
        }
    }
}

fn read_startup(r: &mut impl Read, tls: bool) -> Seen {
    let mut len = [0u8; 4];
    if r.read_exact(&mut len).is_err() {
        return Seen::NoStartup { tls };
    }
    let len = u32::from_be_bytes(len) as usize;
    assert!((8..10_000).contains(&len), "startup length {len}");
    let mut body = vec![0u8; len - 4];
    r.read_exact(&mut body).unwrap();
    let protocol = u32::from_be_bytes(body[..4].try_into().unwrap());
    assert_eq!(protocol >> 16, 3, "protocol 3.x, not another request");
    let fields: Vec<&[u8]> = body[4..].split(|b| *b == 0).collect();
    let user = fields
        .chunks(2)
        .find(|kv| kv[0] == b"user")
        .map(|kv| String::from_utf8_lossy(kv[1]).into_owned())
        .expect("a user parameter");
    Seen::Startup { tls, user }
}

#[test]
fn prefer_sends_its_startup_in_plaintext_when_the_server_refuses_tls() {
    let server = FakeServer::start(None);
    let err = PgBridge::start(server.config(SslMode::Prefer, None), AES, None).unwrap_err();
    assert_eq!(
        server.next(),
        Seen::Startup {
            tls: false,
            user: "postgres".to_owned()
        }
    );
    // The fake hangs up after the startup: an ordinary connection failure.
    assert!(matches!(err, BridgeError::Connect { .. }), "{err:?}");
}

#[test]
fn require_and_verify_full_send_nothing_to_a_server_that_refuses_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = other_ca();
    let path = write_pem(dir.path(), &ca);
    for (mode, ca_cert_path) in [(SslMode::Require, None), (SslMode::VerifyFull, Some(path))] {
        let server = FakeServer::start(None);
        let err = PgBridge::start(server.config(mode, ca_cert_path), AES, None).unwrap_err();
        assert!(matches!(err, BridgeError::Tls { .. }), "{mode}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "PostgreSQL server 127.0.0.1:{} does not accept TLS, and database.sslmode = \"{mode}\" requires it",
                server.port
            )),
            "{text}"
        );
        assert_eq!(server.next(), Seen::NoStartup { tls: false }, "{mode}");
    }
}

/// A fake server whose certificate, signed by a CA of the test's own (in
/// `dir`), names only `db.example.internal`.
fn fake_tls_server_for_another_name(dir: &Path) -> (FakeServer, PathBuf) {
    let (ca, ca_key) = other_ca();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["db.example.internal".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(leaf.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    )
    .unwrap();
    (
        FakeServer::start(Some(Arc::new(config))),
        write_pem(dir, &ca),
    )
}

#[test]
fn verify_full_refuses_a_certificate_for_another_name_and_require_with_the_ca_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = fake_tls_server_for_another_name(dir.path());

    let err = PgBridge::start(
        server.config(SslMode::VerifyFull, Some(ca.clone())),
        AES,
        None,
    )
    .unwrap_err();
    assert!(matches!(err, BridgeError::Tls { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "the certificate of PostgreSQL server 127.0.0.1:{} does not name \"127.0.0.1\"",
            server.port
        )),
        "{text}"
    );
    assert_eq!(server.next(), Seen::NoStartup { tls: true });

    // require with a CA checks the chain only (libpq's verify-ca): the
    // startup message goes out inside TLS.
    let err = PgBridge::start(server.config(SslMode::Require, Some(ca)), AES, None).unwrap_err();
    assert_eq!(
        server.next(),
        Seen::Startup {
            tls: true,
            user: "postgres".to_owned()
        }
    );
    assert!(matches!(err, BridgeError::Connect { .. }), "{err:?}");
}

/// A TCP relay whose upstream can be switched: new connections go to
/// whatever `upstream` holds when they arrive.
fn relay(upstream: Arc<Mutex<u16>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let to = *upstream.lock().unwrap();
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            for (mut from, mut into) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut into);
                    let _ = into.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    port
}

#[test]
fn a_certificate_refused_on_reconnect_is_logged_and_is_the_links_reason() {
    let db = test_db();
    let log = error_log();
    let upstream = Arc::new(Mutex::new(5432));
    let port = relay(upstream.clone());
    let ca = server_ca();
    let config = PgConfig {
        port,
        sslmode: SslMode::VerifyFull,
        ca_cert_path: Some(ca.clone()),
        ..db.config()
    };
    let bridge = PgBridge::start(config, AES, None).unwrap();
    assert_eq!(bridge_sessions(&db), [true]);

    // From now on, whoever answers on that address shows a certificate
    // from another CA.
    let dir = tempfile::tempdir().unwrap();
    let (impostor, _) = fake_tls_server_for_another_name(dir.path());
    *upstream.lock().unwrap() = impostor.port;
    assert_eq!(db.kill_other_connections(), 1, "the bridge's session");

    let refusal = format!(
        "the certificate of PostgreSQL server 127.0.0.1:{port} is not signed by \
         database.ca_cert_path = {}",
        ca.display()
    );
    wait_until("the link is down with the refusal as its reason", || {
        let status = bridge.status();
        !status.connected
            && status
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(&refusal))
    });
    // Three attempts refused (the backoff is 100, 200, 400 ms)...
    for _ in 0..3 {
        assert_eq!(impostor.next(), Seen::NoStartup { tls: true });
    }
    // ... and one line said so.
    let logged = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let lines: Vec<&str> = logged.lines().filter(|l| l.contains(&refusal)).collect();
    assert_eq!(lines.len(), 1, "logged once, not per attempt: {logged}");
    assert!(lines[0].contains("ERROR"), "{}", lines[0]);
    bridge.shutdown();
}
