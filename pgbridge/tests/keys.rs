//! Public keys in PostgreSQL: stored sealed, served from memory, reloaded on
//! restart; a wrong aes_key fails start naming the client; a registration
//! during an outage is refused promptly and works again once it ends.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ciphermq_keystore::{register_and_wait, KeyStoreError};
use ciphermq_pgbridge::{BridgeError, PgBridge};
use common::{wait_until, TestDb};

const AES: [u8; 32] = [7u8; 32];

#[test]
fn a_registered_key_is_stored_sealed_and_survives_a_restart() {
    let db = TestDb::new();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    let store = bridge.key_store();
    assert!(store.is_empty());
    assert_eq!(
        register_and_wait(store.as_ref(), "receiver_1", [1u8; 32]),
        Ok(None)
    );
    assert_eq!(
        register_and_wait(store.as_ref(), "receiver_1", [2u8; 32]),
        Ok(Some([1u8; 32])),
        "rotation returns the replaced key"
    );
    assert_eq!(
        register_and_wait(store.as_ref(), "receiver_2", [3u8; 32]),
        Ok(None)
    );
    assert_eq!(store.get("receiver_1"), Some([2u8; 32]));
    assert_eq!(store.len(), 2);

    let rows = db.query(
        "SELECT public_key_ciphertext, nonce, tag FROM public_keys WHERE client_id = 'receiver_1'",
        &[],
    );
    assert_eq!(rows.len(), 1);
    let field = |i: usize| STANDARD.decode(rows[0].get::<_, String>(i)).unwrap();
    let (ciphertext, nonce, tag) = (field(0), field(1), field(2));
    assert_eq!(ciphertext.len(), 32);
    assert_eq!(nonce.len(), 12);
    assert_eq!(tag.len(), 16);
    assert_ne!(ciphertext, [2u8; 32], "not stored in clear");
    let updated = db
        .scalar("SELECT count(*) FROM public_keys WHERE updated_time > now() - interval '1 hour'");
    assert_eq!(updated, 2);
    bridge.shutdown();

    let again = PgBridge::start(db.config(), AES, None).unwrap();
    let store = again.key_store();
    assert_eq!(store.len(), 2);
    assert_eq!(store.get("receiver_1"), Some([2u8; 32]));
    assert_eq!(store.get("receiver_2"), Some([3u8; 32]));
    assert_eq!(store.get("nobody"), None);
    again.shutdown();
}

#[test]
fn a_wrong_aes_key_fails_start_naming_the_client() {
    let db = TestDb::new();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    register_and_wait(bridge.key_store().as_ref(), "receiver_9", [1u8; 32]).unwrap();
    bridge.shutdown();
    let err = PgBridge::start(db.config(), [8u8; 32], None).unwrap_err();
    match &err {
        BridgeError::WrongKey { client_id } => assert_eq!(client_id, "receiver_9"),
        other => panic!("expected WrongKey, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("receiver_9") && text.contains("aes_key is wrong"),
        "{text}"
    );
}

#[test]
fn a_row_moved_to_another_client_does_not_open() {
    let db = TestDb::new();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    register_and_wait(bridge.key_store().as_ref(), "r1", [1u8; 32]).unwrap();
    bridge.shutdown();
    db.execute("UPDATE public_keys SET client_id = 'r2'");
    let err = PgBridge::start(db.config(), AES, None).unwrap_err();
    assert!(
        matches!(&err, BridgeError::WrongKey { client_id } if client_id == "r2"),
        "{err:?}"
    );
}

#[test]
fn a_registration_during_an_outage_is_refused_promptly_then_works_again() {
    let db = TestDb::new();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    let store = bridge.key_store();
    db.set_reachable(false);
    wait_until("the bridge notices the outage", || {
        !bridge.status().connected
    });

    let registration = store.register("receiver_1", [1u8; 32]);
    let answer = db
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), registration).await })
        .expect("answered, not left hanging")
        .expect("answered, not dropped");
    match answer {
        Err(KeyStoreError::Unavailable(why)) => {
            assert!(why.contains("database unavailable"), "{why}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(store.get("receiver_1"), None, "not served: not durable");
    assert!(bridge.status().last_error.is_some());

    db.set_reachable(true);
    wait_until("a registration succeeds again", || {
        register_and_wait(store.as_ref(), "receiver_1", [1u8; 32]).is_ok()
    });
    assert_eq!(store.get("receiver_1"), Some([1u8; 32]));
    assert_eq!(
        db.scalar("SELECT count(*) FROM public_keys WHERE client_id = 'receiver_1'"),
        1
    );
    wait_until("the status says connected again", || {
        bridge.status().connected
    });
    assert!(bridge.status().reconnects >= 1);
    bridge.shutdown();
}

#[test]
fn a_registration_after_shutdown_is_refused() {
    let db = TestDb::new();
    let bridge = PgBridge::start(db.config(), AES, None).unwrap();
    let store = bridge.key_store();
    bridge.shutdown();
    assert!(matches!(
        register_and_wait(store.as_ref(), "r1", [1u8; 32]),
        Err(KeyStoreError::Unavailable(_))
    ));
}
