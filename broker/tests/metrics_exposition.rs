//! `/metrics` as Prometheus itself reads it: a durable broker serves some
//! traffic, and its exposition text must pass `promtool check metrics`
//! (Debian's `prometheus` package; `scripts/test.sh` installs it) without a
//! single lint problem. The publish-to-ACK histogram starts at 50 µs.
//! Per-queue series are opt-in (`admin.queue_metrics`) and capped
//! (`admin.max_queue_series`: the deepest queues get them).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ciphermq_clients::connection::{ClientError, Connection};
use common::admin_http::request;
use common::*;

const ADMIN: &str = "\n[admin]\nenabled = true\naddress = \"127.0.0.1:0\"\n";

/// Messages published, delivered and acked before the scrape.
const MESSAGES: usize = 5;

/// `promtool`: `$PROMTOOL`, else the first on `PATH`, else Debian's path.
/// Fails the test (never skips it) when there is none.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("promtool"));
    on_path
        .chain([PathBuf::from("/usr/bin/promtool")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool not found (on PATH, at /usr/bin/promtool or in $PROMTOOL): \
                 install Debian's `prometheus` package \
                 (`apt-get install --no-install-recommends prometheus`; \
                 ./scripts/test.sh does it)"
            )
        })
}

/// The per-queue families, exported only with `admin.queue_metrics`.
const QUEUE_FAMILIES: [&str; 7] = [
    "ciphermq_queue_ready",
    "ciphermq_queue_unacked",
    "ciphermq_queue_bytes",
    "ciphermq_queue_memory_bytes",
    "ciphermq_queue_on_disk",
    "ciphermq_queue_dedup_ids",
    "ciphermq_queue_consumers",
];

/// Runs `promtool check metrics` on a scrape: it must pass without a single
/// lint problem.
fn assert_promtool_passes(promtool: &std::path::Path, text: &str) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write the scrape");
    let out = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(file.path()).expect("open the scrape"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", promtool.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "promtool check metrics: {}\n--- stdout\n{stdout}--- stderr\n{stderr}--- scrape\n{text}",
        out.status
    );
}

/// The lines of a metrics text that sample `name` (any labels), comments
/// and other families (`name_…`) left out.
fn sample_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .collect()
}

