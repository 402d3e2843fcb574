//! Routing a publish against an exchange's bindings: direct (hash lookup),
//! topic with 10,000 bindings mixing exact words, `*` and `#`, and fanout;
//! then (`route_hostile`) 10,000 topic bindings built to be expensive (many
//! `#`, `#.#.#`, `*.#.*`, global `#.…` patterns) against the key that makes
//! the matcher do the most work, next to a direct exact-key lookup.
//!
//! `route_hostile` also routes a stream of keys chosen so that the topic
//! matcher's DFA cache cannot hold their states (patterns whose DFA has
//! exponentially many states), where it falls back to the NFA walk, and
//! checks that a cached match allocates nothing.
//!
//! Run: `cargo bench -p ciphermq-bench --bench routing`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;
use ciphermq_shard::routing::{Exchange, Target};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// The system allocator, counting allocations so that the bench can check
/// that routing a cached key allocates nothing.
struct Counting;

/// Allocations so far (all threads).
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by 1,000 routes of `key` after a first one.
fn allocations_per_1000_routes(ex: &Exchange, key: &str) -> usize {
    let mut out = Vec::with_capacity(64);
    ex.route(key, &mut out);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        out.clear();
        ex.route(black_box(key), &mut out);
    }
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Bindings per exchange.
const BINDINGS: usize = 10_000;
/// Distinct queues they point at.
const QUEUES: usize = 1_000;

fn target(i: usize) -> Target {
    Target {
        queue: Arc::from(format!("receiver_{}_queue", i % QUEUES)),
        shard: (i % 2) as u16,
        // Receiver-owned, as a receiver's queue is: routing clones this too.
        confined_to: Some(Arc::from(format!("receiver_{}", i % QUEUES))),
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

/// 10,000 topic bindings chosen to be expensive, 100 per tenant over 100
/// tenants (`b` the binding's number within its tenant, `w<b>` a word only it
/// uses), by `b % 10`:
/// 0 `tenant<a>.#.#.#.w<b>` (a run of `#`),
/// 1 `tenant<a>.#.x.#.x.#.x.#.x.#.x.#.x.#.x.#.w<b>` (8 `#`, the cap, kept apart),
/// 2 `tenant<a>.*.#.*.w<b>`, 3 `tenant<a>.#.*.#.*.#.*.w<b>` (stored as
/// `*.*.#` and `*.*.*.#` runs), 4 `tenant<a>.*.*.*.#.w<b>.#`,
/// 5 `tenant<a>` and 14 `.#` (the reported bomb),
/// 6 to 9 the ordinary ones of [`topic`]; tenant 0's family-5 bindings are
/// `#.w<b>.#` instead, patterns every key walks through.
fn hostile_topic() -> Exchange {
    let mut ex = Exchange::new(ExchangeKind::Topic);
    for i in 0..BINDINGS {
        let (a, b) = (i / 100, i % 100);
        let key = match b % 10 {
            0 => format!("tenant{a}.#.#.#.w{b}"),
            1 => format!("tenant{a}{}.#.w{b}", ".#.x".repeat(7)),
            2 => format!("tenant{a}.*.#.*.w{b}"),
            3 => format!("tenant{a}.#.*.#.*.#.*.w{b}"),
            4 => format!("tenant{a}.*.*.*.#.w{b}.#"),
            5 if a == 0 => format!("#.w{b}.#"),
            5 => format!("tenant{a}{}", ".#".repeat(14)),
            6 => format!("tenant{a}.*.orders.kind{b}"),
            7 => format!("tenant{a}.region{b}.#"),
            _ => format!("tenant{a}.region{b}.orders.created"),
        };
        assert!(
            ciphermq_proto::is_valid_routing_pattern(&key),
            "{key} is within the caps"
        );
        ex.bind(&key, target(i));
    }
    ex
}

/// [`hostile_topic`] and 10 patterns whose DFA has exponentially many
/// states: `#.x` followed by 5 to 14 `*` (a state per pattern of `x` among
/// the last 15 words).
fn blowup_topic() -> Exchange {
    let mut ex = hostile_topic();
    for stars in 5..15 {
        ex.bind(&format!("#.x{}", ".*".repeat(stars)), target(stars));
    }
    ex
}

/// `count` keys of 32 words, `tenant42` then random `x` and `y` (xorshift,
/// fixed seed): few share a DFA state beyond their first words.
fn random_keys(count: usize) -> Vec<String> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..count)
        .map(|_| {
            let mut key = String::from("tenant42");
            for _ in 1..ciphermq_proto::name::MAX_ROUTING_KEY_WORDS {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                key.push_str(if state & 1 == 0 { ".x" } else { ".y" });
            }
            key
        })
        .collect()
}

