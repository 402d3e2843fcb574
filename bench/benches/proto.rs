//! Hot paths of the `ciphermq/1` wire format, per message: what the broker does
//! with every publish line (parse, body check, `ACK`, delivery line) and what a
//! client does with every reply.
//!
//! Run: `cargo bench -p ciphermq-bench --bench proto`

use std::hint::black_box;

use ciphermq_proto::delivery::write_delivery;
use ciphermq_proto::reply::write_ack;
use ciphermq_proto::{inspect_message, Delivery, Reply, Request};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// An `EncryptedInputData` body of about `size` bytes, shaped like a real one
/// (80-byte sealed key, 12-byte nonce, base64 ciphertext).
fn envelope(size: usize) -> String {
    let head = format!(
        r#"{{"message_id":"sender_1-000000042-receiver_1","receiver_client_id":"receiver_1","enc_session_key":"{}","nonce":"AAECAwQFBgcICQoL","ciphertext":""#,
        "k".repeat(108)
    );
    let filler = size.saturating_sub(head.len() + 2).max(4);
    let chars: String = (0..filler)
        .map(|i| {
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i % 64] as char
        })
        .collect();
    format!(r#"{head}{chars}"}}"#)
}

fn broker_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("broker");
    for size in [256usize, 1024, 16 * 1024] {
        let body = envelope(size);
        let line = format!("publish bench_direct receiver_1.q0 {body}");
        g.throughput(Throughput::Bytes(line.len() as u64));
        g.bench_with_input(BenchmarkId::new("request_parse", size), &line, |b, l| {
            b.iter(|| Request::parse(black_box(l)).expect("a publish"))
        });
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("inspect_message", size),
            &body,
            |b, body| b.iter(|| inspect_message(black_box(body)).expect("a valid body")),
        );
        g.throughput(Throughput::Bytes(line.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("parse_and_inspect", size),
            &line,
            |b, l| {
                b.iter(|| match Request::parse(black_box(l)) {
                    Ok(Request::Publish { body, .. }) => inspect_message(body).is_ok(),
                    _ => false,
                })
            },
        );
        let mut out = Vec::with_capacity(size + 128);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("write_delivery", size),
            &body,
            |b, body| {
                b.iter(|| {
                    out.clear();
                    write_delivery(
                        &mut out,
                        "sender_1-000000042-receiver_1",
                        "receiver_1_bench_q0",
                        1,
                        black_box(body.as_bytes()),
                    );
                    out.len()
                })
            },
        );
    }
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);
    g.bench_function("write_ack", |b| {
        b.iter(|| {
            out.clear();
            write_ack(&mut out, black_box("sender_1-000000042-receiver_1"));
            out.len()
        })
    });
    let ack_line = "ack sender_1-000000042-receiver_1 receiver_1_bench_q0";
    g.bench_function("request_parse_ack", |b| {
        b.iter(|| Request::parse(black_box(ack_line)).expect("an ack"))
    });
    g.finish();
}

fn client_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("client");
    g.throughput(Throughput::Elements(1));
    g.bench_function("reply_parse_ack", |b| {
        b.iter(|| Reply::parse(black_box("ACK sender_1-000000042-receiver_1")))
    });
    let delivery = format!(
        "Message: sender_1-000000042-receiver_1 receiver_1_bench_q0 1 {}",
        envelope(1024)
    );
    g.bench_function("delivery_parse_1024", |b| {
        b.iter(|| Delivery::parse(black_box(&delivery)).expect("a delivery"))
    });
    g.finish();
}

criterion_group!(benches, broker_side, client_side);
criterion_main!(benches);
