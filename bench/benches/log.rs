//! The durable queue log's CPU cost per message, without I/O: encoding a
//! message record with a 1 KiB body (length, CRC-32C, fields), decoding it back
//! as recovery does, and `QueueLog::append_message`, which a durable publish
//! pays on the shard thread before its group commit.
//!
//! Run: `cargo bench -p ciphermq-bench --bench log`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ciphermq_shard::log::record::{decode, encode, Decoded, Framing, Record};
use ciphermq_shard::log::{JobIo, QueueLog};
use ciphermq_shard::{Message, Route};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Body size of the benchmarked message.
const BODY_BYTES: usize = 1024;
/// Appends per commit round: the log hands its buffer to a job after each.
const ROUND: u64 = 64;

/// A 1 KiB `EncryptedInputData`-shaped body.
fn body() -> String {
    let head = r#"{"message_id":"sender_1-000000042-receiver_1","receiver_client_id":"receiver_1","nonce":"AAECAwQFBgcICQoL","ciphertext":""#;
    let filler: String = (0..BODY_BYTES - head.len() - 2)
        .map(|i| {
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i % 64] as char
        })
        .collect();
    format!(r#"{head}{filler}"}}"#)
}

fn message() -> Arc<Message> {
    let route = Route {
        exchange: "bench_direct",
        routing_key: "receiver_1.q0",
        sent_at_ms: 1_700_000_000_000,
    };
    Message::published(
        "sender_1-000000042-receiver_1",
        &body(),
        Arc::from("sender_1"),
        route,
    )
}

fn record(msg: &Message) -> Record<'_> {
    let route = msg.route();
    Record::Message {
        seq: 42,
        sender: msg.sender(),
        message_id: msg.message_id(),
        exchange: route.exchange,
        routing_key: route.routing_key,
        sent_at_ms: route.sent_at_ms,
        body: msg.body(),
    }
}

fn log(c: &mut Criterion) {
    let msg = message();
    assert_eq!(msg.body().len(), BODY_BYTES);
    let rec = record(&msg);
    let mut encoded = Vec::new();
    encode(&rec, &mut encoded);
    match decode(Framing::V2, &encoded) {
        Decoded::Record(back, len) => assert!(back == rec && len == encoded.len()),
        other => panic!("the record does not decode: {other:?}"),
    }

    let mut g = c.benchmark_group("log");
    g.throughput(Throughput::Bytes(encoded.len() as u64));
    let mut out = Vec::with_capacity(2 * encoded.len());
    g.bench_function("encode_message_1k", |b| {
        b.iter(|| {
            out.clear();
            encode(black_box(&rec), &mut out);
            out.len()
        })
    });
    g.bench_function("decode_message_1k", |b| {
        b.iter(|| match decode(Framing::V2, black_box(&encoded)) {
            Decoded::Record(_, len) => len,
            _ => 0,
        })
    });

    let dir = tempfile::tempdir().expect("a temporary directory");
    let queue: Arc<str> = Arc::from("receiver_1_queue");
    // Segments never fill: no I/O happens, only encoding into the pending buffer.
    let mut log = QueueLog::new(dir.path().join("receiver_1_queue"), 1 << 40, 0);
    let mut seq = 0u64;
    g.bench_function("queue_log_append_message_1k", |b| {
        // Timed in rounds; taking each round's job (as the committer does)
        // stays outside the measurement.
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let round = left.min(ROUND);
                let start = Instant::now();
                for _ in 0..round {
                    log.append_message(seq, black_box(&msg));
                    seq += 1;
                }
                timed += start.elapsed();
                let job = log
                    .take_job(&queue, seq, false, u64::MAX)
                    .expect("appends make the log dirty");
                log.job_written(&job, true);
                log.job_done(&job, JobIo::Done);
                left -= round;
            }
            timed
        })
    });
    g.finish();
}

criterion_group!(benches, log);
criterion_main!(benches);