/// The sum of every sample of `name` (any labels) in a metrics text.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            (series.split('{').next()? == name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_check_metrics() {
    let promtool = promtool();
    let data = tempfile::tempdir().expect("tempdir");
    let broker = TestBroker::start_durable_with(1, data.path(), "127.0.0.1:0", ADMIN);
    let admin = broker.admin_addr().expect("admin endpoint enabled");

    // Traffic, so that counters and histograms are not all zero.
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut pushed = Vec::new();
    check_skipping(
        &mut receiver,
        "consume receiver_1_queue",
        "OK consume receiver_1_queue",
        &mut pushed,
    )
    .await;
    let mut sender = connect_as(&broker, "sender_1").await;
    for i in 0..MESSAGES {
        let id = format!("prom-{i}");
        publish_expect(&mut sender, "ex", "receiver_1", &id, &format!("ACK {id}")).await;
    }
    while pushed.len() < MESSAGES {
        pushed.push(next_delivery(&mut receiver).await);
    }
    for got in std::mem::take(&mut pushed) {
        let id = got.id;
        check_skipping(
            &mut receiver,
            &format!("ack {id}"),
            &format!("ACK_CONFIRMED {id}"),
            &mut pushed,
        )
        .await;
    }
    assert!(pushed.is_empty(), "redelivered: {pushed:?}");
    // Refusals, counted by their reason.
    publish_expect(&mut sender, "ex", "nobody", "lost", "NACK lost no_route").await;
    let stranger = ciphermq_clients::connection::TlsClientOptions::for_cn(&pki().certs, "stranger");
    match tokio::time::timeout(TIMEOUT, Connection::connect(&broker.addr, &stranger)).await {
        Ok(Err(ClientError::Refused(line))) => {
            assert_eq!(line, "Access denied: unknown client (role=unknown)")
        }
        other => panic!("stranger not refused: {:?}", other.map(|r| r.map(|_| ()))),
    }

    // The counters are the shard's own; poll until the acks show.
    let deadline = Instant::now() + TIMEOUT;
    let text = loop {
        let reply = request(admin, Some("admin"), "GET", "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics as admin: {e}"));
        assert_eq!(reply.status, 200, "GET /metrics: {}", reply.body);
        if total(&reply.body, "ciphermq_acks_total") >= MESSAGES as f64
            && total(&reply.body, "ciphermq_connections_refused_total") >= 1.0
        {
            break reply.body;
        }
        assert!(
            Instant::now() < deadline,
            "acks never counted:\n{}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(sender);
    drop(receiver);

    let n = MESSAGES as f64;
    assert_eq!(total(&text, "ciphermq_publishes_total"), n, "{text}");
    assert_eq!(
        total(&text, "ciphermq_publish_ack_seconds_count"),
        n,
        "{text}"
    );
    assert!(
        total(&text, "ciphermq_fsync_seconds_count") >= 1.0,
        "{text}"
    );
    // Every log write crosses to the blocking-I/O thread: at least one per
    // fdatasync.
    assert!(
        total(&text, "ciphermq_commit_handoff_seconds_count")
            >= total(&text, "ciphermq_fsync_seconds_count"),
        "{text}"
    );

    assert_promtool_passes(&promtool, &text);
    // Per-queue series are off by default: none of their families at all,
    // and the queues only counted.
    for family in QUEUE_FAMILIES {
        assert!(
            !text.contains(family),
            "{family} exported without admin.queue_metrics:\n{text}"
        );
    }
    assert_eq!(
        sample_lines(&text, "ciphermq_queues"),
        ["ciphermq_queues 1"]
    );
    assert_eq!(
        sample_lines(&text, "ciphermq_queue_series_dropped"),
        ["ciphermq_queue_series_dropped 0"]
    );
    for series in [
        "ciphermq_publish_nacks_total{shard=\"0\",reason=\"no_route\"} 1\n",
        "ciphermq_publish_nacks_total{shard=\"0\",reason=\"queue_full\"} 0\n",
        "ciphermq_connections_refused_total{shard=\"0\",reason=\"unknown_client\"} 1\n",
        "ciphermq_connections_refused_total{shard=\"0\",reason=\"connection_limit\"} 0\n",
    ] {
        assert!(text.contains(series), "no {series:?} in:\n{text}");
    }
    // Bytes on the wire: at least the published bodies in, the deliveries
    // out (each about 200 bytes of JSON plus TLS framing).
    let (received, sent) = (
        total(&text, "ciphermq_received_bytes_total"),
        total(&text, "ciphermq_sent_bytes_total"),
    );
    assert!(received > 200.0 * n && sent > 200.0 * n, "{text}");
    // The process and its certificates, as the kernel and the PEM files
    // have them.
    assert!(
        total(&text, "ciphermq_process_cpu_seconds_total") > 0.0,
        "{text}"
    );
    assert!(
        total(&text, "ciphermq_process_resident_memory_bytes") > 1e6,
        "{text}"
    );
    // Each shard thread's time on a CPU and waiting for one, from the
    // kernel: the executor ran the traffic, its blocking-I/O thread the
    // fsyncs; neither ran longer than the whole process (whose figure
    // `/proc` rounds down to 10 ms ticks: a few ticks of slack, far below
    // what a wrong field or unit would give).
    let process_cpu = total(&text, "ciphermq_process_cpu_seconds_total");
    for thread in ["executor", "blocking_io"] {
        let labels = format!("{{shard=\"0\",thread=\"{thread}\"}} ");
        let value = |family: &str| -> f64 {
            let series = format!("{family}{labels}");
            let line = text
                .lines()
                .find(|l| l.starts_with(&series))
                .unwrap_or_else(|| panic!("no {series:?} in:\n{text}"));
            line[series.len()..].parse().expect("a number")
        };
        let on_cpu = value("ciphermq_shard_thread_cpu_seconds_total");
        assert!(
            on_cpu > 0.0 && on_cpu <= process_cpu + 0.05,
            "{thread}: {on_cpu} s of {process_cpu}"
        );
        assert!(value("ciphermq_shard_thread_cpu_wait_seconds_total") >= 0.0);
    }
    let fds = total(&text, "ciphermq_process_open_fds");
    assert!(
        fds >= 3.0 && fds <= total(&text, "ciphermq_process_max_fds"),
        "{text}"
    );
    let started = total(&text, "ciphermq_process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(started > now - 86_400.0 && started <= now + 1.0, "{text}");
    for certificate in ["server", "ca"] {
        let series =
            format!("ciphermq_tls_certificate_expiry_seconds{{certificate=\"{certificate}\"}} ");
        let line = text
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("no {series:?} in:\n{text}"));
        let secs: f64 = line[series.len()..].parse().expect("a number");
        // Freshly issued: valid for days at least, not for a century.
        assert!(secs > 86_400.0 && secs < 100.0 * 365.0 * 86_400.0, "{line}");
    }
    // The first publish-to-ACK bucket is 50 µs (written as a plain decimal).
    assert!(
        text.contains("ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.00005\"} "),
        "no 50 µs publish-to-ACK bucket:\n{text}"
    );
}

