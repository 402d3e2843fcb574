//! Routing a publish against an exchange's bindings: direct (hash lookup),
//! topic with 10,000 bindings mixing exact words, `*` and `#`, and fanout.
//!
//! Run: `cargo bench -p ciphermq-bench --bench routing`

use std::hint::black_box;
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::routing::{Exchange, Target};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Bindings per exchange.
const BINDINGS: usize = 10_000;
/// Distinct queues they point at.
const QUEUES: usize = 1_000;

fn target(i: usize) -> Target {
    Target {
        queue: Arc::from(format!("receiver_{}_queue", i % QUEUES)),
        shard: (i % 2) as u16,
    }
}

/// 10,000 direct bindings `receiver_<i>`.
fn direct() -> Exchange {
    let mut ex = Exchange::new(ExchangeKind::Direct);
    for i in 0..BINDINGS {
        ex.bind(&format!("receiver_{i}"), target(i));
    }
    ex
}

/// 10,000 topic bindings over 100 tenants × 100 regions: 60% exact
/// (`tenant<a>.region<b>.orders.created`), 20% `*`
/// (`tenant<a>.*.orders.<kind>`), 20% `#` (`tenant<a>.region<b>.#`).
fn topic() -> Exchange {
    let mut ex = Exchange::new(ExchangeKind::Topic);
    for i in 0..BINDINGS {
        let (a, b) = (i / 100, i % 100);
        let key = match i % 10 {
            0 | 1 => format!("tenant{a}.*.orders.kind{b}"),
            2 | 3 => format!("tenant{a}.region{b}.#"),
            _ => format!("tenant{a}.region{b}.orders.created"),
        };
        ex.bind(&key, target(i));
    }
    ex
}

fn fanout(queues: usize) -> Exchange {
    let mut ex = Exchange::new(ExchangeKind::Fanout);
    for i in 0..queues {
        ex.bind("", target(i));
    }
    ex
}

fn routing(c: &mut Criterion) {
    let mut g = c.benchmark_group("route");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);

    let ex = direct();
    g.bench_function("direct_10k_hit", |b| {
        b.iter(|| {
            out.clear();
            ex.route(black_box("receiver_4242"), &mut out);
            out.len()
        })
    });
    g.bench_function("direct_10k_miss", |b| {
        b.iter(|| {
            out.clear();
            ex.route(black_box("receiver_none"), &mut out);
            out.len()
        })
    });

    let ex = topic();
    // tenant42 owns bindings 4200..4300: region<b> with b % 10 in {0, 1} has a
    // `*` binding on kind<b>, in {2, 3} a `#` binding, otherwise an exact one.
    for (name, key) in [
        ("topic_10k_exact", "tenant42.region48.orders.created"),
        ("topic_10k_star_and_hash", "tenant42.region42.orders.kind40"),
        ("topic_10k_miss", "tenant4242.region1.orders.created"),
        (
            "topic_10k_hash_deep_key",
            "tenant42.region43.a.b.c.d.e.f.g.h",
        ),
    ] {
        out.clear();
        ex.route(key, &mut out);
        assert!(
            name.ends_with("miss") == out.is_empty(),
            "{name}: {key} routed to {} queues",
            out.len()
        );
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                ex.route(black_box(key), &mut out);
                out.len()
            })
        });
    }

    for queues in [10, 100] {
        let ex = fanout(queues);
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("fanout_{queues}"), |b| {
            b.iter(|| {
                out.clear();
                ex.route(black_box("any"), &mut out);
                out.len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
