#!/usr/bin/env bash
# Kills the broker with SIGKILL at random moments under pipelined load (10
# times), restarts it on the same data directory, then drains the queue and
# prints acked / delivered / lost / duplicate counts. Fails on any loss.
# (CI runs the same test as part of ./scripts/test.sh.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q -p ciphermq-broker --test crash_recovery -- --nocapture 2>&1 | grep -E "crash|test result"
