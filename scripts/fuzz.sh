#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, see docs/FUZZING.md) for a fixed time each.
#
#   scripts/fuzz.sh [--fresh] [SECONDS] [TARGET...]
#
# SECONDS per target (default 60); TARGETs default to all of them. --fresh
# empties the working corpora first, so a run starts from the committed seeds
# alone (its figures are then comparable from run to run).
#
# Installs what it needs (cargo-fuzz, pinned; a C++ compiler for libFuzzer),
# builds on the stable toolchain without a sanitizer (`-s none`, the one
# cargo-fuzz mode that needs no nightly), with optimisations, debug
# assertions and overflow checks. Prints per target the executions, the
# corpus size and the crashes found, and exits non-zero if any target found
# one (or failed to build or run). Not part of CI: it takes minutes.
#
# Files: build in fuzz/target, working corpora in fuzz/corpus/<target> (the
# committed seeds are fuzz/seeds/<target>), crashing inputs in
# fuzz/artifacts/<target>, libFuzzer's output in fuzz/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(request message record recovery config)

fresh=0
if [ "${1:-}" = "--fresh" ]; then
  fresh=1
  shift
fi
seconds=${1:-60}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [--fresh] [SECONDS] [TARGET...]" >&2
  exit 2
fi
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [ -d "fuzz/seeds/$t" ] || { echo "unknown target $t (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

# --- install (idempotent, non-interactive) ----------------------------------
if ! command -v c++ >/dev/null 2>&1; then
  echo "== installing a C++ compiler (libFuzzer is C++)"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++ >/dev/null
  else
    echo "no C++ compiler (c++); install g++ or clang++" >&2
    exit 1
  fi
fi
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --quiet --locked --force cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

# --- build ------------------------------------------------------------------
# The same flags go to every cargo-fuzz call, so `run` finds the build fresh.
flags=(--sanitizer none --release --debug-assertions --target-dir fuzz/target)
echo "== building the fuzz targets (fuzz/target)"
cargo fuzz build "${flags[@]}"

# --- run --------------------------------------------------------------------
# Crashing inputs of earlier runs stay where they are; only new ones count.
count_artifacts() {
  { find "fuzz/artifacts/$1" -maxdepth 1 -type f \
    \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) 2>/dev/null || true; } | wc -l
}

mkdir -p fuzz/logs
# The targets' scratch files (recovery's queue dirs, config's base dir) live
# as long as each libFuzzer process: give them a dir that goes with the run,
# in memory when there is /dev/shm.
scratch_parent=/dev/shm
[ -d "$scratch_parent" ] && [ -w "$scratch_parent" ] || scratch_parent=${TMPDIR:-/tmp}
scratch=$(mktemp -d "$scratch_parent/ciphermq-fuzz-run.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
summary=()
failed=0
for t in "${targets[@]}"; do
  corpus="fuzz/corpus/$t"
  [ "$fresh" = 1 ] && rm -rf "$corpus"
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  before=$(count_artifacts "$t")
  log="fuzz/logs/$t.log"
  echo "== $t: ${seconds}s (log: $log)"
  # libFuzzer stops at a target's first crash; its input goes to
  # fuzz/artifacts/$t. -timeout: an input running 10 s counts as a hang.
  set +e
  TMPDIR="$scratch" cargo fuzz run "${flags[@]}" "$t" "$corpus" "fuzz/seeds/$t" -- \
    -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  crashes=$(( $(count_artifacts "$t") - before ))
  # Either may be missing (a crash while loading the corpus): then "?".
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1 || true)
  # The last status line's "corp: N/SIZE": the inputs libFuzzer kept.
  corp=$({ grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" || true; } | tail -n1 | sed 's/corp: //')
  if [ "$rc" != 0 ] && [ "$crashes" = 0 ]; then
    echo "   $t: libFuzzer exited with $rc and left no crashing input; see $log" >&2
    failed=1
  fi
  if [ "$crashes" -gt 0 ]; then
    failed=1
    newest=$(ls -t "fuzz/artifacts/$t"/* | head -n1 || true)
    grep -m1 -A2 'panicked at' "$log" | sed 's/^/   /' || true
    echo "   reproduce: cargo fuzz run ${flags[*]} $t $newest"
  fi
  line=$(printf '%-9s %6ss  executions %10s  corpus %12s  crashes %s' \
    "$t" "$seconds" "${execs:-?}" "${corp:-?}" "$crashes")
  echo "   $line"
  summary+=("$line")
done

echo "== summary (corpus: inputs/size kept by libFuzzer; working corpora in fuzz/corpus)"
printf '%s\n' "${summary[@]}"
exit "$failed"
