//! The cluster client library against three real nodes: six receivers
//! spread over them, two senders each connected to one seed node only.
//! Every receiver gets exactly its messages, once; a sender is redirected
//! at most once per owner (the placement never moves here, so one epoch
//! each), and a redirect never stores a message twice.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use ciphermq_clients::client::cluster::ClusterClient;
use ciphermq_clients::{ClientConfig, TlsClientOptions};
use common::pg::TestDb;
use common::{pki, TestBroker};
use futures_util::StreamExt;

const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const RECEIVERS: [&str; 6] = [
    "receiver_1",
    "receiver_2",
    "receiver_3",
    "receiver_4",
    "receiver_5",
    "receiver_6",
];
const PER_RECEIVER_PER_SENDER: usize = 25;

fn node(db: &TestDb, node_id: &str) -> TestBroker {
    let extra = format!(
        "{}\n[cluster]\nenabled = true\nnode_id = \"{node_id}\"\n",
        db.config_with_tls(AES_KEY, "disable", None)
    );
    TestBroker::start_edited(1, &extra, |text| {
        text.replace(
            r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_1_2"]"#,
            r#"receiver_cns = ["receiver_1", "receiver_2", "receiver_3", "receiver_4", "receiver_5", "receiver_6"]"#,
        )
    })
}

