//! End-to-end encryption per payload size, as `ciphermq_clients::crypto` does
//! it for every message: a sealed box (X25519 + XSalsa20-Poly1305) around a
//! fresh session key, and ChaCha20-Poly1305 over the body with the message id
//! as associated data; and the receiver's side, opening both.
//!
//! Run: `cargo bench -p ciphermq-bench --bench crypto`

use std::hint::black_box;

use ciphermq_clients::crypto::{decrypt, encrypt_with_rng, generate_secret_key, KEY_BYTES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::RngCore;

const ID: &str = "sender_1-000000042-receiver_1";

fn crypto(c: &mut Criterion) {
    let secret = generate_secret_key();
    let public = secret.public_key();
    let mut rng = rand::thread_rng();

    let mut g = c.benchmark_group("sealed_box");
    g.throughput(Throughput::Elements(1));
    let session_key = [7u8; KEY_BYTES];
    g.bench_function("seal_session_key", |b| {
        b.iter(|| {
            public
                .seal(&mut rng, black_box(&session_key))
                .expect("seal")
        })
    });
    let sealed = public.seal(&mut rng, &session_key).expect("seal");
    g.bench_function("open_session_key", |b| {
        b.iter(|| secret.unseal(black_box(&sealed)).expect("unseal"))
    });
    g.finish();

    let mut g = c.benchmark_group("message");
    for size in [256usize, 1024, 16 * 1024, 64 * 1024] {
        let mut plaintext = vec![0u8; size];
        rng.fill_bytes(&mut plaintext);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("encrypt", size), &plaintext, |b, p| {
            b.iter(|| encrypt_with_rng(&mut rng, &public, ID, "receiver_1", black_box(p)))
        });
        let message =
            encrypt_with_rng(&mut rng, &public, ID, "receiver_1", &plaintext).expect("encrypt");
        g.bench_with_input(BenchmarkId::new("decrypt", size), &message, |b, m| {
            b.iter(|| decrypt(&secret, black_box(m)).expect("decrypt"))
        });
        let json = serde_json::to_string(&message).expect("json");
        g.bench_with_input(
            BenchmarkId::new("encrypt_to_json", size),
            &plaintext,
            |b, p| {
                b.iter(|| {
                    let m = encrypt_with_rng(&mut rng, &public, ID, "receiver_1", black_box(p))
                        .expect("encrypt");
                    serde_json::to_vec(&m).expect("json").len()
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("json_to_decrypt", size), &json, |b, j| {
            b.iter(|| {
                let m: ciphermq_clients::crypto::EncryptedInputData =
                    serde_json::from_str(black_box(j)).expect("json");
                decrypt(&secret, &m).expect("decrypt").len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, crypto);
criterion_main!(benches);
