//! docs/PROTOCOL.md, "Admin endpoint": it speaks HTTP/1.1 over mutual TLS.
//! `/health` and `/ready` answer any certificate the broker's CA signed;
//! `/api/*` and `/metrics` answer admin CNs only (others get 403); the status
//! and the metrics reflect what clients did; a client without a certificate
//! never gets an answer; a taken `admin.address` stops the start; the
//! optional plain-HTTP probe address serves `/health` and `/ready` alone.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ciphermq_broker::Config;
use ciphermq_clients::connection::{Connection, TlsClientOptions};
use ciphermq_testkit::RunningBroker;
use common::admin_http::{plain_request, request, Reply};
use common::*;
use serde_json::Value;

/// A broker with the admin endpoint on a free port.
struct AdminBroker {
    broker: RunningBroker,
    addr: String,
    admin: SocketAddr,
}

/// With the per-queue series (`admin.queue_metrics`), which the metrics
/// test reads.
const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\nqueue_metrics = true\n";

fn admin_config(shards: usize, durable: bool, data: &std::path::Path, admin: &str) -> Config {
    let mut text = config_text(&pki().certs, data, shards, admin);
    if durable {
        text = text.replace(r#"mode = "memory""#, r#"mode = "durable""#);
    }
    Config::from_toml_str(&text, data).expect("test config")
}

impl AdminBroker {
    fn start(shards: usize, durable: bool) -> AdminBroker {
        AdminBroker::start_with(shards, durable, "")
    }

    /// With `extra` sections before `[admin]`.
    fn start_with(shards: usize, durable: bool, extra: &str) -> AdminBroker {
        let data = tempfile::tempdir().expect("tempdir");
        let config = admin_config(shards, durable, data.path(), &format!("{extra}{ADMIN}"));
        let broker = RunningBroker::start(&config).keeping(data);
        let admin = broker.admin_addr().expect("admin endpoint enabled");
        AdminBroker {
            addr: broker.addr.clone(),
            admin,
            broker,
        }
    }

    async fn connect(&self, cn: &str) -> Connection {
        let opts = TlsClientOptions::for_cn(&pki().certs, cn);
        tokio::time::timeout(TIMEOUT, Connection::connect(&self.addr, &opts))
            .await
            .expect("connect in time")
            .unwrap_or_else(|e| panic!("connect as {cn}: {e}"))
    }

    async fn get(&self, cn: &str, path: &str) -> Reply {
        request(self.admin, Some(cn), "GET", path)
            .await
            .unwrap_or_else(|e| panic!("GET {path} as {cn}: {e}"))
    }

    async fn get_json(&self, cn: &str, path: &str) -> (u16, Value) {
        let reply = self.get(cn, path).await;
        assert!(
            reply.header("content-type") == Some("application/json"),
            "GET {path}: content type {:?}",
            reply.header("content-type")
        );
        let json = serde_json::from_str(&reply.body)
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {}", reply.body));
        (reply.status, json)
    }
}

/// Polls `path` as admin until `done` holds, for up to `TIMEOUT` (queue
/// counts are refreshed by the shards about once a second).
async fn wait_for(broker: &AdminBroker, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, json) = broker.get_json("admin", path).await;
        assert_eq!(status, 200, "GET {path} as admin: {json}");
        if done(&json) {
            return json;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path}: condition never held; last answer {json}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn queue<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
    doc["queues"].as_array()?.iter().find(|q| q["name"] == name)
}

/// The value of every sample of `name` (any labels) in a metrics text.
fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| (series, value.parse().expect("numeric sample")))
        })
        .collect()
}

#[tokio::test]
async fn health_and_ready_answer_any_certificate_the_ca_signed() {
    let broker = AdminBroker::start(2, false);
    for cn in ["sender_1", "receiver_1", "admin", "stranger"] {
        let (status, json) = broker.get_json(cn, "/health").await;
        assert_eq!((status, &json), (200, &serde_json::json!({"status": "ok"})));
        let (status, json) = broker.get_json(cn, "/ready").await;
        assert_eq!(
            (status, &json),
            (200, &serde_json::json!({"status": "ready"})),
            "/ready as {cn}"
        );
    }
}

