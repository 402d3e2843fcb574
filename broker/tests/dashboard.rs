//! The web dashboard in a real browser: a durable two-shard broker serves
//! traffic, `ciphermq-admin dashboard`'s proxy serves the page on loopback,
//! and headless Chromium (Debian's `chromium`; `scripts/test.sh` installs
//! it), driven over the DevTools protocol, loads it. The charts must move
//! while messages flow; once they stop, the page's totals, queues and
//! connections must equal what the admin endpoint reports; the page must
//! log no console message and throw nothing. A screenshot is saved beside
//! the test binaries and its path printed.
//!
//! The endpoint's own `GET /` and the proxy's refusals are tested without a
//! browser.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ciphermq_admin::dashboard_proxy::{DashboardProxy, ProxyError};
use ciphermq_admin::remote::{AdminEndpoint, Credentials, CredentialsError};
use common::admin_http::{plain_request_to, request};
use common::*;
use serde_json::{json, Value};

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

/// Messages left ready in `receiver_2_queue` (nobody consumes it).
const BACKLOG: usize = 7;

/// `admin`'s endpoint, reached with the admin certificate.
fn admin_endpoint(admin: SocketAddr) -> AdminEndpoint {
    let certs = &pki().certs;
    let credentials = Credentials::from_files(
        &certs.join("ca.crt"),
        &certs.join("admin.crt"),
        &certs.join("admin.key"),
    )
    .expect("the admin certificate");
    AdminEndpoint::new(&admin.to_string(), "localhost", credentials).expect("endpoint")
}

