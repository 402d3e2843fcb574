#!/usr/bin/env bash
# Kills the broker with SIGKILL at random moments under pipelined load (10
# times), restarts it on the same data directory, then drains the queue and
# prints acked / delivered / lost / duplicate counts. Fails on any loss.
# Then kills it four times while a fully acked segment's ids are being
# carried to the dedup file; fails if any id acked before is stored again
# when its sender publishes it again.
# (CI runs the same test as part of ./scripts/test.sh.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -q -p ciphermq-broker --test crash_recovery -- --nocapture 2>&1 | grep -E "crash|test result"
