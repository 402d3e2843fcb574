#!/usr/bin/env bash
# Runs the seeded simulation over many seeds, optimized but with the code's
# debug assertions and overflow checks on (they are invariants the shard
# states; one of them caught a lost ack before any end-to-end check did),
# in its own target directory so the release build is left as it is.
# A failure prints
# its seed, the steps about the messages it names, and how to replay it:
#   cargo run --release -p ciphermq-sim -- --seed <seed> [--full-trace]
#
#   scripts/simulate.sh [seeds] [first seed] [steps] [more ciphermq-sim options, e.g. --moves]
#   (default 10000 from 0, 3000 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-10000}
from=${2:-0}
steps=${3:-3000}
target=target/sim-checked
CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true \
    cargo build --release -q -p ciphermq-sim --target-dir "$target"
exec "$target/release/ciphermq-sim" --seeds "$seeds" --from "$from" --steps "$steps" "${@:4}"