/// The proxy to `admin`'s endpoint with the admin certificate, serving on
/// a free loopback port.
async fn start_proxy(admin: SocketAddr) -> SocketAddr {
    let upstream = admin_endpoint(admin);
    let proxy = DashboardProxy::bind("127.0.0.1:0".parse().unwrap(), upstream)
        .await
        .expect("bind the proxy");
    let addr = proxy.local_addr();
    tokio::spawn(proxy.serve());
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_serves_the_page_and_the_proxy_only_what_it_should() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", ADMIN);
    let admin = broker.admin_addr().expect("admin endpoint enabled");

    // Straight from the endpoint, over mTLS: admins and monitors only.
    for path in ["/", "/dashboard"] {
        let page = request(admin, Some("admin"), "GET", path).await.unwrap();
        assert_eq!(page.status, 200, "GET {path}: {}", page.body);
        assert_eq!(
            page.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        let policy = page.header("content-security-policy").unwrap_or_default();
        assert!(policy.contains("connect-src 'self'"), "{policy}");
        assert!(page.body.contains("id=\"queues\""), "not the dashboard");
    }
    let monitor = request(admin, Some("monitor_1"), "GET", "/").await.unwrap();
    assert_eq!(monitor.status, 200, "a monitor may read the dashboard");
    let sender = request(admin, Some("sender_1"), "GET", "/").await.unwrap();
    assert_eq!(sender.status, 403, "a sender must not see the dashboard");

    // The proxy: its own page, the read routes forwarded, nothing else.
    let proxy = start_proxy(admin).await;
    let host = proxy.to_string();
    let page = plain_request_to(proxy, "GET", "/", &host).await.unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"rates-chart\""));
    let status = plain_request_to(proxy, "GET", "/api/status", &host)
        .await
        .unwrap();
    assert_eq!(status.status, 200, "{}", status.body);
    let status: Value = serde_json::from_str(&status.body).expect("status JSON");
    assert_eq!(status["server"]["health"], "ok");
    let metrics = plain_request_to(proxy, "GET", "/metrics", &host)
        .await
        .unwrap();
    assert!(metrics
        .body
        .contains("# TYPE ciphermq_publishes_total counter"));
    let localhost = format!("localhost:{}", proxy.port());
    let by_name = plain_request_to(proxy, "GET", "/api/queues", &localhost)
        .await
        .unwrap();
    assert_eq!(by_name.status, 200, "localhost is the proxy's own name too");

    let rebound = plain_request_to(
        proxy,
        "GET",
        "/api/status",
        &format!("evil.example:{}", proxy.port()),
    )
    .await
    .unwrap();
    assert_eq!(
        rebound.status, 403,
        "a foreign Host must be refused (DNS rebinding)"
    );
    let post = plain_request_to(proxy, "POST", "/api/status", &host)
        .await
        .unwrap();
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET"));
    let other = plain_request_to(proxy, "GET", "/api/secret", &host)
        .await
        .unwrap();
    assert_eq!(other.status, 404, "only the page's routes are forwarded");

    // Nobody else's loopback.
    let certs = &pki().certs;
    let upstream = admin_endpoint(admin);
    match DashboardProxy::bind("0.0.0.0:0".parse().unwrap(), upstream).await {
        Err(e @ ProxyError::NotLoopback(_)) => assert!(e.to_string().contains("loopback"), "{e}"),
        other => panic!("a wildcard listen address must be refused: {other:?}"),
    }
    // A key that is not the certificate's is named, not a raw rustls error.
    match Credentials::from_files(
        &certs.join("ca.crt"),
        &certs.join("admin.crt"),
        &certs.join("sender_1.key"),
    ) {
        Err(e @ CredentialsError::Identity { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("admin.crt") && text.contains("sender_1.key"),
                "{text}"
            );
        }
        other => panic!("a mismatched key must be refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_live_figures_in_a_real_browser() {
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_with(2, data.path(), "127.0.0.1:0", ADMIN);
    let admin = broker.admin_addr().expect("admin endpoint enabled");

    // A consumed queue and one left with a backlog.
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    check(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
    )
    .await;
    let mut idle = connect_as(&broker, "receiver_2").await;
    setup_receiver(&mut idle, "receiver_2").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for i in 0..BACKLOG {
        let id = format!("backlog-{i}");
        let ack = format!("ACK {id}");
        publish_for(&mut sender, "ex", "receiver_2", "receiver_2", &id, &ack).await;
    }

    let proxy = start_proxy(admin).await;
    let url = format!("http://{proxy}/");

    // The browser runs on its own thread; it samples the page while the
    // traffic below flows, then waits to be told the traffic has stopped.
    let (stopped_tx, stopped_rx) = mpsc::channel::<()>();
    let browser = std::thread::spawn(move || {
        let mut chromium = Chromium::launch();
        let mut page = chromium.open(&url);
        let live = sample_while_flowing(&mut page, Duration::from_secs(6));
        stopped_rx.recv().expect("the traffic ends");
        (chromium, page, live)
    });

    // Traffic for a while: published, delivered, acked.
    let flow_until = Instant::now() + Duration::from_secs(7);
    let mut sent = 0usize;
    while Instant::now() < flow_until {
        for _ in 0..20 {
            let id = format!("live-{sent}");
            publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
            sent += 1;
        }
        let mut pushed = Vec::new();
        while pushed.len() < 20 {
            pushed.push(next_delivery(&mut receiver).await);
        }
        for got in pushed {
            check(
                &mut receiver,
                &format!("ack {}", got.id),
                &format!("ACK_CONFIRMED {}", got.id),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stopped_tx.send(()).unwrap();
    let (mut chromium, mut page, live) = tokio::task::spawn_blocking(move || browser.join())
        .await
        .unwrap()
        .expect("the browser thread");

    assert!(
        live.max_publish_rate > 0.0 && live.max_ack_rate > 0.0,
        "the rates never moved while {sent} messages flowed: {live:?}"
    );
    assert!(
        live.chart_points >= 3,
        "the rate chart holds too few points: {live:?}"
    );

    // Settled: the page must come to show exactly what the endpoint says.
    let expected = settled_figures(admin, sent + BACKLOG).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let shown = tokio::task::block_in_place(|| page.evaluate(EXTRACT));
        if shown["totals"] == expected["totals"]
            && shown["queues"] == expected["queues"]
            && shown["by_cn"] == expected["by_cn"]
        {
            break shown;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed the endpoint's figures:\nshown:    {shown}\nexpected: {expected}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(shown["health"], "ok", "{shown}");
    assert_eq!(shown["reason"], "", "{shown}");
    assert_eq!(shown["corrupt"], "0", "{shown}");
    assert_eq!(shown["mirror"], "off", "{shown}");
    assert!(
        shown["disk_free_bytes"].as_f64().is_some_and(|b| b > 0.0),
        "disk free not shown: {shown}"
    );
    for q in ["p50", "p99"] {
        let cell = shown["publish_ack"][q].as_str().unwrap_or_default();
        assert!(
            cell.ends_with(" ms") || cell.ends_with(" µs") || cell.ends_with(" s"),
            "publish→ACK {q} not shown as a latency: {shown}"
        );
    }
    let publish_path = shown["publish_path"].as_str().unwrap_or_default();
    assert!(
        publish_path.matches('L').count() >= 2,
        "the publish series is not drawn: {shown}"
    );

    let png = tokio::task::block_in_place(|| page.screenshot());
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&shot, &png).expect("save the screenshot");
    println!("dashboard screenshot: {}", shot.display());

    // A broker on its own shows no cluster card.
    let hidden = tokio::task::block_in_place(|| {
        page.evaluate("document.getElementById('cluster-card').hidden")
    });
    assert_eq!(
        hidden,
        json!(true),
        "the cluster card shows on a broker on its own"
    );

    let problems = page.console_problems();
    assert!(
        problems.is_empty(),
        "the page logged or threw: {problems:#?}"
    );
    chromium.close();
    drop((sender, receiver, idle));
}

/// On a cluster node the page shows the live nodes and where each owner
/// lives, as `/api/cluster` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_of_a_cluster_node_shows_the_nodes_and_the_owners() {
    let db = common::pg::TestDb::create().await;
    let sections = |node_id: &str| {
        format!(
            "{}\n[cluster]\nenabled = true\nnode_id = \"{node_id}\"\n{ADMIN}",
            db.config_with_tls(
                "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
                "disable",
                None
            )
        )
    };
    let a = TestBroker::start_with(1, &sections("node-a"));
    let b = TestBroker::start_with(1, &sections("node-b"));
    let mut r1 = connect_as(&a, "receiver_1").await;
    check(
        &mut r1,
        "locate receiver_1",
        &format!("OK locate receiver_1 node-a {} 1", a.addr),
    )
    .await;
    let mut r2 = connect_as(&b, "receiver_2").await;
    check(
        &mut r2,
        "locate receiver_2",
        &format!("OK locate receiver_2 node-b {} 1", b.addr),
    )
    .await;

    let proxy = start_proxy(b.admin_addr().expect("admin endpoint")).await;
    let url = format!("http://{proxy}/");
    let (a_addr, b_addr) = (a.addr.clone(), b.addr.clone());
    let dbname = db.name.clone();
    tokio::task::spawn_blocking(move || {
        let mut chromium = Chromium::launch();
        let mut page = chromium.open(&url);
        const SHOWN: &str = "JSON.stringify({hidden: document.getElementById('cluster-card').hidden, \
            nodes: [...document.querySelectorAll('#cluster-nodes tbody tr[data-node]')].map((tr) => [...tr.children].map((td) => td.textContent).slice(0, 3)), \
            owners: [...document.querySelectorAll('#cluster-owners tbody tr[data-owner]')].map((tr) => [...tr.children].map((td) => td.textContent))})";
        let want = json!({
            "hidden": false,
            "nodes": [["node-a", a_addr, "1"], ["node-b (this node)", b_addr, "1"]],
            "owners": [["receiver_1", "node-a", "1"], ["receiver_2", "node-b", "1"]],
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let shown: Value = page
                .evaluate(SHOWN)
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            if shown == want {
                break;
            }
            assert!(Instant::now() < deadline, "the page shows {shown}, not {want}");
            std::thread::sleep(Duration::from_millis(200));
        }
        // A node that registered and went silent is declared dead: the
        // page lists the takeover, who declared it and why.
        let coordinator = ciphermq_cluster::PgCoordinator::connect(ciphermq_cluster::PgCoordinatorConfig {
            dbname,
            ..Default::default()
        })
        .expect("coordinator");
        use ciphermq_cluster::Coordinator as _;
        coordinator.register("node-c", "127.0.0.1:9").expect("register node-c");
        let seen = coordinator
            .nodes()
            .expect("nodes")
            .into_iter()
            .find(|n| n.node_id == "node-c")
            .expect("node-c listed");
        let suspect = ciphermq_cluster::Suspect {
            node_id: seen.node_id,
            incarnation: seen.incarnation,
            heartbeat_stamp: seen.heartbeat_stamp,
            silent_for: Duration::from_secs(6),
        };
        coordinator
            .declare_dead(&suspect, "test", "silent in a test", Duration::from_secs(5))
            .expect("node-c declared dead");
        const TAKEOVERS: &str = "JSON.stringify({hidden: document.getElementById('cluster-takeovers').hidden, \
            rows: [...document.querySelectorAll('#cluster-takeovers tbody tr[data-takeover]')].map((tr) => [...tr.children].map((td) => td.textContent)).map((r) => [r[0], r[1], r[3], r[4]])})";
        let want = json!({"hidden": false, "rows": [["node-c", "test", "0", "silent in a test"]]});
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let shown: Value = page
                .evaluate(TAKEOVERS)
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            if shown == want {
                break;
            }
            assert!(Instant::now() < deadline, "the page shows {shown}, not {want}");
            std::thread::sleep(Duration::from_millis(200));
        }
        let problems = page.console_problems();
        assert!(problems.is_empty(), "the page logged or threw: {problems:#?}");
        chromium.close();
    })
    .await
    .expect("the browser thread");
}

/// What the page showed while messages flowed.
#[derive(Debug, Default)]
struct Live {
    max_publish_rate: f64,
    max_ack_rate: f64,
    chart_points: u64,
}

/// Reads the page's rates twice a second for `span`.
fn sample_while_flowing(page: &mut Page, span: Duration) -> Live {
    let mut live = Live::default();
    let until = Instant::now() + span;
    while Instant::now() < until {
        let v = page.evaluate(
            "({publish: document.getElementById('rate-publish').textContent, \
              ack: document.getElementById('rate-ack').textContent, \
              points: Number(document.getElementById('rates-chart').dataset.points || 0)})",
        );
        let rate = |k: &str| {
            v[k].as_str()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        live.max_publish_rate = live.max_publish_rate.max(rate("publish"));
        live.max_ack_rate = live.max_ack_rate.max(rate("ack"));
        live.chart_points = live.chart_points.max(v["points"].as_u64().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(500));
    }
    live
}

/// The page's figures, in the shape [`settled_figures`] gives.
const EXTRACT: &str = r#"(() => {
  const t = (id) => { const e = document.getElementById(id); return e ? e.textContent.trim() : null; };
  const queues = {};
  for (const row of document.querySelectorAll('#queues tr[data-queue]')) {
    const cell = (f) => Number(row.querySelector(`td[data-field="${f}"]`).textContent);
    queues[row.dataset.queue] = { ready: cell('ready'), unacked: cell('unacked'), consumers: cell('consumers') };
  }
  const by_cn = {};
  for (const row of document.querySelectorAll('#connections-by-cn tr[data-cn]')) {
    by_cn[row.dataset.cn] = Number(row.querySelector('td[data-field="count"]').textContent);
  }
  const latency = (m) => {
    const out = {};
    for (const td of document.querySelectorAll(`#latency tr[data-metric="${m}"] td[data-q]`)) out[td.dataset.q] = td.textContent.trim();
    return out;
  };
  const path = document.querySelector('#rates-chart path[data-series="publish"]');
  const disk = document.getElementById('disk-free');
  return {
    totals: { publishes: Number(t('total-publishes')), deliveries: Number(t('total-deliveries')), acks: Number(t('total-acks')) },
    queues, by_cn,
    health: t('health'), reason: t('ready-reason'), corrupt: t('corrupt-records'), mirror: t('mirror'),
    disk_free_bytes: disk ? Number(disk.dataset.bytes) : null,
    publish_ack: latency('publish_ack'),
    publish_path: path ? path.getAttribute('d') : null,
    polls: Number(document.body.dataset.polls || 0),
  };
})()"#;

/// The endpoint's own figures once `published` messages are in and every
/// delivery of `receiver_1_queue` is acked (polled until they stop moving).
async fn settled_figures(admin: SocketAddr, published: usize) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let metrics = request(admin, Some("admin"), "GET", "/metrics")
            .await
            .unwrap()
            .body;
        let queues: Value = serde_json::from_str(
            &request(admin, Some("admin"), "GET", "/api/queues")
                .await
                .unwrap()
                .body,
        )
        .unwrap();
        let connections: Value = serde_json::from_str(
            &request(admin, Some("admin"), "GET", "/api/connections")
                .await
                .unwrap()
                .body,
        )
        .unwrap();
        let totals = json!({
            "publishes": total(&metrics, "ciphermq_publishes_total"),
            "deliveries": total(&metrics, "ciphermq_deliveries_total"),
            "acks": total(&metrics, "ciphermq_acks_total"),
        });
        let mut by_queue = serde_json::Map::new();
        for q in queues["queues"].as_array().into_iter().flatten() {
            by_queue.insert(
                q["name"].as_str().unwrap().to_owned(),
                json!({ "ready": q["ready"], "unacked": q["unacked"], "consumers": q["consumers"] }),
            );
        }
        let backlog_shown = by_queue
            .get("receiver_2_queue")
            .is_some_and(|q| q["ready"] == json!(BACKLOG));
        if totals["publishes"] == json!(published)
            && totals["acks"] == json!(published - BACKLOG)
            && backlog_shown
        {
            return json!({ "totals": totals, "queues": by_queue, "by_cn": connections["connections"]["by_cn"] });
        }
        assert!(
            Instant::now() < deadline,
            "the endpoint never settled: {totals} {queues}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of every sample of `name` in a metrics text, as an integer.
fn total(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            (series.split('{').next()? == name).then(|| value.parse::<u64>().ok())?
        })
        .sum()
}

/// Headless Chromium with its DevTools port open, killed when dropped.
struct Chromium {
    child: Child,
    devtools: SocketAddr,
    _profile: tempfile::TempDir,
}

impl Chromium {
    fn launch() -> Chromium {
        let binary = std::env::var_os("CHROMIUM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
        assert!(
            binary.is_file(),
            "{} not found: install Debian's `chromium` package \
             (`apt-get install --no-install-recommends chromium`; ./scripts/test.sh does it) \
             or set CHROMIUM",
            binary.display()
        );
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-extensions",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1400,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // Chromium prints where DevTools listens; the rest of its stderr is
        // drained so it never blocks on a full pipe.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut said = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("DevTools listening on ws://") {
                    let addr = rest.split('/').next().unwrap_or_default().to_owned();
                    let _ = tx.send(Ok(addr));
                } else if said.len() < 50 {
                    said.push(line);
                }
            }
            let _ = tx.send(Err(said.join("\n")));
        });
        let devtools = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(addr)) => addr.parse().expect("DevTools address"),
            Ok(Err(said)) => panic!("chromium exited before opening DevTools:\n{said}"),
            Err(_) => panic!("chromium did not open DevTools within 60 s"),
        };
        Chromium {
            child,
            devtools,
            _profile: profile,
        }
    }

    /// The first tab, navigated to `url` with console and log events on.
    fn open(&mut self, url: &str) -> Page {
        let targets: Value =
            serde_json::from_str(&http_get(self.devtools, "/json/list")).expect("target list");
        let ws = targets
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page target: {targets}"))
            .to_owned();
        let (socket, _) = tungstenite::connect(ws.as_str()).expect("DevTools websocket");
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = socket.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        let mut page = Page {
            socket,
            next_id: 0,
            events: Vec::new(),
        };
        for method in ["Runtime.enable", "Log.enable", "Page.enable"] {
            page.call(method, json!({}));
        }
        page.call("Page.navigate", json!({ "url": url }));
        // Loaded and polled at least twice (rates need two readings).
        let deadline = Instant::now() + Duration::from_secs(30);
        while page
            .evaluate("Number(document.body && document.body.dataset.polls || 0)")
            .as_u64()
            < Some(2)
        {
            assert!(
                Instant::now() < deadline,
                "the page never completed two polls"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        page
    }

    fn close(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        self.close();
    }
}

/// `GET path` on a plain-HTTP loopback address, the whole body.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to DevTools");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // DevTools answers HTTP/1.1 only.
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    // It keeps the connection open whatever is asked: read by length.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).expect("DevTools answer");
        assert!(n > 0, "DevTools closed mid-answer");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .expect("DevTools answer without Content-Length");
            if body.len() >= length {
                return body[..length].to_owned();
            }
        }
    }
}