fn config(cn: &str, seed: &str) -> ClientConfig {
    ClientConfig::new(seed, TlsClientOptions::for_cn(&pki().certs, cn))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_on_one_seed_reach_receivers_on_every_node_with_at_most_one_redirect_each() {
    let db = TestDb::create().await;
    let nodes = [
        node(&db, "node-a"),
        node(&db, "node-b"),
        node(&db, "node-c"),
    ];
    let seeds: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();

    // Receivers i and i+3 start on node i: `locate` on their seed places
    // them there; each declares, binds, registers its key and consumes on
    // its own node, found through the cluster client.
    let mut consumers = Vec::new();
    let mut keys = Vec::new();
    for (i, cn) in RECEIVERS.iter().enumerate() {
        let seed = &seeds[i % 3];
        let cluster = ClusterClient::connect(config(cn, seed), vec![seed.clone()])
            .await
            .expect("receiver connects");
        let home = cluster.locate(cn).await.expect("locate");
        assert_eq!(home.address, *seed, "{cn} placed on the node it asked");
        assert_eq!(home.epoch, 1);
        let client = cluster.home_of(cn).await.expect("home");
        let queue = format!("{cn}_queue");
        client
            .declare_exchange("ex", ciphermq_clients::ExchangeKind::Direct)
            .await
            .expect("declare exchange");
        client.declare_queue(&queue).await.expect("declare queue");
        client.bind(&queue, "ex", cn).await.expect("bind");
        let secret = ciphermq_clients::ReceiverKey::generate(*cn);
        client
            .register_public_key(&secret.public_key())
            .await
            .expect("register key");
        keys.push(secret);
        consumers.push((
            cn,
            client.consume(&queue, 1000).await.expect("consume"),
            cluster,
        ));
    }

    // Two senders, each knowing only one seed (nodes a and b), publish to
    // every receiver.
    let mut senders = Vec::new();
    for (cn, seed) in [("sender_1", &seeds[0]), ("sender_2", &seeds[1])] {
        let cluster = ClusterClient::connect(config(cn, seed), vec![seed.clone()])
            .await
            .expect("sender connects");
        for n in 0..PER_RECEIVER_PER_SENDER {
            for receiver in RECEIVERS {
                let text = format!("{cn} to {receiver} #{n}");
                // Keys registered on other nodes reach the seed within a
                // second: retry the first publish until they have.
                let mut tries = 0;
                loop {
                    match cluster
                        .publish_to(receiver, "ex", receiver, text.as_bytes())
                        .await
                    {
                        Ok(_) => break,
                        Err(ciphermq_clients::PublishError::NoPublicKey { .. }) if tries < 200 => {
                            tries += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("{cn} → {receiver}: {e}"),
                    }
                }
            }
        }
        senders.push((cn, seed.clone(), cluster));
    }

    // A sender is redirected at most once per owner: the receivers not on
    // its seed (four of six), and only on the first publish to each.
    for (cn, _, cluster) in &senders {
        assert_eq!(
            cluster.redirects(),
            4,
            "{cn}: one redirect per owner on another node"
        );
    }

    // Every receiver gets exactly its 2 × 25 messages, each once.
    for ((cn, mut consumer, _cluster), secret) in consumers.into_iter().zip(keys) {
        let mut got: BTreeMap<String, u32> = BTreeMap::new();
        while got.values().sum::<u32>() < 2 * PER_RECEIVER_PER_SENDER as u32 {
            let delivery = tokio::time::timeout(common::TIMEOUT, consumer.next())
                .await
                .unwrap_or_else(|_| panic!("{cn}: only {} of its messages came", got.len()))
                .expect("a delivery")
                .expect("a delivery, not an error");
            let text = delivery.decrypt(&secret).expect("decrypts with its key");
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains(&format!(" to {cn} #")), "{cn} got {text:?}");
            *got.entry(text).or_default() += 1;
            delivery.ack().await.expect("ack");
        }
        let distinct: BTreeSet<&String> = got.keys().collect();
        assert_eq!(distinct.len(), 2 * PER_RECEIVER_PER_SENDER, "{cn}: {got:?}");
        assert!(got.values().all(|&n| n == 1), "{cn}: duplicates {got:?}");
    }
}

/// The shipped receiver and sender, each given the address of a node that
/// does not hold the receiver, find the node that does and meet there, end
/// to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_tools_pointed_at_another_node_find_the_receivers_node() {
    use ciphermq_clients::receiver::{run_receiver, ReceiverLimits, ReceiverStats};
    use ciphermq_clients::receiver_config::ReceiverConfig;
    use ciphermq_clients::sender::{run_sender, SendJob, SenderStats};
    use ciphermq_clients::sender_config::SenderConfig;
    use ciphermq_clients::TlsConfig;
    use std::sync::Arc;
    use std::time::Duration;

    let db = TestDb::create().await;
    let a = node(&db, "node-a");
    let b = node(&db, "node-b");
    // receiver_1 is placed on node-a.
    let mut r1 = common::connect_as(&a, "receiver_1").await;
    common::check(
        &mut r1,
        "locate receiver_1",
        &format!("OK locate receiver_1 node-a {} 1", a.addr),
    )
    .await;
    drop(r1);

    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let secret = ciphermq_clients::crypto::generate_secret_key();
    ciphermq_clients::key_file::write_secret_key(
        &ciphermq_clients::key_file::private_key_path(&keys, "receiver_1"),
        &secret,
    )
    .unwrap();
    let mut rc = ReceiverConfig::new(
        b.addr.clone(),
        TlsConfig::for_cn(&pki().certs, "receiver_1"),
    );
    rc.private_key_path = keys.join("{cn}_private.key");
    rc.output_dir = dir.path().join("out");
    rc.reconnect_backoff_ms = 50;
    let limits = ReceiverLimits {
        until_total: Some(20),
        ..Default::default()
    };
    let receiver = tokio::spawn(async move {
        tokio::time::timeout(
            Duration::from_secs(120),
            run_receiver(
                &rc,
                limits,
                Arc::new(ReceiverStats::default()),
                std::future::pending(),
            ),
        )
        .await
        .expect("receiver finished in time")
        .expect("receiver succeeded")
    });

    // The sender too is given the other node: it finds its receiver's.
    let mut sc = SenderConfig::new(b.addr.clone(), TlsConfig::for_cn(&pki().certs, "sender_1"));
    sc.receivers = vec!["receiver_1".into()];
    sc.keys_dir = dir.path().join("sender-keys");
    sc.content_template = serde_json::json!("hello {seq}");
    sc.sender.key_wait_secs = 30;
    let job = SendJob {
        contents: ciphermq_clients::message_source::Contents::Template {
            template: sc.content_template.clone(),
            count: 20,
            pad_to: 0,
        },
        run_id: None,
    };
    let sent = tokio::time::timeout(
        Duration::from_secs(120),
        run_sender(
            &sc,
            job,
            Arc::new(SenderStats::default()),
            std::future::pending(),
        ),
    )
    .await
    .expect("sender finished in time")
    .expect("sender succeeded");
    assert_eq!(sent.acked, 20);
    let report = receiver.await.unwrap();
    assert_eq!(report.total_records, 20);
    assert_eq!(report.written, 20);
}
