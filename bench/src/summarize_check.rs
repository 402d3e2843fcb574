//! `bench/summarize.py` read against JSON this crate writes.
//!
//! The script turns `bench/run-compare.sh`'s result files into the tables
//! BENCHMARKS.md quotes, and it reads fields by name from this crate's
//! [`Report`]. These tests write reports with known rates under the file
//! names `run-compare.sh` uses, run the script, and check the ratios it
//! prints: a renamed field or a changed file name fails here, not in the
//! middle of a 45-minute benchmark invocation.

use std::path::Path;
use std::process::Command;

use clap::Parser;

use crate::args::Cli;
use crate::report::{Report, RunResult};
use crate::scenario::Outcome;
use crate::timeline::Latencies;

/// One run of 10 s that acked `publish_rate` msg/s, delivered `consume_rate`
/// msg/s (and expected `expected` deliveries), with every ack taking
/// `ack_ms`.
fn run(publish_rate: u64, consume_rate: u64, expected: u64, ack_ms: u64) -> RunResult {
    let mut ack_latency = Latencies::default();
    let mut e2e_latency = Latencies::default();
    for i in 0..100 {
        ack_latency.record(i * 1_000, i * 1_000 + ack_ms * 1_000);
        if consume_rate > 0 {
            e2e_latency.record(i * 1_000, i * 1_000 + 2_000);
        }
    }
    let outcome = Outcome {
        t0_us: 0,
        consume_t0_us: 0,
        sent: publish_rate * 10,
        acked: publish_rate * 10,
        nacked: 0,
        delivered: consume_rate * 10,
        expected,
        foreign: 0,
        undecryptable: 0,
        last_ack_us: 10_000_000,
        last_delivery_us: if consume_rate > 0 { 10_000_000 } else { 0 },
        ack_latency,
        e2e_latency,
        send_lag: crate::scenario::histogram(),
    };
    let mut r = RunResult::new("ciphermq", 1, 1024, &outcome);
    r.broker_cpu_us_per_msg = Some(4.0);
    // As a cluster run records it: the script must not mind the field.
    r.stream = Some(crate::placement::Stream {
        receiver: "receiver_1".into(),
        address: "127.0.0.1:5701".into(),
        node_id: Some("node-2".into()),
        epoch: Some(1),
        seed: "127.0.0.1:5700".into(),
    });
    r
}

/// Writes one report of `runs` as `dir/name.json`, as `--json` does.
fn write(dir: &Path, name: &str, consumers: usize, runs: Vec<RunResult>) {
    let consumers = consumers.to_string();
    let cli = Cli::parse_from(["ciphermq-bench", "--consumers", consumers.as_str()]);
    let report = Report::new(&cli.load, "test".into(), runs);
    let json = report.to_json().expect("a report serializes");
    std::fs::write(dir.join(format!("{name}.json")), json.to_string()).expect("write a report");
}

/// Adjacent pairs of 1-publisher runs with a consumer that keeps up, as
/// `{section}-{side}-p1-r{pair}.json`: `sides` names the two sides and
/// their ACK latency (ms), `pairs` holds (pair, first side's rate, second
/// side's rate).
fn write_pairs(dir: &Path, section: &str, sides: [(&str, u64); 2], pairs: &[(u32, u64, u64)]) {
    for &(pair, first, second) in pairs {
        for ((side, ack_ms), rate) in sides.into_iter().zip([first, second]) {
            let name = format!("{section}-{side}-p1-r{pair}");
            write(dir, &name, 1, vec![run(rate, rate, rate * 10, ack_ms)]);
        }
    }
}

