//! Shared helpers: a PKI made once per test binary, a real broker on port 0,
//! and clients connected over real mutual TLS.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ciphermq_broker::{BrokerHandle, Config};
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_clients::pki::{self, PkiOptions};
use ciphermq_shard::shard_of;

/// Every CN the test PKI issues a certificate for.
pub const CNS: &[&str] = &[
    "admin",
    "sender_1",
    "sender_2",
    "sender_3",
    "sender_4",
    "receiver_1",
    "receiver_2",
    "receiver_1_2",
    "stranger",
];

/// A PKI shared by the tests of one binary (certificates are slow to make).
pub struct Pki {
    _dir: tempfile::TempDir,
    pub certs: PathBuf,
    /// A second, unrelated CA with a `sender_1` certificate.
    pub rogue_certs: PathBuf,
}

pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = PkiOptions::new(dir.path().join("certs"), dir.path().join("keys"));
        opts.client_cns = CNS.iter().map(|s| s.to_string()).collect();
        pki::generate(&opts).expect("generate PKI");
        let mut rogue = PkiOptions::new(dir.path().join("rogue"), dir.path().join("rogue-keys"));
        rogue.client_cns = vec!["sender_1".into()];
        pki::generate(&rogue).expect("generate rogue PKI");
        Pki { certs: dir.path().join("certs"), rogue_certs: dir.path().join("rogue"), _dir: dir }
    })
}

/// A broker running on its own threads for one test.
pub struct TestBroker {
    handle: Option<BrokerHandle>,
    pub addr: String,
    pub shards: usize,
    _data: tempfile::TempDir,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }
}

/// The TOML of a test broker; `extra` is appended (whole sections).
pub fn config_text(certs: &Path, data: &Path, shards: usize, extra: &str) -> String {
    format!(
        r#"
[server]
address = "127.0.0.1:0"
shards = {shards}

[tls]
cert_path = "{certs}/server.crt"
key_path = "{certs}/server.key"
ca_cert_path = "{certs}/ca.crt"

[logging]
console = false
json_files = false

[storage]
data_dir = "{data}"
mode = "memory"

[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2", "sender_3", "sender_4"]
receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]
{extra}
"#,
        certs = certs.display(),
        data = data.display(),
    )
}

impl TestBroker {
    pub fn start(shards: usize) -> TestBroker {
        TestBroker::start_with(shards, "")
    }

    pub fn start_with(shards: usize, extra: &str) -> TestBroker {
        let pki = pki();
        let data = tempfile::tempdir().expect("tempdir");
        let text = config_text(&pki.certs, data.path(), shards, extra);
        let config = Config::from_toml_str(&text, data.path()).expect("test config");
        let handle = ciphermq_broker::start(&config).expect("broker starts");
        let addr = handle.local_addr().to_string();
        TestBroker { handle: Some(handle), addr, shards, _data: data }
    }

    /// Connects as `cn` and checks the greeting.
    pub async fn connect(&self, cn: &str) -> Connection {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        Connection::connect(&self.addr, &opts).await.unwrap_or_else(|e| panic!("connect as {cn}: {e}"))
    }

    /// The shard serving `cn`.
    pub fn shard_of(&self, cn: &str) -> usize {
        shard_of(cn, self.shards) as usize
    }

    /// A sender CN served by a different shard than `cn` (2+ shards), or any.
    pub fn sender_on_other_shard(&self, cn: &str) -> &'static str {
        ["sender_1", "sender_2", "sender_3", "sender_4"]
            .into_iter()
            .find(|s| self.shards < 2 || self.shard_of(s) != self.shard_of(cn))
            .expect("some sender lives on another shard")
    }
}

/// A valid `EncryptedInputData` body.
pub fn body(id: &str, receiver: &str) -> String {
    format!(
        r#"{{"message_id":"{id}","receiver_client_id":"{receiver}","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"Y2lwaGVy"}}"#
    )
}

/// Sends one line and asserts the reply.
pub async fn expect(conn: &mut Connection, line: &str, reply: &str) {
    let got = conn.request(line).await.unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(got, reply, "reply to {line:?}");
}

/// Reads one line, failing on EOF.
pub async fn next(conn: &mut Connection) -> String {
    conn.read_line().await.expect("read").expect("a line before EOF")
}

/// Declares `direct` exchange `ex`, `{cn}_queue`, and binds it with key `{cn}`.
pub async fn setup_receiver(conn: &mut Connection, cn: &str) {
    expect(conn, "declare_exchange ex direct", "OK declare_exchange ex").await;
    expect(conn, &format!("declare_queue {cn}_queue"), &format!("OK declare_queue {cn}_queue")).await;
    expect(conn, &format!("bind {cn}_queue ex {cn}"), &format!("OK bind {cn}_queue ex {cn}")).await;
}
