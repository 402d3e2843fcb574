#!/usr/bin/env bash
# Runs the seeded simulation over many seeds, optimized. A failure prints
# its seed, the steps about the messages it names, and how to replay it:
#   cargo run --release -p ciphermq-sim -- --seed <seed> [--full-trace]
#
#   scripts/simulate.sh [seeds] [first seed] [steps]   (default 10000 from 0, 3000 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-10000}
from=${2:-0}
steps=${3:-3000}
cargo build --release -q -p ciphermq-sim
exec ./target/release/ciphermq-sim --seeds "$seeds" --from "$from" --steps "$steps"