/// One tab over the DevTools protocol.
struct Page {
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Every event received, in order.
    events: Vec<Value>,
}

impl Page {
    /// Sends `method` and waits for its result, keeping events.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket
            .send(tungstenite::Message::text(message))
            .expect("send to DevTools");
        loop {
            let message = self
                .socket
                .read()
                .unwrap_or_else(|e| panic!("{method}: {e}"));
            let Ok(text) = message.to_text() else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if value["id"] == json!(id) {
                assert!(value.get("error").is_none(), "{method}: {value}");
                return value["result"].clone();
            }
            if value.get("method").is_some() {
                self.events.push(value);
            }
        }
    }

    /// The value of `expression` in the page.
    fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// A PNG of the viewport.
    fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG")
    }

    /// Console calls of any kind, uncaught exceptions, and browser log
    /// entries at warning or error (a failed load, a blocked request).
    fn console_problems(&mut self) -> Vec<Value> {
        // A round trip, so events sent before it are in.
        self.call("Runtime.evaluate", json!({ "expression": "0" }));
        self.events
            .iter()
            .filter(|e| match e["method"].as_str() {
                Some("Runtime.consoleAPICalled") | Some("Runtime.exceptionThrown") => true,
                Some("Log.entryAdded") => {
                    matches!(
                        e["params"]["entry"]["level"].as_str(),
                        Some("warning" | "error")
                    )
                }
                _ => false,
            })
            .cloned()
            .collect()
    }
}