/// The script's Markdown for `dir`.
fn summarize(dir: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("summarize.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "summarize.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The table row of `text` that starts with `prefix`.
fn row<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row starting {prefix:?} in:\n{text}"))
}

#[test]
fn mixed_load_ratio_is_taken_within_each_pair() {
    let dir = tempfile::tempdir().unwrap();
    // Publish-only, then 1 + 1: ratios 0.90, 0.80 and 0.85, median 0.85.
    for (pair, alone, mixed) in [
        (1, 200_000, 180_000),
        (2, 250_000, 200_000),
        (3, 100_000, 85_000),
    ] {
        write(
            dir.path(),
            &format!("mixed-p1-c0-r{pair}"),
            0,
            vec![run(alone, 0, 0, 5)],
        );
        write(
            dir.path(),
            &format!("mixed-p1-c1-r{pair}"),
            1,
            vec![run(mixed, mixed, mixed * 10, 5)],
        );
    }
    // One consumer that keeps up, and one that falls behind.
    write(
        dir.path(),
        "mixed-p4-c1",
        1,
        vec![run(150_000, 150_000, 1_500_000, 7)],
    );
    write(
        dir.path(),
        "mixed-p16-c1",
        1,
        vec![run(150_000, 100_000, 1_500_000, 7)],
    );
    let text = summarize(dir.path());

    assert_eq!(
        row(&text, "| 1 |"),
        "| 1 | 200,000 | 180,000 | 0.90 | 4.0 / 4.0 |"
    );
    assert_eq!(
        row(&text, "| 2 |"),
        "| 2 | 250,000 | 200,000 | 0.80 | 4.0 / 4.0 |"
    );
    assert!(
        text.contains("Median 1 + 1 ÷ publish-only: **0.85** (the target is 0.90)."),
        "{text}"
    );
    assert!(
        row(&text, "| 4 publishers |").ends_with("| yes |"),
        "{text}"
    );
    assert!(
        row(&text, "| 16 publishers |").ends_with("| NO |"),
        "{text}"
    );
}

#[test]
fn before_after_ratio_is_new_over_base_within_each_pair() {
    let dir = tempfile::tempdir().unwrap();
    // 1 publisher: new ÷ base 1.10, 0.95, 1.00, median 1.00.
    let pairs = [
        (1, 100_000, 110_000),
        (2, 200_000, 190_000),
        (3, 150_000, 150_000),
    ];
    write_pairs(dir.path(), "ab", [("base", 4), ("new", 2)], &pairs);
    // A pair missing its second side is left out, not half-counted.
    write(
        dir.path(),
        "ab-base-p4-r1",
        1,
        vec![run(100_000, 100_000, 1_000_000, 4)],
    );
    let text = summarize(dir.path());

    let one = row(&text, "| 1 | 3 |");
    assert!(
        one.starts_with("| 1 | 3 | **100%** (95%–110%) | **100%** (95%–110%) |"),
        "{one}"
    );
    assert!(one.contains("| 4.00 / 2.00 |"), "ACK p99 base / new: {one}");
    assert!(!text.contains("| 4 | "), "a half pair made a row:\n{text}");
}

#[test]
fn durable_over_memory_ratio_is_taken_within_each_pair() {
    let dir = tempfile::tempdir().unwrap();
    // Durable ÷ in-memory 0.50, 0.60 and 0.70, median 0.60.
    let pairs = [
        (1, 50_000, 100_000),
        (2, 60_000, 100_000),
        (3, 70_000, 100_000),
    ];
    write_pairs(
        dir.path(),
        "durability",
        [("durable", 3), ("memory", 1)],
        &pairs,
    );
    let text = summarize(dir.path());

    assert!(
        row(&text, "| 1 | 3 |")
            .starts_with("| 1 | 3 | **60%** (50%–70%) | 60,000 | 100,000 | 3.00 |"),
        "{text}"
    );
}

/// A drain run (`--consume-backlog`): `rate` deliveries a second from the
/// consumers' start at 10 s, after 200,000 publishes acked in the first 10 s.
fn drain_run(target: &'static str, rate: u64) -> RunResult {
    let drained_us = 200_000 * 1_000_000 / rate;
    let outcome = Outcome {
        t0_us: 0,
        consume_t0_us: 10_000_000,
        sent: 200_000,
        acked: 200_000,
        nacked: 0,
        delivered: 200_000,
        expected: 200_000,
        foreign: 0,
        undecryptable: 0,
        last_ack_us: 10_000_000,
        last_delivery_us: 10_000_000 + drained_us,
        ack_latency: Latencies::default(),
        e2e_latency: Latencies::default(),
        send_lag: crate::scenario::histogram(),
    };
    RunResult::new(target, 1, 1024, &outcome)
}

#[test]
fn a_drain_s_consume_rate_counts_from_the_consumers_start() {
    let dir = tempfile::tempdir().unwrap();
    let runs = vec![
        drain_run("ciphermq", 400_000),
        drain_run("rabbitmq", 20_000),
        drain_run("nats", 100_000),
    ];
    // Measured from the first publish, CipherMQ's rate would be under
    // 20,000 msg/s: the publishing phase must not count.
    assert_eq!(runs[0].consume_msgs_per_sec.round(), 400_000.0);
    assert_eq!(runs[0].publish_msgs_per_sec.round(), 20_000.0);
    write(dir.path(), "drain-durable-s1-b1024", 1, runs);
    let text = summarize(dir.path());

    assert!(
        row(&text, "| 1 KiB |")
            .starts_with("| 1 KiB | 200,000 | 400,000 | 20,000 | 100,000 | 20.00x | 4.00x |"),
        "{text}"
    );
    assert!(row(&text, "| 1 KiB |").ends_with("| yes |"), "{text}");
}
