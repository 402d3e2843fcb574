//! The monitoring files shipped in `admin/monitoring/` against a real broker:
//! - the Grafana dashboard asks only for series the broker exports (a
//!   renamed metric would otherwise leave an empty panel nobody notices);
//! - the Prometheus scrape config passes `promtool check config`, and a real
//!   Prometheus (Debian's `prometheus` package, which `scripts/test.sh`
//!   installs) scrapes the broker with it over mutual TLS using a monitor
//!   certificate (`acl.monitor_cns`), the least privilege that reads
//!   `/metrics`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::admin_http::{plain_request, request};
use common::*;
use serde_json::Value;

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

fn monitoring_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../admin/monitoring")
        .join(name)
}

/// A Debian `prometheus` package binary; fails (never skips) without it.
fn prometheus_tool(name: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.is_file(),
        "{} not found: install Debian's `prometheus` package \
         (`apt-get install --no-install-recommends prometheus`; ./scripts/test.sh does it)",
        path.display()
    );
    path
}

/// Every series name sampled in a Prometheus text exposition.
fn sampled_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Every `ciphermq_…` name in a PromQL expression.
fn names_in(expr: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ciphermq_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_asks_only_for_series_the_broker_exports() {
    // With the Postgres mirror, so that its series are there too.
    let db = common::pg::TestDb::create().await;
    let data = tempfile::tempdir().expect("tempdir");
    // And with the per-queue series its Queues table reads (opt-in).
    let extra = format!(
        "{}{ADMIN}queue_metrics = true\n",
        db.config("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
    );
    let broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", &extra);
    let admin = broker.admin_addr().expect("admin endpoint enabled");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(&mut sender, "ex", "receiver_1", "dash-1", "ACK dash-1").await;

    let metrics = request(admin, Some("monitor_1"), "GET", "/metrics")
        .await
        .expect("/metrics as a monitor");
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    let exported = sampled_names(&metrics.body);

    let text = std::fs::read_to_string(monitoring_file("grafana-dashboard.json"))
        .expect("admin/monitoring/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut asked = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            let names = names_in(expr);
            assert!(!names.is_empty(), "panel {title:?}: {expr}");
            for name in names {
                asked += 1;
                assert!(
                    exported.contains(name),
                    "panel {title:?} asks for {name}, which /metrics does not export"
                );
            }
        }
    }
    assert!(asked >= 20, "{asked} series asked for");
}

/// Stops the Prometheus server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_broker_with_the_shipped_config_and_a_monitor_certificate() {
    let promtool = prometheus_tool("promtool");
    let prometheus = prometheus_tool("prometheus");
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", ADMIN);
    let admin = broker.admin_addr().expect("admin endpoint enabled");

    // The shipped file, beside the certificate files it names: the monitor
    // CN's certificate stands in for `prometheus`.
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    for (from, to) in [
        ("ca.crt", "ca.crt"),
        ("monitor_1.crt", "prometheus.crt"),
        ("monitor_1.key", "prometheus.key"),
    ] {
        std::fs::copy(pki().certs.join(from), certs.join(to)).unwrap();
    }
    let shipped = std::fs::read_to_string(monitoring_file("prometheus.yml")).unwrap();
    assert!(shipped.contains("127.0.0.1:9091"), "{shipped}");
    let config = shipped.replace("127.0.0.1:9091", &admin.to_string());
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let checked = Command::new(&promtool)
        .args(["check", "config"])
        .arg(&config_path)
        .output()
        .expect("run promtool");
    assert!(
        checked.status.success(),
        "promtool check config: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let web = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap()
    };
    let _server = Server(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    // Prometheus reports each target's last scrape: wait for it to be up
    // and for a broker series to be stored.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        if let Ok(reply) = plain_request(
            web,
            "GET",
            "/api/v1/query?query=ciphermq_shards%7Bjob%3D%22ciphermq%22%7D",
        )
        .await
        {
            last = reply.body;
            let answer: Value = serde_json::from_str(&last).unwrap_or_default();
            let value = &answer["data"]["result"][0]["value"][1];
            if value == "1" {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never stored ciphermq_shards from the broker; last answer: {last}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let targets = plain_request(web, "GET", "/api/v1/targets")
        .await
        .expect("targets");
    let targets: Value = serde_json::from_str(&targets.body).expect("targets JSON");
    let target = &targets["data"]["activeTargets"][0];
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["labels"]["broker"], "ciphermq-1", "{target}");
}
