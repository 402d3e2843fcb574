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
#   TP_CONSUMERS throughput's consumer counts ("1"; "0 1" adds publish-only
#               runs, named ...-c0)
#   PORT        CipherMQ port              (5917; must be free)
#   SECTIONS    any of: throughput drain latency durability rss idle pgbridge cluster shared scaleout ab
#               restart backlog tail mixed load soak (default: the first six)
#               durability: the price of durability as adjacent pairs
#               (durable run, then in-memory run, RUNS times), 1 KiB, 1 shard,
#               each PUBLISHERS count; the ratio is taken within each pair
#               cluster: a broker on its own, then a 1-node cluster, as
#               adjacent pairs, both durable with the Postgres backend
#               (PGDB), 1 KiB, 1 shard, 1 consumer, RUNS pairs per
#               PUBLISHERS count; the ratio is taken within each pair
#               shared: a 1-node cluster with cluster.storage = "local",
#               then one with "shared" (shared_dir on the same disk), as
#               adjacent pairs, both durable with the Postgres backend,
#               1 KiB, 1 shard, 1 consumer, RUNS pairs per PUBLISHERS count
#               scaleout: two streams (sender_1 → receiver_1, sender_2 →
#               receiver_2, 1 KiB, 1 publisher + 1 consumer each, two bench
#               processes at once) against 1 node × 2 shards, then a 2-node
#               cluster × 1 shard, as adjacent pairs, RUNS pairs; both
#               durable with the Postgres backend; the figure is the sum;
#               PostgreSQL's CPU per side goes to *-postgres-cpu.txt.
#               SCALEOUT_PIN=shards (default): each node's shard pinned to
#               its own CPU, every other thread free (as the one-node side
#               is); SCALEOUT_PIN=nodes: each node confined to one CPU,
#               threads and all
#               ab: before/after as adjacent pairs: BASE_BIN's broker, then
#               this tree's, durable, AB_SIZE bytes (1024), 1 shard,
#               1 consumer, RUNS pairs per PUBLISHERS count; the ratio is
#               taken within each pair
#               drain: consume-only side by side: DRAIN_COUNT messages
#               of each SIZES published with no consumer attached (durable,
#               1 shard, 1 publisher), then one consumer drains them; the
#               consume rate is over the drain alone (--consume-backlog)
#               restart: RESTART_COUNT 1 KiB messages queued with no
#               consumer, a clean stop, then the time until the restarted
#               broker (recovering them) listens, and its memory
#   RESTART_COUNT with restart: messages queued (1000000)
#               backlog: BACKLOG_COUNT 1 KiB messages published into one
#               durable queue with no consumer under a BACKLOG_BUDGET_MB
#               memory budget, the broker's RSS sampled every second
#               (backlog-rss.tsv), a clean stop and a timed restart, then one
#               consumer drains it all checking every id (ciphermq-bench
#               drain); then the same with BACKLOG_RAM_COUNT messages that fit
#               in memory, for the in-RAM drain rate
#               tail: TAIL_RUNS consecutive CipherMQ runs at a fixed
#               5,000 msg/s, durable, 1 KiB, 1 shard, 1 publisher, 1 consumer,
#               each with its worst latency per 100 ms (stalls: over 50 ms),
#               bracketed by FLOOR_RUNS runs of `ciphermq-bench disk-floor`
#               before and after them on the data directory's disk (the
#               same rate and load with no broker: the disk's own floor)
#               mixed: 1 KiB, durable, 1 shard, max rate: RUNS adjacent pairs
#               of publish-only (no consumer) then 1 publisher + 1 consumer;
#               then 4 and 16 publishers with 1 consumer, and 16 with a
#               consumer prefetch of 10,000; with MIXED_SINGLE=1
#               consumers ack with one `ack` line a delivery (no ack_batch)
#               load: CipherMQ's sustainable peak (RUNS max-rate runs, 1 KiB,
#               durable, 1 shard, 1 publisher + 1 consumer: the median of the
#               lower of publish and consume rates), then LOAD_RUNS runs at
#               50% and at 80% of it, latency from the scheduled send times,
#               each level after FLOOR_RUNS disk-floor runs at its rate
#               soak: SOAK_DURATION at 50% of that peak (measured here unless
#               the load section ran first), broker RSS and CPU every second;
#               RSS is judged after SOAK_WARM_UP; soak.svg plots it all
#   TAIL_RUNS   with tail: runs (20)
#   FLOOR_RUNS  with tail or load: disk-floor runs (5 each time)
#   LOAD_RUNS   with load: runs at each fraction of peak (5)
#   LOAD_LEVELS with load: the fractions of peak, in percent ("50 80")
#   SOAK_DURATION, SOAK_WARM_UP  with soak: 10m and 3m (more than the 120 s
#               dedup window, whose ids fill memory until it has passed)
#   BACKLOG_COUNT      with backlog: messages (20000000: 20 GB of bodies)
#   BACKLOG_BUDGET_MB  with backlog: storage.memory_budget_mb (256)
#   BACKLOG_RAM_COUNT  with backlog: messages of the in-memory drain (2000000)
#   DEDUP_WINDOW       with backlog or restart: performance.dedup_window_secs
#               (default 120: every id published within it is remembered)
#   BASE_BIN    with ab: a ciphermq-broker built from the commit to compare
#               against (e.g. a git worktree's target/release/ciphermq-broker)
#   AB_ARGS     with ab: more ciphermq-bench options for both sides, e.g.
#               --single-acks when BASE_BIN predates ack_batch
#   AB_EXCHANGE with ab: the exchange type the pairs publish through (direct;
#               topic binds `<receiver>.*.q<j>.#` and routes through the
#               topic matcher)
#   AB_SIZE     with ab: the body size in bytes (1024)
#   AB_CONSUMERS with ab: consumer connections (1; 0 measures publish alone)
#   PGDB        database the pgbridge section recreates (ciphermq_bench, on
#               127.0.0.1:5432 as user postgres)
#   PACE_TICK   the pacer's tick for the fixed-rate runs (ciphermq-bench
#               --pace-tick, e.g. 250us; default: a wake per message)
#   KEEP_DATA   1 keeps the brokers' data directories under OUT/work at the
#               end (by default they are removed: a run can leave gigabytes)
#   BROKER_BIN  a ciphermq-broker to run instead of target/release's (e.g. the
#               load section against an older build, with its load-peak.json
#               copied into OUT so both use the same rates)
#   SKIP_BUILD  1 to use the binaries already in target/release
#   BIN_DIR     where the binaries are (default target/release): a copy keeps
#               a long run safe from builds that replace target/release's
#
# Peers run with their stock settings; RabbitMQ and NATS are reached over
# plain TCP, CipherMQ over mutual TLS. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN_DIR:-$ROOT/target/release}

RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
STORAGES=${STORAGES:-durable memory}
SHARDS=${SHARDS:-1 2}
SIZES=${SIZES:-1024 16384}
PUBLISHERS=${PUBLISHERS:-1 4 16}
WINDOW=${WINDOW:-1000}
TP_CONSUMERS=${TP_CONSUMERS:-1}
PORT=${PORT:-5917}
SECTIONS=${SECTIONS:-throughput latency durability rss idle pgbridge}
TAIL_RUNS=${TAIL_RUNS:-20}
LOAD_RUNS=${LOAD_RUNS:-5}
SOAK_DURATION=${SOAK_DURATION:-10m}
SOAK_WARM_UP=${SOAK_WARM_UP:-3m}
BASE_BIN=${BASE_BIN:-}
AB_EXCHANGE=${AB_EXCHANGE:-direct}
RESTART_COUNT=${RESTART_COUNT:-1000000}
BACKLOG_COUNT=${BACKLOG_COUNT:-20000000}
BACKLOG_BUDGET_MB=${BACKLOG_BUDGET_MB:-256}
BACKLOG_RAM_COUNT=${BACKLOG_RAM_COUNT:-2000000}
DRAIN_COUNT=${DRAIN_COUNT:-500000}
PGDB=${PGDB:-ciphermq_bench}
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
# "postgres" is durable storage plus the Postgres bridge.
write_config() { # mode
  local mode=$1 database="" budget=""
  # In memory mode the budget is a hard cap on queued bodies; the rss section
  # queues ~1 GB and a consumer behind four publishers builds a backlog.
  # (Durable configs leave the key out, so that the ab section's base
  # brokers, built before it existed, read them too.)
  [[ $mode == memory ]] && budget="memory_budget_mb = 16384"
  [[ -n "${BUDGET_MB:-}" ]] && budget="memory_budget_mb = $BUDGET_MB"
  # The restart section queues more than the default max_queue_size.
  local performance=""
  [[ -n "${QUEUE_CAP:-}" ]] && performance="[performance]
max_queue_size = $QUEUE_CAP"
  [[ -n "${QUEUE_CAP:-}" && -n "${DEDUP_WINDOW:-}" ]] && performance="$performance
dedup_window_secs = $DEDUP_WINDOW"
  if [[ $mode == postgres || $mode == cluster || $mode == shared ]]; then
    database="[database]
backend = \"postgres\"
dbname = \"$PGDB\"
[encryption]
aes_key = \"$(head -c 32 /dev/urandom | base64)\""
    [[ $mode == cluster || $mode == shared ]] && database="$database
[cluster]
enabled = true
node_id = \"bench-1\"
schema = \"ciphermq_bench_cluster\""
    if [[ $mode == shared ]]; then
      rm -rf "$WORK/shared" && mkdir -p "$WORK/shared"
      database="$database
storage = \"shared\"
shared_dir = \"$WORK/shared\""
    fi
    mode=durable
  fi
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
mode = "$mode"
$budget
[rate_limit]
# The idle section opens 10,000 connections from one address.
max_connections_per_ip = 20000
max_connections_per_cn = 20000
[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2"]
receiver_cns = ["receiver_1", "receiver_2"]
[admin]
enabled = true
address = "127.0.0.1:$((PORT + 1))"
$database
$performance
EOF
}

# The broker's /metrics text, over mTLS as admin.
broker_metrics() {
  curl -s --cacert "$WORK/certs/ca.crt" --cert "$WORK/certs/admin.crt" --key "$WORK/certs/admin.key" \
    "https://127.0.0.1:$((PORT + 1))/metrics"
}

# One counter of the broker's /metrics (summed over shards).
metric_sum() { # name
  broker_metrics | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d", s}'
}

# The whole /metrics text into a file, for the broker-side histograms
# around a section's runs (bench/summarize.py takes the difference).
metrics_snapshot() { # file
  broker_metrics >"$1" || true
}

psql_q() { psql -h 127.0.0.1 -U postgres -d "$1" -Atc "$2"; }

BROKER=
stop_broker() {
  if [[ -n "$BROKER" ]]; then
    kill "$BROKER" 2>/dev/null || true
    wait "$BROKER" 2>/dev/null || true
    BROKER=
  fi
}
# A publish-alone run leaves gigabytes of log behind; a series of runs
# would fill the disk (and later runs would read `NACK disk_full`).
finish() {
  stop_broker
  [[ ${KEEP_DATA:-0} == 1 ]] || rm -rf "$WORK"/data-*
}
trap finish EXIT

# CPU seconds PostgreSQL has used so far: its postmaster's own and reaped
# children's, plus its live backends'.
pg_cpu_secs() {
  python3 - <<'PY'
import os
tick = os.sysconf("SC_CLK_TCK")
def fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()
total = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "postgres":
                continue
        st = fields(pid)
    except OSError:
        continue
    total += int(st[11]) + int(st[12])          # utime, stime
    if st[1] == "1" or not os.path.exists(f"/proc/{st[1]}/comm") or open(f"/proc/{st[1]}/comm").read().strip() != "postgres":
        total += int(st[13]) + int(st[14])      # the postmaster: reaped backends
print(total / tick)
PY
}

# Lets every thread of process $1 run on every CPU of the host, except what
# a broker pins itself when not confined: each shard's executor (the first
# thread named `shard-N-<id>`; the second is its committer, which floats)
# and its `shard-N-delete` thread.
unpin_but_shards() {
  local tid comm seen=" "
  for tid in $(ls /proc/"$1"/task | sort -n); do
    comm=$(cat "/proc/$1/task/$tid/comm" 2>/dev/null) || continue
    if [[ $comm =~ ^shard-[0-9]+-[0-9]+$ && $seen != *" $comm "* ]]; then
      seen+="$comm "
      continue
    fi
    [[ $comm =~ ^shard-[0-9]+-delete$ ]] && continue
    taskset -pc "0-$(($(nproc) - 1))" "$tid" >/dev/null 2>&1 || true
  done
}

start_broker() { # mode shards [broker binary]
  stop_broker
  write_config "$1"
  rm -rf "$WORK/data-$1"
  launch_broker "$1" "$2" "${3:-${BROKER_BIN:-$BIN/ciphermq-broker}}" 10
}

# Starts a broker on the data directory as it is (recovering what is there),
# and waits for it to listen: at most `wait` seconds.
launch_broker() { # mode shards binary wait
  local log=$WORK/broker-$1-$2.log
  rm -f "$log" # a stale "listening" line must not pass for the new broker's
  "$3" --config "$WORK/config-$1.toml" --address "$ADDR" --shards "$2" >"$log" 2>&1 &
  BROKER=$!
  for _ in $(seq $(($4 * 10))); do
    grep -q "listening" "$log" 2>/dev/null && return 0
    kill -0 "$BROKER" 2>/dev/null || { cat "$log"; echo "broker did not start (is $ADDR free?)"; exit 1; }
    sleep 0.1
  done
  cat "$log"; echo "broker did not start in $4 s"; exit 1
}

bench() { # json-name label args...
  local name=$1 label=$2
  shift 2
  echo "-- $name: $*"
  "$BIN/ciphermq-bench" --addr "$ADDR" --certs "$WORK/certs" --keys "$WORK/keys" \
    --window "$WINDOW" --runs "$RUNS" --label "$label" --broker-pid "$BROKER" \
    --json "$OUT/$name.json" ${PACE_TICK:+--pace-tick "$PACE_TICK"} "$@"
}

has() { [[ " $SECTIONS " == *" $1 "* ]]; }

floor() { # json-name rate: the disk's own durable latency at that rate, no broker
  "$BIN/ciphermq-bench" disk-floor --dir "$WORK/floor" --rate "$2" --duration "$DURATION" \
    --runs "${FLOOR_RUNS:-5}" --json "$OUT/$1.json"
}

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
  echo "== throughput: max rate, $TP_CONSUMERS consumer(s), $DURATION per run"
  for storage in $STORAGES; do
    for shards in $SHARDS; do
      # Publish-only runs queue millions of messages.
      QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker "$storage" "$shards"
      for size in $SIZES; do
        for pubs in $PUBLISHERS; do
          for consumers in $TP_CONSUMERS; do
            # The peers have no shards and no in-memory mode: measure them once,
            # next to CipherMQ's first configuration.
            target=ciphermq
            if [[ $storage == "${STORAGES%% *}" && $shards == "${SHARDS%% *}" ]]; then
              target=compare
            fi
            name="throughput-$storage-s$shards-b$size-p$pubs"
            [[ $consumers == 1 ]] || name="$name-c$consumers"
            bench "$name" "$storage, $shards shard(s), $consumers consumer(s)" \
              --target "$target" --duration "$DURATION" --size "$size" --publishers "$pubs" --consumers "$consumers" \
              --delete-queues
          done
        done
      done
    done
  done
fi

if has drain; then
  echo "== drain: $DRAIN_COUNT messages published with no consumer, then drained by one (consume-only)"
  QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1
  for size in $SIZES; do
    bench "drain-durable-s1-b$size" "durable, 1 shard, consume-only ($DRAIN_COUNT queued)" \
      --target compare --count "$DRAIN_COUNT" --size "$size" --publishers 1 --consumers 1 \
      --consume-backlog --delete-queues
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

if has durability; then
  echo "== price of durability: durable then in-memory, adjacent pairs, 1 KiB, 1 shard, $DURATION per run"
  # Back-to-back pairs, so drift in a shared machine (which moves absolute
  # figures by 10-20% within minutes) hits both halves of a ratio alike.
  for pubs in $PUBLISHERS; do
    for run in $(seq "$RUNS"); do
      for storage in durable memory; do
        start_broker "$storage" 1
        f0=$(metric_sum ciphermq_fsyncs_total) t0=$(date +%s.%N)
        RUNS=1 bench "durability-$storage-p$pubs-r$run" "$storage, 1 shard" \
          --target ciphermq --duration "$DURATION" --size 1024 --publishers "$pubs" --consumers 1
        f1=$(metric_sum ciphermq_fsyncs_total) t1=$(date +%s.%N)
        if [[ $storage == durable ]]; then
          echo "fsyncs=$((f1 - f0)) fsyncs_per_s=$(python3 -c "print(round(($f1 - $f0) / ($t1 - $t0)))") (over the whole bench invocation, connect and drain included)" | tee "$OUT/durability-fsyncs-p$pubs-r$run.txt"
        fi
      done
    done
  done
fi

if has ab; then
  [[ -x "$BASE_BIN" ]] || { echo "SECTIONS=ab needs BASE_BIN, a ciphermq-broker built from the commit to compare against"; exit 1; }
  ab_size=${AB_SIZE:-1024}
  ab_consumers=${AB_CONSUMERS:-1}
  echo "== before/after: $BASE_BIN, then $BIN/ciphermq-broker; adjacent pairs, durable, $ab_size B, 1 shard, $ab_consumers consumer(s), $AB_EXCHANGE exchange, $DURATION per run"
  for pubs in $PUBLISHERS; do
    for run in $(seq "$RUNS"); do
      for side in base new; do
        bin=$BIN/ciphermq-broker
        [[ $side == base ]] && bin=$BASE_BIN
        # Publish-only runs queue millions of messages.
        QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1 "$bin"
        RUNS=1 bench "ab-$side-p$pubs-r$run" "$side, durable, $ab_size B, 1 shard, $ab_consumers consumer(s), $AB_EXCHANGE" \
          --target ciphermq --duration "$DURATION" --size "$ab_size" --publishers "$pubs" --consumers "$ab_consumers" \
          --exchange "$AB_EXCHANGE" ${AB_ARGS:-}
      done
    done
  done
fi

if has cluster; then
  # A 1-node cluster against a broker on its own, both with the Postgres
  # backend (a cluster needs it), so the pair differs by the cluster alone:
  # the coordinator thread and the placement check on every publish.
  echo "== cluster: a broker on its own, then a 1-node cluster; adjacent pairs, durable + Postgres, 1 KiB, 1 shard, 1 consumer"
  for pubs in $PUBLISHERS; do
    for run in $(seq "$RUNS"); do
      for side in alone node; do
        psql_q postgres "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null
        psql_q postgres "CREATE DATABASE $PGDB" >/dev/null
        mode=postgres
        [[ $side == node ]] && mode=cluster
        start_broker "$mode" 1
        RUNS=1 bench "cluster-$side-p$pubs-r$run" "$side, durable + Postgres, 1 KiB, 1 shard" \
          --target ciphermq --duration "$DURATION" --size 1024 --publishers "$pubs" --consumers 1
      done
    done
  done
fi

if has shared; then
  # A 1-node cluster keeping its queues in its data directory, then one
  # keeping them in a shared directory (on the same disk here), so the pair
  # differs by shared storage alone: the fence checked after every fsync
  # (a stat of the owner's directory) and the lease check.
  echo "== shared: a 1-node cluster with local storage, then with shared storage; adjacent pairs, durable + Postgres, 1 KiB, 1 shard, 1 consumer"
  for pubs in $PUBLISHERS; do
    for run in $(seq "$RUNS"); do
      for side in local shared; do
        psql_q postgres "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null
        psql_q postgres "CREATE DATABASE $PGDB" >/dev/null
        mode=cluster
        [[ $side == shared ]] && mode=shared
        start_broker "$mode" 1
        RUNS=1 bench "shared-$side-p$pubs-r$run" "$side storage, 1-node cluster, durable + Postgres, 1 KiB, 1 shard" \
          --target ciphermq --duration "$DURATION" --size 1024 --publishers "$pubs" --consumers 1
      done
    done
  done
fi

if has scaleout; then
  # The same load, two independent streams (sender_1 → receiver_1, sender_2
  # → receiver_2), against one node with 2 shards (the two pairs land on
  # different shards), then against a 2-node cluster with 1 shard each (one
  # pair per node). Two bench processes run at once, one per stream; the
  # figure is their sum. Both sides durable with the Postgres backend.
  echo "== scale-out: 1 node x 2 shards, then 2 nodes x 1 shard; adjacent pairs, durable + Postgres, 1 KiB, 1 publisher + 1 consumer per stream"
  ADDR2="127.0.0.1:$((PORT + 2))"
  for run in $(seq "$RUNS"); do
    for side in one two; do
      stop_broker
      psql_q postgres "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null
      psql_q postgres "CREATE DATABASE $PGDB" >/dev/null
      if [[ $side == one ]]; then
        start_broker postgres 2
        addrs=("$ADDR" "$ADDR") pids=("$BROKER" "$BROKER")
      else
        # SCALEOUT_PIN=shards (the default): pinned as the one-node side
        # is, one shard per CPU, every other thread free. Node 1's shard
        # pins itself to CPU 0 (the first of its mask); node 2 starts
        # confined to CPU 1, so its shard pins there, and then every other
        # thread of it is let onto every CPU again.
        # SCALEOUT_PIN=nodes: each node confined to its CPU, threads and
        # all, as two one-CPU hosts would be.
        # The bench processes and PostgreSQL float either way.
        start_broker cluster 1
        [[ ${SCALEOUT_PIN:-shards} == nodes ]] && taskset -a -cp 0 "$BROKER" >/dev/null
        sed -e 's/^node_id = .*/node_id = "bench-2"/' -e 's/^data_dir = .*/data_dir = "data-cluster-2"/' \
            -e "s/^address = \"127.0.0.1:$((PORT + 1))\"/address = \"127.0.0.1:$((PORT + 3))\"/" \
            "$WORK/config-cluster.toml" >"$WORK/config-cluster-2.toml"
        rm -rf "$WORK/data-cluster-2"
        taskset -c 1 "${BROKER_BIN:-$BIN/ciphermq-broker}" --config "$WORK/config-cluster-2.toml" --address "$ADDR2" --shards 1 \
          >"$WORK/broker-cluster-2.log" 2>&1 &
        SECOND=$!
        for _ in $(seq 100); do grep -q "listening" "$WORK/broker-cluster-2.log" 2>/dev/null && break; sleep 0.1; done
        grep -q "listening" "$WORK/broker-cluster-2.log" || { cat "$WORK/broker-cluster-2.log"; echo "node 2 did not start"; exit 1; }
        [[ ${SCALEOUT_PIN:-shards} == nodes ]] || unpin_but_shards "$SECOND"
        addrs=("$ADDR" "$ADDR2") pids=("$BROKER" "$SECOND")
      fi
      streams=()
      pg0=$(pg_cpu_secs) t0=$(date +%s.%N)
      for i in 0 1; do
        n=$((i + 1))
        echo "-- scaleout-$side-s$n-r$run"
        "$BIN/ciphermq-bench" --addr "${addrs[$i]}" --certs "$WORK/certs" --keys "$WORK/keys" \
          --window "$WINDOW" --runs 1 --label "$side, stream $n" --broker-pid "${pids[$i]}" \
          --json "$OUT/scaleout-$side-s$n-r$run.json" --target ciphermq --duration "$DURATION" --size 1024 \
          --publishers 1 --consumers 1 --senders "sender_$n" --receiver "receiver_$n" &
        streams+=($!)
      done
      # Threads a node starts once traffic flows (its committer's) inherit
      # the mask of the thread that starts them: let them go too.
      if [[ $side == two && ${SCALEOUT_PIN:-shards} != nodes ]]; then
        for _ in $(seq 30); do
          [[ -s "$OUT/scaleout-$side-s2-r$run.json" ]] && break
          unpin_but_shards "$SECOND"
          sleep 1
        done
        [[ -n ${SHOW_PINS:-} ]] && for t in /proc/$SECOND/task/*; do echo "$(cat "$t/comm") $(grep Cpus_allowed_list "$t/status")"; done
      fi
      wait "${streams[@]}"
      pg1=$(pg_cpu_secs) t1=$(date +%s.%N)
      echo "postgres_cpu_cores=$(python3 -c "print(round(($pg1 - $pg0) / ($t1 - $t0), 3))") (PostgreSQL's CPU over the whole bench invocation, connect and drain included)" \
        | tee "$OUT/scaleout-$side-r$run-postgres-cpu.txt"
      if [[ $side == two ]]; then
        kill "$SECOND" 2>/dev/null || true
        wait "$SECOND" 2>/dev/null || true
      fi
    done
  done
  stop_broker
fi

if has tail; then
  echo "== tail latency: $TAIL_RUNS consecutive runs at 5,000 msg/s, durable, 1 KiB, 1 shard, 1 publisher, 1 consumer"
  floor "tail-floor-before" 5000
  start_broker durable 1
  metrics_snapshot "$OUT/tail-durable-5000-metrics-before.txt"
  RUNS=$TAIL_RUNS bench "tail-durable-5000" "durable, 1 shard, 5,000 msg/s, $TAIL_RUNS runs" \
    --target ciphermq --rate 5000 --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
  metrics_snapshot "$OUT/tail-durable-5000-metrics-after.txt"
  stop_broker
  floor "tail-floor-after" 5000
fi

if has mixed; then
  single=""
  [[ -n "${MIXED_SINGLE:-}" ]] && single="--single-acks"
  echo "== mixed load: publish-only then 1 publisher + 1 consumer, adjacent pairs, durable, 1 KiB, 1 shard, max rate ${single}"
  for run in $(seq "$RUNS"); do
    for consumers in 0 1; do
      # Publish-only queues 2-3 million messages in 10 s.
      QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1
      RUNS=1 bench "mixed-p1-c$consumers-r$run" "durable, 1 shard, 1 publisher, $consumers consumer(s)" \
        --target ciphermq --duration "$DURATION" --size 1024 --publishers 1 --consumers "$consumers" $single
    done
  done
  for pubs in 4 16; do
    QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1
    bench "mixed-p$pubs-c1" "durable, 1 shard, $pubs publishers, 1 consumer" \
      --target ciphermq --duration "$DURATION" --size 1024 --publishers "$pubs" --consumers 1 $single
  done
  # With 1,000 deliveries of prefetch a consumer gets at most 1,000 per
  # round trip, and under 16 publishers' load a round trip takes a few of
  # the broker's 3 ms preempt periods (7-10 ms): a larger prefetch keeps up.
  QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1
  bench "mixed-p16-c1-prefetch10000" "durable, 1 shard, 16 publishers, 1 consumer, prefetch 10,000" \
    --target ciphermq --duration "$DURATION" --size 1024 --publishers 16 --consumers 1 --prefetch 10000 $single
fi

# CipherMQ's sustainable rate at 1 KiB, durable, 1 shard, 1 publisher and 1
# consumer: the median over runs of the lower of publish and consume rates.
peak_of() { # json...
  python3 -c "
import json, statistics, sys
runs = [r for f in sys.argv[1:] for r in json.load(open(f))['runs'] if r['target'] == 'ciphermq']
print(int(statistics.median(min(r['publish_msgs_per_sec'], r['consume_msgs_per_sec']) for r in runs)))" "$@"
}

if has load || has soak; then
  if [[ ! -f $OUT/load-peak.json ]]; then
    echo "== load: CipherMQ's peak, $RUNS max-rate runs, durable, 1 KiB, 1 shard, 1 publisher, 1 consumer"
    QUEUE_CAP=${QUEUE_CAP:-100000000} start_broker durable 1
    bench "load-peak" "durable, 1 shard, max rate" \
      --target ciphermq --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
  fi
  PEAK=$(peak_of "$OUT/load-peak.json")
  echo "peak=$PEAK msg/s" | tee "$OUT/load-peak.txt"
fi

if has load; then
  for pct in ${LOAD_LEVELS:-50 80}; do
    rate=$((PEAK * pct / 100))
    echo "== load: the disk's floor, then $LOAD_RUNS runs at $pct% of peak ($rate msg/s)"
    stop_broker
    floor "load-$pct-floor" "$rate"
    start_broker durable 1
    metrics_snapshot "$OUT/load-$pct-metrics-before.txt"
    RUNS=$LOAD_RUNS bench "load-$pct" "durable, 1 shard, $pct% of peak ($rate msg/s)" \
      --target ciphermq --rate "$rate" --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
    metrics_snapshot "$OUT/load-$pct-metrics-after.txt"
  done
fi

if has soak; then
  rate=$((PEAK / 2))
  echo "== soak: $SOAK_DURATION at 50% of peak ($rate msg/s), durable, 1 KiB, 1 shard, warm-up $SOAK_WARM_UP"
  start_broker durable 1
  RUNS=1 bench "soak" "durable, 1 shard, $SOAK_DURATION at $rate msg/s" \
    --target ciphermq --rate "$rate" --duration "$SOAK_DURATION" --warm-up "$SOAK_WARM_UP" \
    --size 1024 --publishers 1 --consumers 1
  "$BIN/ciphermq-bench" plot "$OUT/soak.json" --out "$OUT/soak.svg"
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

if has restart; then
  echo "== restart with $RESTART_COUNT queued 1 KiB messages (durable, 1 shard, no consumer)"
  QUEUE_CAP=$((RESTART_COUNT + 1)) start_broker durable 1
  RUNS=1 bench "restart-fill" "durable, 1 shard, $RESTART_COUNT queued" \
    --target ciphermq --count "$RESTART_COUNT" --size 1024 --publishers 4 --consumers 0
  {
    grep -E 'VmRSS' /proc/"$BROKER"/status | sed 's/^/queued: /'
    echo "data_dir_bytes: $(du -sb "$WORK/data-durable" | cut -f1)"
  } | tee "$OUT/restart.txt"
  stop_broker # SIGTERM: a clean stop, every commit round finished
  sync
  t0=$(date +%s.%N)
  launch_broker durable 1 "$BIN/ciphermq-broker" 1800 # the same config, queue cap included
  t1=$(date +%s.%N)
  {
    echo "restart_to_listening_s: $(python3 -c "print(round($t1 - $t0, 2))")"
    grep -E 'VmRSS|VmHWM' /proc/"$BROKER"/status | sed 's/^/recovered: /'
  } | tee -a "$OUT/restart.txt"
fi

if has backlog; then
  # Samples the broker's RSS (KiB) every second until it exits.
  sample_rss() { # file
    local pid=$BROKER t0
    t0=$(date +%s)
    while kill -0 "$pid" 2>/dev/null; do
      printf '%s\t%s\n' "$(($(date +%s) - t0))" "$(awk '/VmRSS/ {print $2}' /proc/"$pid"/status 2>/dev/null)"
      sleep 1
    done >>"$1"
  }
  drain() { # expect label
    "$BIN/ciphermq-bench" drain --addr "$ADDR" --certs "$WORK/certs" --expect "$1" --idle 60s \
      | tee "$OUT/backlog-drain-$2.txt" | grep -E "^drained|t=[0-9]*0s "
  }
  echo "== backlog: $BACKLOG_COUNT queued 1 KiB messages, ${BACKLOG_BUDGET_MB} MB budget (durable, 1 shard)"
  BUDGET_MB=$BACKLOG_BUDGET_MB QUEUE_CAP=$((BACKLOG_COUNT + 1)) start_broker durable 1
  : >"$OUT/backlog-rss.tsv"
  sample_rss "$OUT/backlog-rss.tsv" &
  SAMPLER=$!
  RUNS=1 bench "backlog-fill" "durable, 1 shard, $BACKLOG_COUNT queued, ${BACKLOG_BUDGET_MB} MB budget" \
    --target ciphermq --count "$BACKLOG_COUNT" --size 1024 --publishers 4 --consumers 0
  sleep 2
  {
    grep -E 'VmRSS|VmHWM' /proc/"$BROKER"/status | sed 's/^/queued: /'
    echo "data_dir_bytes: $(du -sb "$WORK/data-durable" | cut -f1)"
  } | tee "$OUT/backlog.txt"
  stop_broker
  wait "$SAMPLER" 2>/dev/null || true
  sync
  t0=$(date +%s.%N)
  launch_broker durable 1 "$BIN/ciphermq-broker" 1800
  t1=$(date +%s.%N)
  sample_rss "$OUT/backlog-rss-restarted.tsv" &
  SAMPLER=$!
  {
    echo "restart_to_listening_s: $(python3 -c "print(round($t1 - $t0, 2))")"
    grep -E 'VmRSS|VmHWM' /proc/"$BROKER"/status | sed 's/^/recovered: /'
  } | tee -a "$OUT/backlog.txt"
  drain "$BACKLOG_COUNT" disk
  grep -E 'VmRSS|VmHWM' /proc/"$BROKER"/status | sed 's/^/drained: /' | tee -a "$OUT/backlog.txt"
  stop_broker
  wait "$SAMPLER" 2>/dev/null || true
  rm -rf "$WORK/data-durable"
  echo "== backlog in memory: $BACKLOG_RAM_COUNT queued 1 KiB messages, 16 GB budget (durable, 1 shard)"
  BUDGET_MB=16384 QUEUE_CAP=$((BACKLOG_RAM_COUNT + 1)) start_broker durable 1
  RUNS=1 bench "backlog-ram-fill" "durable, 1 shard, $BACKLOG_RAM_COUNT queued in memory" \
    --target ciphermq --count "$BACKLOG_RAM_COUNT" --size 1024 --publishers 4 --consumers 0
  drain "$BACKLOG_RAM_COUNT" ram
  stop_broker
  rm -rf "$WORK/data-durable"
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

if has pgbridge; then
  echo "== Postgres bridge: durable publish with the metadata mirror off vs on, 1 KiB, 1 shard"
  # Interleaved (off, on, off, on ...) so drift in the machine hits both.
  for run in $(seq "$RUNS"); do
    for storage in durable postgres; do
      if [[ $storage == postgres ]]; then
        psql_q postgres "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null
        psql_q postgres "CREATE DATABASE $PGDB" >/dev/null
      fi
      start_broker "$storage" 1
      f0=$(metric_sum ciphermq_fsyncs_total) t0=$(date +%s.%N)
      RUNS=1 bench "pgbridge-$storage-r$run" "$storage, 1 shard" \
        --target ciphermq --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
      f1=$(metric_sum ciphermq_fsyncs_total) t1=$(date +%s.%N)
      echo "fsyncs=$((f1 - f0)) fsyncs_per_s=$(python3 -c "print(round(($f1 - $f0) / ($t1 - $t0)))") (over the whole bench invocation, connect and drain included)" | tee "$OUT/fsyncs-$storage-r$run.txt"
      if [[ $storage == postgres ]]; then
        # How long the mirror needs after the load to hold every row acked.
        t0=$(date +%s.%N)
        prev=-1
        while :; do
          rows=$(psql_q "$PGDB" "SELECT count(*) FILTER (WHERE acknowledged_time IS NOT NULL) || ' ' || count(*) FROM message_metadata")
          acked=${rows%% *} all=${rows##* }
          [[ $acked == "$all" && $acked == "$prev" ]] && break
          prev=$acked
          sleep 0.5
        done
        t1=$(date +%s.%N)
        span=$(psql_q "$PGDB" "SELECT extract(epoch FROM max(acknowledged_time) - min(sent_time)) FROM message_metadata")
        echo "rows=$all load_span_s=$span catch_up_after_load_s=$(python3 -c "print(round($t1 - $t0 - 1.0, 2))")" | tee "$OUT/pgbridge-rows-r$run.txt"
      fi
    done
  done
  echo "== Postgres bridge lag at 50% of the mirrored peak, rows sampled each second"
  peak=$(python3 -c "
import json, glob, statistics
v = [json.load(open(f))['summary']['ciphermq']['publish_msgs_per_sec'] for f in glob.glob('$OUT/pgbridge-postgres-r*.json')]
print(int(statistics.median(v) / 2) if v else 5000)")
  psql_q postgres "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null
  psql_q postgres "CREATE DATABASE $PGDB" >/dev/null
  start_broker postgres 1
  ( while :; do echo "$(date +%s.%N) $(psql_q "$PGDB" "SELECT count(*) FROM message_metadata" 2>/dev/null || echo -)"; sleep 1; done ) >"$OUT/pgbridge-lag-samples.txt" &
  sampler=$!
  RUNS=1 bench "pgbridge-lag-$peak" "postgres, 1 shard, $peak msg/s" \
    --target ciphermq --rate "$peak" --duration "$DURATION" --size 1024 --publishers 1 --consumers 1
  sleep 3
  kill "$sampler" 2>/dev/null || true
  python3 - "$OUT/pgbridge-lag-samples.txt" "$peak" <<'PY' | tee "$OUT/pgbridge-lag.txt"
import sys
rows = [(float(t), int(n)) for t, n in (l.split() for l in open(sys.argv[1]) if len(l.split()) == 2) if n.isdigit()]
rate = int(sys.argv[2])
start = next((t for t, n in rows if n > 0), None)
if start is None:
    print("no rows")
    sys.exit()
# Rows a fixed-rate load has stored by time t, minus rows mirrored: the lag.
final = rows[-1][1]
lags = [max(0.0, min(rate * (t - start), final) - n) for t, n in rows if t >= start]
print(f"rate={rate} samples={len(lags)} max_lag_rows={int(max(lags))} max_lag_s={max(lags) / rate:.2f} final_rows={final}")
PY
fi

stop_broker
python3 "$ROOT/bench/summarize.py" "$OUT" | tee "$OUT/summary.md"
echo "== results in $OUT"