/// The key of at most `MAX_ROUTING_KEY_WORDS` words under `tenant42` that
/// costs the matcher the most (in [`Exchange::topic_match_cost`] visits),
/// found greedily: each next word is the one, among the bindings' literal
/// words after the tenant (`x`, `orders`, `w<b>`, `region<b>`) and one no
/// binding uses, after which the key costs most. Words that keep many `#` and
/// `*` states alive, and reach the ends of many patterns, win.
fn worst_key(ex: &Exchange) -> String {
    let mut vocabulary: Vec<String> = vec!["x".into(), "orders".into(), "unused".into()];
    vocabulary.extend((0..100).map(|b| format!("w{b}")));
    vocabulary.extend((0..100).map(|b| format!("region{b}")));
    let mut key = String::from("tenant42");
    for _ in 1..ciphermq_proto::name::MAX_ROUTING_KEY_WORDS {
        let best = vocabulary
            .iter()
            .map(|w| format!("{key}.{w}"))
            .max_by_key(|k| ex.topic_match_cost(k))
            .expect("a vocabulary");
        key = best;
    }
    assert!(ciphermq_proto::name::is_valid_routing_key(&key));
    key
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

/// Hostile bindings and keys, side by side with a direct lookup.
fn hostile(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_hostile");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);

    let mut ex = direct();
    g.bench_function("direct_10k_hit", |b| {
        b.iter(|| {
            out.clear();
            ex.route(black_box("receiver_4242"), &mut out);
            out.len()
        })
    });
    // As many queues as the worst topic key reaches: the cost of the
    // delivery list itself (cloning and dropping 31 targets).
    for i in 0..30 {
        ex.bind("receiver_4242", target(4243 + i));
    }
    g.bench_function("direct_10k_hit_31_queues", |b| {
        b.iter(|| {
            out.clear();
            ex.route(black_box("receiver_4242"), &mut out);
            out.len()
        })
    });

    let ex = hostile_topic();
    let worst = worst_key(&ex);
    let bomb = format!("tenant42{}", ".x".repeat(31));
    for (name, key) in [
        ("topic_hostile_10k_worst_key", worst.as_str()),
        ("topic_hostile_10k_bomb_key_32_words", bomb.as_str()),
        (
            "topic_hostile_10k_exact",
            "tenant42.region48.orders.created",
        ),
        ("topic_hostile_10k_miss", "tenant4242.x.x.x.x.x.x.x.x"),
    ] {
        out.clear();
        ex.route(key, &mut out);
        eprintln!(
            "{name}: {} words, {} matcher visits, {} queues: {key}",
            key.split('.').count(),
            ex.topic_match_cost(key),
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
    eprintln!(
        "allocations per 1000 cached routes of the worst key: {}",
        allocations_per_1000_routes(&ex, &worst)
    );

    // A new key each time, from a pool whose DFA states (2^15 and more)
    // overflow the matcher's cache: what a client choosing its keys to
    // defeat the cache makes each publish cost.
    let ex = blowup_topic();
    let keys = random_keys(4096);
    let visits: usize = keys.iter().map(|k| ex.topic_match_cost(k)).sum();
    eprintln!(
        "topic_blowup_10k_random_keys: {} keys of 32 words, {} matcher visits on average",
        keys.len(),
        visits / keys.len()
    );
    let mut next = keys.iter().cycle();
    g.bench_function("topic_blowup_10k_random_keys", |b| {
        b.iter(|| {
            out.clear();
            let key = next.next().map_or("", String::as_str);
            ex.route(black_box(key), &mut out);
            out.len()
        })
    });
    g.finish();
}

criterion_group!(benches, routing, hostile);
criterion_main!(benches);
