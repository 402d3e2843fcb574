use ciphermq_stats::ShardStats;

use super::queues::{deepest, depth};
use super::*;

#[test]
fn families_samples_and_escaping() {
    let mut e = Exposition::default();
    e.family("ciphermq_x_total", Kind::Counter, "Line one\nline \\two.");
    e.sample_u64("ciphermq_x_total", &[("shard", "0")], 7);
    e.sample_u64("ciphermq_x_total", &[("queue", "a\"b\\c\nd")], 1);
    e.family("ciphermq_y", Kind::Gauge, "Y.");
    e.sample("ciphermq_y", &[], 0.25);
    e.sample("ciphermq_y", &[], f64::NAN);
    e.sample("ciphermq_y", &[], f64::INFINITY);
    assert_eq!(
        e.finish(),
        "# HELP ciphermq_x_total Line one\\nline \\\\two.\n\
         # TYPE ciphermq_x_total counter\n\
         ciphermq_x_total{shard=\"0\"} 7\n\
         ciphermq_x_total{queue=\"a\\\"b\\\\c\\nd\"} 1\n\
         # HELP ciphermq_y Y.\n\
         # TYPE ciphermq_y gauge\n\
         ciphermq_y 0.25\n\
         ciphermq_y NaN\n\
         ciphermq_y +Inf\n"
    );
}

#[test]
fn histograms_are_cumulative_in_seconds() {
    let h = HistogramSnapshot {
        bounds_us: &[100, 2_500, 1_000_000],
        counts: vec![1, 0, 2, 1],
        sum_us: 1_502_600,
    };
    let mut e = Exposition::default();
    e.family("ciphermq_fsync_seconds", Kind::Histogram, "Fsyncs.");
    e.histogram("ciphermq_fsync_seconds", &[("shard", "1")], &h);
    assert_eq!(
        e.finish(),
        "# HELP ciphermq_fsync_seconds Fsyncs.\n\
         # TYPE ciphermq_fsync_seconds histogram\n\
         ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"0.0001\"} 1\n\
         ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"0.0025\"} 1\n\
         ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"1\"} 3\n\
         ciphermq_fsync_seconds_bucket{shard=\"1\",le=\"+Inf\"} 4\n\
         ciphermq_fsync_seconds_sum{shard=\"1\"} 1.5026\n\
         ciphermq_fsync_seconds_count{shard=\"1\"} 4\n"
    );
}

#[test]
fn publish_ack_buckets_run_from_50_us_to_10_s() {
    let stats = ShardStats::new(0);
    stats.publish_ack_latency.observe_us(420);
    let mut e = Exposition::default();
    e.histogram(
        "ciphermq_publish_ack_seconds",
        &[("shard", "0")],
        &stats.publish_ack_latency.snapshot(),
    );
    let text = e.finish();
    let buckets: Vec<&str> = text.lines().filter(|l| l.contains("_bucket{")).collect();
    assert_eq!(
        buckets.len(),
        ciphermq_stats::PUBLISH_ACK_BOUNDS_US.len() + 1
    );
    assert_eq!(
        buckets[..4],
        [
            "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.00005\"} 0",
            "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.0001\"} 0",
            "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.00025\"} 0",
            "ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"0.0005\"} 1",
        ]
    );
    assert!(text.contains("ciphermq_publish_ack_seconds_bucket{shard=\"0\",le=\"10\"} 1\n"));
    assert!(text.contains("ciphermq_publish_ack_seconds_sum{shard=\"0\"} 0.00042\n"));
}

fn queue(name: &str, ready: usize, unacked: usize) -> status::QueueEntry {
    status::QueueEntry {
        ready,
        unacked,
        ..status::QueueEntry::empty(name, None, 0)
    }
}

fn names(chosen: &[&status::QueueEntry]) -> Vec<String> {
    chosen.iter().map(|q| q.name.clone()).collect()
}

#[test]
fn per_queue_series_go_to_the_deepest_queues_ties_by_name() {
    // Sorted by name, as `status::queues` gives them.
    let queues = [
        queue("a", 1, 0),
        queue("b", 0, 7),
        queue("c", 3, 2),
        queue("d", 5, 0),
        queue("e", 0, 0),
        queue("f", 9, 0),
    ];
    // Depths: a 1, b 7, c 5, d 5, e 0, f 9. The three deepest are f, b
    // and one of c and d (5 each): c, whose name sorts first.
    assert_eq!(names(&deepest(&queues, 3)), ["b", "c", "f"]);
    assert_eq!(names(&deepest(&queues, 2)), ["b", "f"]);
    assert_eq!(names(&deepest(&queues, 4)), ["b", "c", "d", "f"]);
    assert_eq!(names(&deepest(&queues, 1)), ["f"]);
    assert!(deepest(&queues, 0).is_empty());
    // Not capped: every queue, in name order.
    assert_eq!(names(&deepest(&queues, 6)), ["a", "b", "c", "d", "e", "f"]);
    assert_eq!(names(&deepest(&queues, 100)).len(), 6);
    // The choice does not depend on the order the queues come in.
    let mut reversed = queues.clone();
    reversed.reverse();
    assert_eq!(names(&deepest(&reversed, 3)), ["b", "c", "f"]);
    // All equal: the first names.
    let level: Vec<_> = ["q3", "q1", "q2", "q0"]
        .iter()
        .map(|n| queue(n, 4, 4))
        .collect();
    assert_eq!(names(&deepest(&level, 2)), ["q0", "q1"]);
}

#[test]
fn queue_depth_does_not_overflow() {
    assert_eq!(depth(&queue("x", usize::MAX, usize::MAX)), u64::MAX);
}

#[test]
fn every_bucket_bound_prints_as_a_plain_decimal() {
    for &us in ciphermq_stats::FSYNC_BOUNDS_US
        .iter()
        .chain(ciphermq_stats::PUBLISH_ACK_BOUNDS_US)
        .chain(ciphermq_stats::COMMIT_ROUND_BOUNDS_US)
        .chain(ciphermq_stats::LOOP_LAG_BOUNDS_US)
    {
        let text = format_value(us as f64 / 1e6);
        assert!(
            !text.contains('e') && text.parse::<f64>().is_ok(),
            "{us} µs printed as {text}"
        );
    }
}