/// With `admin.queue_metrics = true` and `admin.max_queue_series = 2`, of
/// three queues only the two holding the most messages get per-queue
/// series (not the two whose names sort first), the third is counted in
/// `ciphermq_queue_series_dropped`, and the text still passes promtool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_queue_series_go_to_the_deepest_queues_up_to_the_cap() {
    let promtool = promtool();
    let broker = TestBroker::start_with(
        1,
        &format!("{ADMIN}queue_metrics = true\nmax_queue_series = 2\n"),
    );
    let admin = broker.admin_addr().expect("admin endpoint enabled");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    check(
        &mut receiver,
        "declare_exchange ex direct",
        "OK declare_exchange ex",
    )
    .await;
    // Depths 1, 3, 2: the deepest two are b and c, though a sorts first.
    let depths = [
        ("receiver_1_a", 1),
        ("receiver_1_b", 3),
        ("receiver_1_c", 2),
    ];
    for (queue, _) in depths {
        check(
            &mut receiver,
            &format!("declare_queue {queue}"),
            &format!("OK declare_queue {queue}"),
        )
        .await;
        check(
            &mut receiver,
            &format!("bind {queue} ex {queue}"),
            &format!("OK bind {queue} ex {queue}"),
        )
        .await;
    }
    let mut sender = connect_as(&broker, "sender_1").await;
    for (queue, depth) in depths {
        for i in 0..depth {
            let id = format!("{queue}-{i}");
            publish_expect(&mut sender, "ex", queue, &id, &format!("ACK {id}")).await;
        }
    }

    // Queue counts are refreshed about once a second: poll until they show.
    let want_ready = [
        "ciphermq_queue_ready{queue=\"receiver_1_b\",shard=\"0\"} 3",
        "ciphermq_queue_ready{queue=\"receiver_1_c\",shard=\"0\"} 2",
    ];
    let deadline = Instant::now() + TIMEOUT;
    let text = loop {
        let reply = request(admin, Some("monitor_1"), "GET", "/metrics")
            .await
            .expect("/metrics as a monitor");
        assert_eq!(reply.status, 200, "GET /metrics: {}", reply.body);
        if sample_lines(&reply.body, "ciphermq_queue_ready") == want_ready {
            break reply.body;
        }
        assert!(
            Instant::now() < deadline,
            "the two deepest queues never exported alone:\n{}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(sender);
    drop(receiver);

    assert_promtool_passes(&promtool, &text);
    assert_eq!(
        sample_lines(&text, "ciphermq_queues"),
        ["ciphermq_queues 3"]
    );
    assert_eq!(
        sample_lines(&text, "ciphermq_queue_series_dropped"),
        ["ciphermq_queue_series_dropped 1"]
    );
    // Every per-queue family has the same two queues, and never the third.
    for family in QUEUE_FAMILIES {
        let lines = sample_lines(&text, family);
        assert_eq!(lines.len(), 2, "{family}:\n{text}");
        assert!(
            lines[0].starts_with(&format!("{family}{{queue=\"receiver_1_b\",shard=\"0\"}} "))
                && lines[1]
                    .starts_with(&format!("{family}{{queue=\"receiver_1_c\",shard=\"0\"}} ")),
            "{family}: {lines:?}"
        );
    }
    assert!(!text.contains("receiver_1_a"), "{text}");
    // The per-shard sums still count every queue's bodies.
    assert!(
        total(&text, "ciphermq_shard_queued_bytes") > total(&text, "ciphermq_queue_bytes"),
        "{text}"
    );
}

/// Dead-letter moves and rate-limited commands are counted: a message
/// nacked past `max_deliveries` goes to its `.dlq`, and a CN past its
/// command bucket is answered `Rate limited`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_rate_limited_commands_are_counted() {
    let broker = TestBroker::start_with(
        1,
        &format!(
            "\n[performance]\nmax_deliveries = 1\n\
             [rate_limit]\nenabled = true\nglobal_rps = 1\nglobal_burst = 40\n{ADMIN}"
        ),
    );
    let admin = broker.admin_addr().expect("admin endpoint enabled");
    let mut receiver = connect_as(&broker, "receiver_1").await;
    setup_receiver(&mut receiver, "receiver_1").await;
    let mut sender = connect_as(&broker, "sender_1").await;
    publish_expect(&mut sender, "ex", "receiver_1", "dl-1", "ACK dl-1").await;
    let got = fetch(&mut receiver, "receiver_1_queue", 1).await;
    assert_eq!(got.len(), 1);
    check(&mut receiver, "nack dl-1", "NACK_CONFIRMED dl-1").await;
    let dead = fetch(&mut receiver, "receiver_1_queue.dlq", 10).await;
    assert_eq!(dead.len(), 1, "dl-1 is in the dead-letter queue");
    // A bucket of 40 at 1 a second: the rest of a quick run of heartbeats
    // is refused.
    let mut limited = 0;
    for _ in 0..60 {
        match ask(&mut sender, "heartbeat").await.as_str() {
            "OK heartbeat" => {}
            "Rate limited" => limited += 1,
            other => panic!("heartbeat answered {other:?}"),
        }
    }
    assert!(limited >= 15, "{limited} heartbeats limited");

    // Dead-letter moves are published with the shard's 1 s refresh.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let reply = request(admin, Some("monitor_1"), "GET", "/metrics")
            .await
            .expect("/metrics as a monitor");
        let text = reply.body;
        let rate_limited = total(&text, "ciphermq_rate_limited_total");
        assert!(rate_limited >= limited as f64, "{text}");
        if total(&text, "ciphermq_dead_lettered_total") == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dead letter never counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
