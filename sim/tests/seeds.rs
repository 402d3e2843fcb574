//! The simulation's seeds, run by every test run: a few hundred per shard
//! count, with faults and crashes. A failure names its seed; replay it with
//! `cargo run -p ciphermq-sim -- --seed <seed>` (`scripts/simulate.sh` runs
//! thousands).

use ciphermq_sim::{run, Options};

/// Seeds per shard count (override with `CIPHERMQ_SIM_SEEDS`).
const SEEDS: u64 = 250;
const STEPS: u64 = 2_000;

fn seeds() -> u64 {
    std::env::var("CIPHERMQ_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS)
}

fn run_seeds(shards: Option<usize>, moves: bool) {
    let opts = Options {
        steps: STEPS,
        shards,
        moves,
        ..Options::default()
    };
    let mut failures = Vec::new();
    let mut crashes = 0;
    let mut acked = 0;
    let mut moved = 0;
    for seed in 0..seeds() {
        match run(seed, &opts) {
            Ok(summary) => {
                crashes += summary.crashes;
                acked += summary.acked;
                moved += summary.moves;
            }
            Err(failure) => failures.push(failure.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n\n{}",
        failures.len(),
        seeds(),
        failures.join("\n\n")
    );
    // The runs did what they are for.
    assert!(crashes > seeds(), "crashes: {crashes}");
    assert!(acked > seeds() * 100, "acked publishes: {acked}");
    assert!(!moves || moved > seeds(), "owner moves: {moved}");
}

#[test]
fn every_invariant_holds_on_one_shard() {
    run_seeds(Some(1), false);
}

#[test]
fn every_invariant_holds_on_two_shards() {
    run_seeds(Some(2), false);
}

/// Owners move away and back (freeze, settle, leave with their
/// directories, recover), among everything else; the seed picks 1 or 2
/// shards.
#[test]
fn every_invariant_holds_while_owners_move() {
    run_seeds(None, true);
}

#[test]
fn a_seed_with_moves_replays_exactly() {
    let opts = Options {
        moves: true,
        ..Options::default()
    };
    let first = run(128, &opts).expect("seed 128 passes");
    let second = run(128, &opts).expect("seed 128 passes");
    assert!(first.moves > 0, "seed 128 moves owners");
    assert_eq!(
        first.trace_digest, second.trace_digest,
        "the same run twice"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let opts = Options::default();
    let first = run(7, &opts).expect("seed 7 passes");
    let second = run(7, &opts).expect("seed 7 passes");
    assert_eq!(
        first.trace_digest, second.trace_digest,
        "the same run twice"
    );
    let other = run(8, &opts).expect("seed 8 passes");
    assert_ne!(
        first.trace_digest, other.trace_digest,
        "another seed, another run"
    );
}
