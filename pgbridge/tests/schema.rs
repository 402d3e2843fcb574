//! The bridge creates its tables on an empty database, starts again on one
//! that has them, survives two brokers creating them at once, and refuses a
//! schema newer than it knows or a server it cannot reach.

mod common;

use std::time::Duration;

use ciphermq_keystore::register_and_wait;
use ciphermq_pgbridge::{BridgeError, PgBridge, PgConfig};
use common::TestDb;

const AES: [u8; 32] = [7u8; 32];

fn tables(db: &TestDb) -> Vec<String> {
    db.query(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' ORDER BY 1",
        &[],
    )
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[test]
fn creates_the_schema_on_an_empty_database_and_starts_again_on_it() {
    let db = TestDb::new();
    assert!(tables(&db).is_empty());
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    assert_eq!(
        tables(&db),
        [
            "ciphermq_mirror_watermark",
            "ciphermq_schema_version",
            "message_metadata",
            "public_keys"
        ]
    );
    assert_eq!(db.scalar("SELECT count(*) FROM ciphermq_schema_version"), 1);
    assert_eq!(
        db.scalar("SELECT max(version)::bigint FROM ciphermq_schema_version"),
        2
    );
    let index = db.scalar(
        "SELECT count(*) FROM pg_indexes WHERE tablename = 'message_metadata'
         AND indexdef LIKE '%(message_id)%'",
    );
    assert_eq!(index, 1, "message_metadata is indexed on message_id");
    assert!(bridge.status().connected);
    register_and_wait(bridge.key_store().as_ref(), "receiver_1", [1u8; 32]).unwrap();
    db.execute(
        "INSERT INTO message_metadata (queue, log_seq, message_id, client_id, exchange_name, \
         routing_key, sent_time) VALUES ('q', 0, 'm', 's', 'e', 'k', now())",
    );
    bridge.shutdown();

    let again = PgBridge::start(db.config(), AES, None).unwrap();
    assert_eq!(again.key_store().get("receiver_1"), Some([1u8; 32]));
    assert_eq!(db.scalar("SELECT count(*) FROM ciphermq_schema_version"), 1);
    assert_eq!(db.scalar("SELECT count(*) FROM message_metadata"), 1);
    again.shutdown();
}

/// A database a version-1 broker made (rows keyed by queue alone) is
/// upgraded in place: its rows and positions become node `''`'s (a broker
/// on its own), and two nodes' copies of one queue name can then coexist.
#[test]
fn a_version_1_schema_is_upgraded_keeping_its_rows() {
    let db = TestDb::new();
    db.execute(
        "CREATE TABLE ciphermq_schema_version (version integer NOT NULL);
         INSERT INTO ciphermq_schema_version VALUES (1);
         CREATE TABLE message_metadata (
             queue text NOT NULL, log_seq bigint NOT NULL, message_id text NOT NULL,
             client_id text NOT NULL, exchange_name text NOT NULL, routing_key text NOT NULL,
             sent_time timestamptz NOT NULL, delivered_time timestamptz,
             acknowledged_time timestamptz, PRIMARY KEY (queue, log_seq));
         CREATE TABLE public_keys (client_id text PRIMARY KEY,
             public_key_ciphertext text NOT NULL, nonce text NOT NULL, tag text NOT NULL,
             updated_time timestamptz NOT NULL);
         CREATE TABLE ciphermq_mirror_watermark (queue text PRIMARY KEY,
             segment_base bigint NOT NULL, byte_offset bigint NOT NULL,
             updated_time timestamptz NOT NULL);
         INSERT INTO message_metadata VALUES ('q', 0, 'm', 's', 'e', 'k', now(), NULL, NULL);
         INSERT INTO ciphermq_mirror_watermark VALUES ('q', 0, 10, now());",
    );
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    assert_eq!(
        db.scalar("SELECT max(version)::bigint FROM ciphermq_schema_version"),
        2
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM message_metadata WHERE node = '' AND epoch = 0"),
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM ciphermq_mirror_watermark WHERE node = ''"),
        1
    );
    // Another node's copy of the same queue and sequence is a row of its own.
    db.execute(
        "INSERT INTO message_metadata (node, queue, log_seq, message_id, client_id, \
         exchange_name, routing_key, sent_time, epoch) \
         VALUES ('node-b', 'q', 0, 'm', 's', 'e', 'k', now(), 2)",
    );
    db.execute(
        "INSERT INTO ciphermq_mirror_watermark (node, queue, segment_base, byte_offset, \
         updated_time) VALUES ('node-b', 'q', 0, 10, now())",
    );
    assert_eq!(db.scalar("SELECT count(*) FROM message_metadata"), 2);
    bridge.shutdown();
    // And again: nothing to upgrade, nothing lost.
    PgBridge::start(db.config(), AES, None).unwrap().shutdown();
    assert_eq!(db.scalar("SELECT count(*) FROM message_metadata"), 2);
    assert_eq!(db.scalar("SELECT count(*) FROM ciphermq_schema_version"), 1);
}

#[test]
fn two_brokers_creating_the_schema_at_once_both_start() {
    let db = TestDb::new();
    let starts: Vec<_> = (0..2)
        .map(|_| {
            let config = db.config();
            std::thread::spawn(move || PgBridge::start(config, AES, None))
        })
        .collect();
    for start in starts {
        let bridge = start.join().unwrap().expect("both starts succeed");
        bridge.shutdown();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM ciphermq_schema_version"), 1);
}

#[test]
fn a_schema_newer_than_this_build_is_refused() {
    let db = TestDb::new();
    PgBridge::start(db.config(), AES, None).unwrap().shutdown();
    db.execute("UPDATE ciphermq_schema_version SET version = 99");
    let err = PgBridge::start(db.config(), AES, None).unwrap_err();
    assert!(matches!(err, BridgeError::Schema(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("version 99") && text.contains("upgrade the broker"),
        "{text}"
    );
    assert!(text.contains(&db.name), "names the database: {text}");
}

#[test]
fn a_foreign_table_with_the_same_name_is_reported() {
    let db = TestDb::new();
    db.execute("CREATE TABLE message_metadata (message_id text PRIMARY KEY)");
    let err = PgBridge::start(db.config(), AES, None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("message_metadata") && text.contains("has no column"),
        "{text}"
    );
}

#[test]
fn an_unreachable_server_fails_start_naming_it() {
    let config = PgConfig {
        port: 1,
        dbname: "nowhere".to_owned(),
        connect_timeout: Duration::from_millis(500),
        ..PgConfig::default()
    };
    let err = PgBridge::start(config, AES, None).unwrap_err();
    assert!(matches!(err, BridgeError::Connect { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1/nowhere"), "{text}");
    assert!(text.contains("gave up after"), "{text}");
}
