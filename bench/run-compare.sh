#!/usr/bin/env bash
# Reproduces every figure of docs/BENCHMARKS.md on this machine: builds,
# makes certificates, starts CipherMQ brokers, and runs ciphermq-bench against
# CipherMQ, RabbitMQ (127.0.0.1:5672) and NATS JetStream (127.0.0.1:4222)
# side by side, RUNS times each (interleaved), writing one JSON file per
# scenario and a Markdown summary (bench/summarize.py) at the end.
#
#   bench/run-compare.sh                 # everything: about 45 minutes on 2 cores
#   QUICK=1 bench/run-compare.sh         # one short scenario per section, to check the setup
#   SECTIONS="latency rss" bench/run-compare.sh
#
# Settings (environment):
#   OUT         results directory          (default bench/results/<UTC date-time>)
#   RUNS        runs per target            (3; the tables quote medians)
#   DURATION    length of each load run    (10s)
#   STORAGES    CipherMQ storage modes     ("durable memory"; the peers run
#               next to the first, at the first shard count)
#   SHARDS      CipherMQ shard counts      ("1 2")
#   SIZES       body sizes, bytes          ("1024 16384")
#   PUBLISHERS  publisher connections      ("1 4 16")
#   WINDOW      publish window             (1000)
#   PORT        CipherMQ port              (5917; must be free)
#   SECTIONS    any of: throughput latency rss idle  (all)
#   SKIP_BUILD  1 to use the binaries already in target/release
#
# Peers run with their stock settings; RabbitMQ and NATS are reached over
# plain TCP, CipherMQ over mutual TLS. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=$ROOT/target/release

RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
STORAGES=${STORAGES:-durable memory}
SHARDS=${SHARDS:-1 2}
SIZES=${SIZES:-1024 16384}
PUBLISHERS=${PUBLISHERS:-1 4 16}
WINDOW=${WINDOW:-1000}
PORT=${PORT:-5917}
SECTIONS=${SECTIONS:-throughput latency rss idle}
if [[ -n "${QUICK:-}" ]]; then
  RUNS=1 DURATION=3s STORAGES=memory SHARDS=1 SIZES=1024 PUBLISHERS=1
