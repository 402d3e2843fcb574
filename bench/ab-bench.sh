#!/usr/bin/env bash
# Two ciphermq-bench binaries against the same broker binary, as adjacent
# pairs in alternating order (A then B, then B then A, ...), each run on a
# fresh durable 1-shard broker: 1 KiB, 1 publisher + 1 consumer, max rate.
# For a change to the client side (the bench's own CipherMQ client), where
# the bench's CPU per message shows up in the rate measured on a shared
# machine. Prints one line per run and the medians and ratios (B / A).
#
#   BENCH_A=old/ciphermq-bench BENCH_B=target/release/ciphermq-bench \
#     BROKER=target/release/ciphermq-broker PKI=target/release/ciphermq-pki \
#     PAIRS=3 bench/ab-bench.sh
#
# Settings: PAIRS (3), DURATION (10s), WINDOW (1000), PORT (5931), OUT
# (a new directory under /tmp), EXTRA (more ciphermq-bench options for both,
# e.g. --single-acks).
set -euo pipefail
: "${BENCH_A:?the first ciphermq-bench}" "${BENCH_B:?the second ciphermq-bench}"
: "${BROKER:?a ciphermq-broker}" "${PKI:?a ciphermq-pki}"
PAIRS=${PAIRS:-3}
DURATION=${DURATION:-10s}
WINDOW=${WINDOW:-1000}
PORT=${PORT:-5931}
EXTRA=${EXTRA:-}
OUT=${OUT:-$(mktemp -d /tmp/ab-bench.XXXXXX)}
mkdir -p "$OUT"
ADDR=127.0.0.1:$PORT
"$PKI" --out "$OUT/certs" --keys "$OUT/keys" >/dev/null
cat >"$OUT/config.toml" <<CONF
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
data_dir = "data"
mode = "durable"
[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2"]
receiver_cns = ["receiver_1", "receiver_2"]
[performance]
max_queue_size = 100000000
CONF

BROKER_PID=
stop_broker() {
  if [[ -n "$BROKER_PID" ]]; then
    kill "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
    BROKER_PID=
  fi
}
trap stop_broker EXIT

run() { # label binary n
  rm -rf "$OUT/data" "$OUT/broker.log"
  "$BROKER" --config "$OUT/config.toml" --address "$ADDR" --shards 1 >"$OUT/broker.log" 2>&1 &
  BROKER_PID=$!
  for _ in $(seq 100); do
    grep -q listening "$OUT/broker.log" 2>/dev/null && break
    sleep 0.1
  done
  # shellcheck disable=SC2086
  "$2" --target ciphermq --addr "$ADDR" --certs "$OUT/certs" --keys "$OUT/keys" \
    --duration "$DURATION" --size 1024 --publishers 1 --consumers 1 --window "$WINDOW" \
    --runs 1 --json "$OUT/$1-$3.json" $EXTRA >"$OUT/$1-$3.txt" 2>&1
  stop_broker
  python3 - "$OUT/$1-$3.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print(f"{sys.argv[2]}: publish {r['publish_msgs_per_sec']:.0f} msg/s, consume {r['consume_msgs_per_sec']:.0f} msg/s, "
      f"ack p50 {r['publish_to_ack']['p50_ms']} ms p99 {r['publish_to_ack']['p99_ms']} ms, "
      f"e2e p50 {r['publish_to_delivery']['p50_ms']} ms p99 {r['publish_to_delivery']['p99_ms']} ms")
PY
}

for i in $(seq "$PAIRS"); do
  if (( i % 2 )); then run A "$BENCH_A" "$i"; run B "$BENCH_B" "$i"
  else run B "$BENCH_B" "$i"; run A "$BENCH_A" "$i"; fi
done

python3 - "$OUT" "$PAIRS" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def runs(side):
    return [json.load(open(f"{out}/{side}-{i}.json"))["runs"][0] for i in range(1, pairs + 1)]
a, b = runs("A"), runs("B")
def med(rs, f):
    return statistics.median(f(r) for r in rs)
for name, f in [
    ("publish msg/s", lambda r: r["publish_msgs_per_sec"]),
    ("consume msg/s", lambda r: r["consume_msgs_per_sec"]),
    ("ack p50 ms", lambda r: r["publish_to_ack"]["p50_ms"]),
    ("ack p99 ms", lambda r: r["publish_to_ack"]["p99_ms"]),
    ("e2e p50 ms", lambda r: r["publish_to_delivery"]["p50_ms"]),
    ("e2e p99 ms", lambda r: r["publish_to_delivery"]["p99_ms"]),
]:
    ma, mb = med(a, f), med(b, f)
    print(f"{name:14} median A {ma:10.1f}  B {mb:10.1f}  B/A {mb / ma if ma else float('nan'):.3f}")
pair = [rb["publish_msgs_per_sec"] / ra["publish_msgs_per_sec"] for ra, rb in zip(a, b)]
print("publish rate B/A per pair:", " ".join(f"{x:.3f}" for x in pair), f"(median {statistics.median(pair):.3f})")
print(f"results in {out}")
PY