#[tokio::test]
async fn other_routes_answer_admin_and_monitor_cns_only() {
    let broker = AdminBroker::start(2, false);
    for cn in ["sender_1", "receiver_1", "stranger"] {
        for path in ["/api/status", "/api/queues", "/api/connections", "/metrics"] {
            let (status, json) = broker.get_json(cn, path).await;
            assert_eq!(
                (status, &json),
                (403, &serde_json::json!({"error": "forbidden"})),
                "{path} as {cn}"
            );
        }
    }
    for cn in ["admin", "monitor_1"] {
        for path in ["/api/status", "/api/queues", "/api/connections", "/metrics"] {
            assert_eq!(broker.get(cn, path).await.status, 200, "{path} as {cn}");
        }
    }
    // Reading is all a monitor may do: nothing but GET is served to anyone
    // (a route that changes the broker will ask for an admin).
    let reply = request(broker.admin, Some("monitor_1"), "POST", "/api/status")
        .await
        .expect("POST answered");
    assert_eq!(reply.status, 405);
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() {
    let broker = AdminBroker::start(1, false);
    let (status, json) = broker.get_json("admin", "/nope").await;
    assert_eq!(status, 404);
    assert_eq!(json["error"], "not found");
    let (status, _) = broker.get_json("sender_1", "/api/status/extra").await;
    assert_eq!(status, 404);
    for (cn, path) in [("sender_1", "/health"), ("admin", "/api/status")] {
        let reply = request(broker.admin, Some(cn), "POST", path)
            .await
            .expect("POST answered");
        assert_eq!(reply.status, 405, "POST {path}");
        assert_eq!(reply.header("allow"), Some("GET"));
    }
    // The one route that changes the broker takes POST, from admins only.
    let reply = request(broker.admin, Some("admin"), "GET", "/api/reload")
        .await
        .expect("GET answered");
    assert_eq!((reply.status, reply.header("allow")), (405, Some("POST")));
    let reply = request(broker.admin, Some("monitor_1"), "POST", "/api/reload")
        .await
        .expect("POST answered");
    assert_eq!(reply.status, 403, "{}", reply.body);
    // Started from a config in memory: nothing to reload from, said so.
    let reply = request(broker.admin, Some("admin"), "POST", "/api/reload")
        .await
        .expect("POST answered");
    assert_eq!(reply.status, 422, "{}", reply.body);
    assert!(
        reply.body.contains("not started from a config file"),
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn a_client_without_a_certificate_gets_no_answer() {
    let broker = AdminBroker::start(1, false);
    match request(broker.admin, None, "GET", "/health").await {
        Ok(reply) => panic!("answered without a client certificate: {reply:?}"),
        Err(e) => assert_ne!(
            e.to_string(),
            "no answer in time",
            "the broker must refuse, not hang"
        ),
    }
    // The endpoint still serves proper clients afterwards.
    assert_eq!(broker.get("sender_1", "/health").await.status, 200);
}

#[tokio::test]
async fn status_and_metrics_reflect_what_clients_did() {
    let broker = AdminBroker::start(2, true);
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = broker.connect("sender_1").await;
    for i in 0..3 {
        publish_expect(
            &mut sender,
            "ex",
            "receiver_1",
            &format!("adm-{i}"),
            &format!("ACK adm-{i}"),
        )
        .await;
    }
    let got = fetch(&mut receiver, "receiver_1_queue", 1).await;
    assert_eq!(ids(&got), vec!["adm-0"]);
    check(&mut receiver, "ack adm-0", "ACK_CONFIRMED adm-0").await;

    // Queue counts come from the shards' once-a-second refresh.
    let status = wait_for(&broker, "/api/status", |s| {
        queue(s, "receiver_1_queue").is_some_and(|q| q["ready"] == 2 && q["unacked"] == 0)
    })
    .await;
    let q = queue(&status, "receiver_1_queue").expect("queue listed");
    assert_eq!(q["consumers"], 0);
    // The two bodies still held (the acked one is not counted).
    let held = body("adm-1", "receiver_1").len() + body("adm-2", "receiver_1").len();
    assert_eq!(q["bytes"], held as u64, "{q}");
    assert_eq!(q["owner"], "receiver_1");
    assert_eq!(
        q["shard"],
        ciphermq_shard::shard_of("receiver_1", 2) as u64,
        "{q}"
    );

    let server = &status["server"];
    assert_eq!(server["name"], "ciphermq");
    assert_eq!(server["shards"], 2);
    assert_eq!(server["health"], "ok");
    assert!(server["uptime_secs"].is_u64());

    let c = &status["counters"];
    assert_eq!(c["publishes"], 3, "{c}");
    assert_eq!(c["publish_nacks"], 0, "{c}");
    assert_eq!(c["acks"], 1, "{c}");
    assert_eq!(c["deliveries"], 1, "{c}");
    assert_eq!(c["connections_accepted"], 2, "{c}");
    assert!(c["fsyncs"].as_u64().is_some_and(|n| n >= 1), "{c}");
    assert!(c["commit_rounds"].as_u64().is_some_and(|n| n >= 1), "{c}");

    assert!(
        status["exchanges"]
            .as_array()
            .expect("exchanges")
            .contains(&serde_json::json!({"name": "ex", "type": "direct", "bindings": 1})),
        "{}",
        status["exchanges"]
    );
    assert!(
        status["bindings"]
            .as_array()
            .expect("bindings")
            .contains(&serde_json::json!({
                "exchange": "ex", "queue": "receiver_1_queue", "routing_key": "receiver_1"
            })),
        "{}",
        status["bindings"]
    );

    let conns = &status["connections"];
    assert_eq!(conns["total"], 2, "{conns}");
    assert_eq!(conns["by_cn"]["sender_1"], 1, "{conns}");
    assert_eq!(conns["by_cn"]["receiver_1"], 1, "{conns}");
    assert_eq!(conns["by_ip"]["127.0.0.1"], 2, "{conns}");

    let storage = &status["storage"];
    assert_eq!(storage["mode"], "durable");
    assert_eq!(storage["healthy"], true);
    assert!(storage["last_error"].is_null());
    assert!(storage["data_dir"].is_string());
    assert!(status["pgbridge"].is_null());

    // The parts alone.
    let (code, queues) = broker.get_json("admin", "/api/queues").await;
    assert_eq!(code, 200);
    assert_eq!(queue(&queues, "receiver_1_queue"), Some(q));
    let (code, connections) = broker.get_json("admin", "/api/connections").await;
    assert_eq!(code, 200);
    assert_eq!(connections["connections"]["by_cn"]["sender_1"], 1);

    // Prometheus text: per-shard counters and latency histograms.
    let metrics = broker.get("admin", "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")));
    let text = &metrics.body;
    let publishes = samples(text, "ciphermq_publishes_total");
    assert_eq!(publishes.len(), 2, "one series per shard:\n{text}");
    assert!(publishes
        .iter()
        .any(|(series, _)| series.contains(r#"shard="0""#)));
    assert_eq!(publishes.iter().map(|(_, v)| v).sum::<f64>(), 3.0);
    assert!(text.contains("# TYPE ciphermq_publishes_total counter"));
    for histogram in ["ciphermq_publish_ack_seconds", "ciphermq_fsync_seconds"] {
        assert!(
            text.contains(&format!("# TYPE {histogram} histogram")),
            "{histogram} missing:\n{text}"
        );
        let counts = samples(text, &format!("{histogram}_count"));
        assert!(
            counts.iter().map(|(_, v)| v).sum::<f64>() >= 1.0,
            "{histogram}"
        );
        assert!(text.contains(&format!("{histogram}_bucket{{shard=\"0\",le=\"+Inf\"}}")));
    }
    assert_eq!(
        samples(text, "ciphermq_publish_ack_seconds_count")
            .iter()
            .map(|(_, v)| v)
            .sum::<f64>(),
        3.0
    );
    assert_eq!(
        samples(text, "ciphermq_queue_ready"),
        vec![(
            format!(
                "ciphermq_queue_ready{{queue=\"receiver_1_queue\",shard=\"{}\"}}",
                ciphermq_shard::shard_of("receiver_1", 2)
            )
            .as_str(),
            2.0
        )]
    );
    assert_eq!(
        samples(text, "ciphermq_queue_bytes")
            .iter()
            .map(|(_, v)| *v)
            .collect::<Vec<f64>>(),
        vec![held as f64]
    );
    assert_eq!(
        samples(text, "ciphermq_ready"),
        vec![("ciphermq_ready", 1.0)]
    );
    drop(sender);
    drop(receiver);
}

/// `/api/status` reports every cap a client is held to, as configured,
/// and what each receiver holds against its quotas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_limits_and_quota_usage() {
    let broker = AdminBroker::start_with(
        1,
        false,
        "[performance]\nmax_bindings_per_cn = 7\nmax_fetch = 99\nmax_queue_bytes = 4096\n",
    );
    let mut r = broker.connect("receiver_1").await;
    setup_receiver(&mut r, "receiver_1").await;
    let (status, json) = broker.get_json("admin", "/api/status").await;
    assert_eq!(status, 200);
    let limits = &json["limits"];
    assert_eq!(limits["max_bindings_per_cn"], 7, "{json}");
    assert_eq!(limits["max_queues_per_cn"], 1000);
    assert_eq!(limits["max_exchanges_per_cn"], 100);
    assert_eq!(limits["max_fetch"], 99);
    assert_eq!(limits["max_queue_bytes"], 4096);
    assert_eq!(limits["max_queue_size"], 1_000_000);
    assert_eq!(limits["memory_budget_bytes"], 256u64 << 20);
    assert_eq!(limits["max_reply_bytes_per_turn"], 1 << 20);
    assert_eq!(limits["max_handshakes_per_ip"], 64);
    assert_eq!(limits["max_routing_key_words"], 32);
    assert_eq!(
        json["quota_usage"],
        serde_json::json!([{"cn": "receiver_1", "queues": 1, "exchanges": 1, "bindings": 1}])
    );
}

#[tokio::test]
async fn the_postgres_bridge_reports_through_status_and_metrics() {
    let db = common::pg::TestDb::create().await;
    let broker = AdminBroker::start_with(
        1,
        true,
        &db.config("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="),
    );
    let mut receiver = broker.connect("receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = broker.connect("sender_1").await;
    for i in 0..2 {
        publish_expect(
            &mut sender,
            "ex",
            "receiver_1",
            &format!("pg-{i}"),
            &format!("ACK pg-{i}"),
        )
        .await;
    }
    let status = wait_for(&broker, "/api/status", |s| {
        s["pgbridge"]["connected"] == true
            && s["pgbridge"]["rows_written"]
                .as_u64()
                .is_some_and(|n| n >= 2)
    })
    .await;
    let bridge = status["pgbridge"].as_object().expect("pgbridge object");
    for key in [
        "connected",
        "rows_written",
        "lag_bytes",
        "lag_rows",
        "lag_seconds",
        "missed_segments",
        "reconnects",
        "last_error",
    ] {
        assert!(
            bridge.contains_key(key),
            "pgbridge.{key} missing: {bridge:?}"
        );
    }
    assert_eq!(bridge["missed_segments"], 0);

    let text = broker.get("admin", "/metrics").await.body;
    assert_eq!(
        samples(&text, "ciphermq_pgbridge_connected"),
        vec![("ciphermq_pgbridge_connected", 1.0)]
    );
    assert!(samples(&text, "ciphermq_pgbridge_rows_written_total")[0].1 >= 2.0);
    for gauge in [
        "ciphermq_pgbridge_lag_bytes",
        "ciphermq_pgbridge_lag_rows",
        "ciphermq_pgbridge_lag_seconds",
        "ciphermq_pgbridge_missed_segments_total",
        "ciphermq_pgbridge_reconnects_total",
    ] {
        assert_eq!(samples(&text, gauge).len(), 1, "{gauge}:\n{text}");
    }
}

#[tokio::test]
async fn ready_turns_503_once_the_broker_is_stopping() {
    let mut broker = AdminBroker::start(1, false);
    let handle = broker.broker.take_handle();
    (handle.stopper())();
    let (status, json) = broker.get_json("sender_1", "/ready").await;
    assert_eq!(status, 503, "{json}");
    assert_eq!(json["status"], "not ready");
    assert_eq!(json["reason"], "shutting down");
    assert_eq!(broker.get("sender_1", "/health").await.status, 200);
    handle.join();
}

#[tokio::test]
async fn the_probe_address_serves_health_and_ready_alone_over_plain_http() {
    let data = tempfile::tempdir().expect("tempdir");
    let config = admin_config(
        1,
        false,
        data.path(),
        "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\nprobe_address = \"127.0.0.1:0\"\n",
    );
    let handle = ciphermq_broker::start(&config).expect("broker starts");
    let probe = handle.probe_addr().expect("probe address configured");
    assert_ne!(Some(probe), handle.admin_addr());
    let get = |path: &'static str| async move {
        plain_request(probe, "GET", path)
            .await
            .unwrap_or_else(|e| panic!("GET {path} on the probe address: {e}"))
    };
    let health = get("/health").await;
    assert_eq!(
        (health.status, health.body.trim()),
        (200, r#"{"status":"ok"}"#)
    );
    let ready = get("/ready").await;
    assert_eq!(
        (ready.status, ready.body.trim()),
        (200, r#"{"status":"ready"}"#)
    );
    // Nothing but the probes exists there, whoever asks.
    for path in [
        "/metrics",
        "/api/status",
        "/api/queues",
        "/api/connections",
        "/",
        "/dashboard",
        "/nope",
    ] {
        let reply = get(path).await;
        assert_eq!(reply.status, 404, "{path}: {}", reply.body);
        assert!(!reply.body.contains("ciphermq_"), "{path}: {}", reply.body);
    }
    let post = plain_request(probe, "POST", "/health").await.expect("POST");
    assert_eq!(post.status, 405);
    // The mTLS endpoint is unchanged beside it.
    let admin = handle.admin_addr().expect("admin endpoint");
    let metrics = request(admin, Some("admin"), "GET", "/metrics")
        .await
        .expect("metrics over mTLS");
    assert_eq!(metrics.status, 200);
    handle.shutdown();
}

#[test]
fn a_taken_admin_or_probe_address_is_a_start_error_naming_its_key() {
    for (key, section) in [
        ("admin.address", "address = \"{taken}\""),
        (
            "admin.probe_address",
            "address = \"127.0.0.1:0\"\nprobe_address = \"{taken}\"",
        ),
    ] {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = taken.local_addr().expect("address").to_string();
        let data = tempfile::tempdir().expect("tempdir");
        let section = section.replace("{taken}", &address);
        let config = admin_config(
            1,
            false,
            data.path(),
            &format!("\n[admin]\nenabled = true\n{section}\n"),
        );
        let err = match ciphermq_broker::start(&config) {
            Ok(handle) => {
                handle.shutdown();
                panic!("started although {address} ({key}) is taken");
            }
            Err(e) => e.to_string(),
        };
        assert!(
            err.starts_with(&format!("{key}: cannot listen on {address}")),
            "{err}"
        );
    }
}
