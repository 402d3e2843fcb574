#!/usr/bin/env bash
# Plants one bug per invariant in the shard crate, runs the simulation's
# seeds against each, and checks the simulation catches it with the right
# invariant. Each mutation is reverted before the next (git checkout of the
# one file); the shard's sources must have no uncommitted changes.
#
#   scripts/sim-mutations.sh [seeds] [steps]     (default 300 seeds, 2000 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-300}
steps=${2:-2000}
if ! git diff --quiet -- shard/src; then
  echo "sim-mutations: shard/src has uncommitted changes; commit or stash them first" >&2
  exit 2
fi

# invariant | file | text | replacement
mutations=(
  "acked-not-lost|shard/src/log/queue_log.rs|if !doomed && io.is_done() {|if !doomed {"
  "nacked-not-stored|shard/src/log/queue_log.rs|let doomed = self.doomed.pop_front().unwrap_or(false);|let doomed = self.doomed.pop_front().unwrap_or(false) \|\| self.doomed.iter().any(\|&d\| d);"
  "acked-not-lost|shard/src/shard/commit.rs|d.fail_duplicates(&job.queue, &keys);|let _ = &keys;"
  "acked-not-lost|shard/src/log/storage_calls.rs|self.sync_dir.then_some(name)|false.then_some(name)"
  "fifo|shard/src/queue/deliver.rs|None => self.ready.pop_front()?,|None => self.ready.pop_back()?,"
  "dedup-window|shard/src/dedup/id_set.rs|if !IdSet::expired(state, self.unit_now(now)) {|if state == STORED {"
  "confinement|shard/src/routing.rs|.is_none_or(\|owner\| owner == receiver)|.is_none_or(\|_owner\| true)"
  "memory-budget|shard/src/shard/budget.rs|if held <= cap {|if held <= cap \|\| part > 0 {"
)

status=0
for m in "${mutations[@]}"; do
  IFS='|' read -r invariant file from to <<<"$(sed 's/\\|/\x01/g' <<<"$m")"
  from=${from//$'\x01'/|}
  to=${to//$'\x01'/|}
  FROM="$from" TO="$to" perl -0pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/ or die "mutation text not found\n"' "$file"
  trap 'git checkout -- "$file"' EXIT
  cargo build -q -p ciphermq-sim
  out=$(./target/debug/ciphermq-sim --seeds "$seeds" --steps "$steps" 2>&1 || true)
  git checkout -- "$file"
  trap - EXIT
  failed=$(grep -c " broke " <<<"$out" || true)
  caught=$(grep -c " broke $invariant " <<<"$out" || true)
  first=$(grep -m1 " broke " <<<"$out" || true)
  printf '%-15s %-28s %4d of %d seeds failed, %4d on %s\n' "$invariant" "$file" "$failed" "$seeds" "$caught" "$invariant"
  [ -n "$first" ] && printf '                first: %s\n' "$first"
  if [ "$caught" -eq 0 ]; then
    echo "sim-mutations: the planted $invariant bug was not caught" >&2
    status=1
  fi
done
cargo build -q -p ciphermq-sim
exit $status