fi
OUT=${OUT:-$ROOT/bench/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT/work
ADDR=127.0.0.1:$PORT

if [[ -z "${SKIP_BUILD:-}" ]]; then
  echo "== building (release)"
  cargo build --release -q -p ciphermq-broker -p ciphermq-clients -p ciphermq-bench
fi

echo "== certificates and keys in $WORK"
mkdir -p "$WORK"
"$BIN/ciphermq-pki" --out "$WORK/certs" --keys "$WORK/keys" >/dev/null

# A broker configuration for one storage mode; paths are relative to it.
write_config() { # mode
  cat >"$WORK/config-$1.toml" <<EOF
# Written by bench/run-compare.sh. Everything not set here has its default.
[server]
address = "$ADDR"
[tls]
cert_path = "certs/server.crt"
key_path = "certs/server.key"
ca_cert_path = "certs/ca.crt"
[logging]
level = "warn"
dir = "logs"
json_files = false
[storage]
data_dir = "data-$1"
mode = "$1"
[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2"]
receiver_cns = ["receiver_1", "receiver_2"]
EOF
}

BROKER=
stop_broker() {
  if [[ -n "$BROKER" ]]; then
    kill "$BROKER" 2>/dev/null || true
    wait "$BROKER" 2>/dev/null || true
    BROKER=
  fi
}
trap stop_broker EXIT

start_broker() { # mode shards
  stop_broker
  write_config "$1"
  rm -rf "$WORK/data-$1"
  local log=$WORK/broker-$1-$2.log
  rm -f "$log" # a stale "listening" line must not pass for the new broker's
  "$BIN/ciphermq-broker" --config "$WORK/config-$1.toml" --address "$ADDR" --shards "$2" >"$log" 2>&1 &
  BROKER=$!
  for _ in $(seq 100); do
    grep -q "listening" "$log" 2>/dev/null && return 0
    kill -0 "$BROKER" 2>/dev/null || { cat "$log"; echo "broker did not start (is $ADDR free?)"; exit 1; }
    sleep 0.1
  done
  cat "$log"; echo "broker did not start in 10 s"; exit 1
}

bench() { # json-name label args...
  local name=$1 label=$2
  shift 2
  echo "-- $name: $*"
  "$BIN/ciphermq-bench" --addr "$ADDR" --certs "$WORK/certs" --keys "$WORK/keys" \
    --window "$WINDOW" --runs "$RUNS" --label "$label" --broker-pid "$BROKER" \
    --json "$OUT/$name.json" "$@"
}

has() { [[ " $SECTIONS " == *" $1 "* ]]; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "rabbitmq: $(rabbitmqctl version 2>/dev/null || echo unknown)"
  echo "nats-server: $(nats-server --version 2>/dev/null || echo unknown)"
  echo "settings: RUNS=$RUNS DURATION=$DURATION WINDOW=$WINDOW STORAGES='$STORAGES' SHARDS='$SHARDS' SIZES='$SIZES' PUBLISHERS='$PUBLISHERS'"
} | tee "$OUT/machine.txt"

if has throughput; then
  echo "== throughput: max rate, 1 consumer, $DURATION per run"
  for storage in $STORAGES; do
    for shards in $SHARDS; do
      start_broker "$storage" "$shards"
      for size in $SIZES; do
        for pubs in $PUBLISHERS; do
          # The peers have no shards and no in-memory mode: measure them once,
          # next to CipherMQ's first configuration.
          target=ciphermq
          if [[ $storage == "${STORAGES%% *}" && $shards == "${SHARDS%% *}" ]]; then
            target=compare
          fi
          bench "throughput-$storage-s$shards-b$size-p$pubs" "$storage, $shards shard(s)" \
            --target "$target" --duration "$DURATION" --size "$size" --publishers "$pubs" --consumers 1
        done
      done
    done
  done
fi

if has latency; then
  echo "== latency at a fixed rate (coordinated-omission safe), 1 KiB, 1 publisher, 1 consumer"
  for storage in $STORAGES; do
    start_broker "$storage" 1
    target=ciphermq
    [[ $storage == "${STORAGES%% *}" ]] && target=compare
    bench "latency-$storage-5000" "$storage, 1 shard, 5,000 msg/s" \
      --target "$target" --rate 5000 --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
    # 50% of each broker's own sustainable peak (the lower of its publish and
    # consume medians at max rate), when the throughput run above exists.
    peaks=$OUT/throughput-$storage-s1-b1024-p1.json
    if [[ -f $peaks ]]; then
      for t in ciphermq rabbitmq nats; do
        [[ $t != ciphermq && $target != compare ]] && continue
        rate=$(python3 -c "
import json, sys
s = json.load(open('$peaks'))['summary'].get('$t')
print(int(min(s['publish_msgs_per_sec'], s['consume_msgs_per_sec']) / 2) if s else '')")
        [[ -z $rate ]] && continue
        bench "latency-$storage-half-$t" "$storage, 1 shard, 50% of peak ($rate msg/s)" \
          --target "$t" --rate "$rate" --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
      done
    fi
  done
fi

if has rss; then
  echo "== broker memory with 1,000,000 queued 1 KiB messages"
  for storage in $STORAGES; do
    start_broker "$storage" 1
    sleep 1
    grep -E 'VmRSS' /proc/"$BROKER"/status | sed 's/^/before: /' | tee "$OUT/rss-$storage.txt"
    RUNS=1 bench "rss-$storage" "$storage, 1 shard, 1,000,000 queued" \
      --target ciphermq --count 1000000 --size 1024 --publishers 4 --consumers 0
    sleep 2
    grep -E 'VmRSS|VmHWM' /proc/"$BROKER"/status | sed 's/^/queued: /' | tee -a "$OUT/rss-$storage.txt"
  done
fi

if has idle; then
  echo "== broker memory with 10,000 idle mTLS connections"
  start_broker "${STORAGES%% *}" 1
  sleep 1
  n=10000
  [[ -n "${QUICK:-}" ]] && n=500
  "$BIN/ciphermq-bench" idle --addr "$ADDR" --certs "$WORK/certs" --connections "$n" \
    --hold 5s --broker-pid "$BROKER" --json "$OUT/idle.json"
fi

stop_broker
python3 "$ROOT/bench/summarize.py" "$OUT" | tee "$OUT/summary.md"
echo "== results in $OUT"
