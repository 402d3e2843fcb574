#!/usr/bin/env bash
# CipherMQ's main job on a fresh checkout: build, make the certificates and
# keys, start a broker with the example config (durable queues, embedded key
# store), run a receiver and a sender of COUNT end-to-end encrypted messages,
# check that every one arrived decrypted exactly once, print throughput, and
# stop everything it started.
#   COUNT=100000 ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COUNT=${COUNT:-10000}
ADDR=127.0.0.1:5700   # the address clients/examples/*.json use

echo "== building (release; the first build takes a few minutes)"
cargo build --release -q -p ciphermq-broker -p ciphermq-clients
BIN=target/release

echo "== certificates and keys (whatever exists is kept: ciphermq-pki list shows it)"
"$BIN/ciphermq-pki" --out certs --keys keys >/dev/null
echo "   certs/: CA, server, admin, sender_1, sender_2, receiver_1, receiver_2; keys/: X25519 pairs of the receivers; ca/: the CA key"

# A fresh data directory for the demo, so queues of earlier runs don't count.
mkdir -p run
rm -rf run/demo-data data/receiver_1_queue_received_messages.jsonl
sed -e "s|^data_dir = .*|data_dir = \"$ROOT/run/demo-data\"|" \
    -e "s|\"certs/|\"$ROOT/certs/|g" config.toml > run/demo.toml

cleanup() {
  [ -n "${RECV:-}" ] && kill "$RECV" 2>/dev/null || true
  [ -n "${BROKER:-}" ] && kill "$BROKER" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo "== broker on $ADDR (logs: run/broker.log)"
"$BIN/ciphermq-broker" --config run/demo.toml --address "$ADDR" >run/broker.log 2>&1 &
BROKER=$!
for _ in $(seq 100); do
  grep -q "listening" run/broker.log 2>/dev/null && break
  kill -0 "$BROKER" 2>/dev/null || { cat run/broker.log; exit 1; }
  sleep 0.1
done

echo "== receiver_1: registers its public key, consumes, decrypts, writes, acks (logs: run/receiver.log)"
"$BIN/ciphermq-receiver" --config clients/examples/receiver.json --count "$COUNT" \
    --json run/receiver.json >run/receiver.log 2>&1 &
RECV=$!

echo "== sender_1: fetches receiver_1's key, encrypts and publishes $COUNT messages"
"$BIN/ciphermq-sender" --config clients/examples/sender.json --count "$COUNT" --json run/sender.json >run/sender.log 2>&1 \
    || { cat run/sender.log; exit 1; }
wait "$RECV" || { cat run/receiver.log; exit 1; }
RECV=

OUT=data/receiver_1_queue_received_messages.jsonl
python3 - "$OUT" "$COUNT" <<'PY'
import json, sys
out, count = sys.argv[1], int(sys.argv[2])
s = json.load(open("run/sender.json"))
lines = [json.loads(l) for l in open(out)]
ids = {l["message_id"] for l in lines}
print(f"   sender: {s.get('acked')} acked of {s.get('sent')} sent, {s.get('failed')} failed, "
      f"{s.get('msgs_per_sec', s.get('msg_per_sec', 0)):,.0f} msg/s (encryption included)")
print(f"   receiver: {len(lines)} messages decrypted into {out}, {len(ids)} distinct")
print(f"   first: {lines[0]['message_id']}: {str(lines[0]['content'])[:70]}")
assert len(lines) == count == len(ids), "not every message arrived exactly once"
print("== every message arrived, decrypted, exactly once")
PY
