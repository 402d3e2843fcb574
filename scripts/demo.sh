#!/usr/bin/env bash
# The main job on a fresh checkout: build, make the certificates, start a broker
# with the example config, move messages through it, print the figures, stop.
#   COUNT=100000 ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-10000}
ADDR=${ADDR:-127.0.0.1:5700}

echo "== building (release)"
cargo build --release -q -p ciphermq-broker -p ciphermq-clients -p ciphermq-bench
BIN=target/release

echo "== certificates (an existing CA is kept)"
"$BIN/ciphermq-pki" --out certs --keys keys >/dev/null
echo "   certs/: CA, server, admin, sender_1, sender_2, receiver_1, receiver_2"

mkdir -p run
echo "== starting the broker (config.toml, $ADDR)"
"$BIN/ciphermq-broker" --config config.toml --address "$ADDR" >run/broker.log 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  grep -q "listening" run/broker.log 2>/dev/null && break
  kill -0 $BROKER 2>/dev/null || { cat run/broker.log; exit 1; }
  sleep 0.1
done

echo "== moving $COUNT messages: sender_1 -> exchange bench -> receiver_1_bench -> receiver_1"
"$BIN/ciphermq-bench" --addr "$ADDR" --certs certs --count "$COUNT" --publishers 1 --consumers 1 --json run/demo.json >/dev/null
python3 - <<'PY'
import json
r = json.load(open("run/demo.json"))
print(f"   published {r['acked']} (acked), delivered {r['delivered']}")
print(f"   publish {r['publish_msgs_per_sec']:,.0f} msg/s, consume {r['consume_msgs_per_sec']:,.0f} msg/s")
print(f"   publish->ACK p50 {r['publish_to_ack']['p50_ms']} ms, p99 {r['publish_to_ack']['p99_ms']} ms")
assert r["acked"] == r["delivered"] == r["count"], "not every message arrived"
print("== all messages arrived")
PY
