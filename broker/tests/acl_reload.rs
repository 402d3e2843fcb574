//! SIGHUP semantics: a reloaded `[acl]` applies atomically to running
//! connections; a CN that lost its role is disconnected, and new connections
//! follow the new lists.

mod common;

use std::time::Duration;

use ciphermq_broker::Config;
use ciphermq_clients::connection::{ClientError, Connection, TlsClientOptions};
use common::{config_text, expect, pki};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cn_that_loses_its_role_is_disconnected_and_refused() {
    let data = tempfile::tempdir().unwrap();
    let text = config_text(&pki().certs, data.path(), 2, "");
    let config = Config::from_toml_str(&text, data.path()).unwrap();
    let broker = ciphermq_broker::start(&config).unwrap();
    let addr = broker.local_addr().to_string();
    let opts = |cn: &str| TlsClientOptions::for_cn(&pki().certs, cn);

    let mut kept = Connection::connect(&addr, &opts("receiver_1"))
        .await
        .unwrap();
    let mut dropped = Connection::connect(&addr, &opts("receiver_2"))
        .await
        .unwrap();
    expect(&mut dropped, "heartbeat", "OK heartbeat").await;

    let reloaded = text.replace(
        r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
        r#"receiver_cns = ["receiver_1", "receiver_1_2"]"#,
    );
    assert_ne!(reloaded, text, "the test must really change the ACL");
    let new_config = Config::from_toml_str(&reloaded, data.path()).unwrap();
    broker.reloader()(&new_config);

    // The idle connection of the removed CN is closed without sending anything.
    let end = tokio::time::timeout(Duration::from_secs(5), dropped.read_line()).await;
    match end.expect("closed promptly") {
        Ok(None) | Err(_) => {}
        Ok(Some(line)) => panic!("expected the connection to close, got {line:?}"),
    }
    // The other receiver keeps working.
    expect(&mut kept, "heartbeat", "OK heartbeat").await;
    // And the removed CN is now an unknown client.
    match Connection::connect(&addr, &opts("receiver_2")).await {
        Err(ClientError::Refused(line)) => {
            assert_eq!(line, "Access denied: unknown client (role=unknown)")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    broker.shutdown();
}
