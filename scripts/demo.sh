#!/usr/bin/env bash
# CipherMQ's main job on a fresh checkout: build, make the certificates and
# keys, start a broker with the example config (durable queues, embedded key
# store sealed under certs/aes.key), run a receiver and a sender of COUNT
# end-to-end encrypted messages, check that every one arrived decrypted
# exactly once, print throughput and one decrypted message, say how to
# observe a broker, and stop everything it started. It builds every binary
# the README's "Try it by hand" and "Observe it" use, so those build nothing.
#   COUNT=100000 ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COUNT=${COUNT:-10000}
ADDR=127.0.0.1:5700   # the address clients/examples/*.json use

echo "== building the broker, the clients and ciphermq-admin (release; the first build takes about 5 minutes on 2 cores)"
cargo build --release -q -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
BIN=${CARGO_TARGET_DIR:-target}/release

echo "== certificates and keys (whatever exists is kept: ciphermq-pki list shows it)"
"$BIN/ciphermq-pki" --out certs --keys keys >/dev/null
echo "   certs/: CA, server, admin, sender_1, sender_2, receiver_1, receiver_2, aes.key (seals the broker's key store);"
echo "   keys/: X25519 pairs of the receivers; ca/: the CA key"

# A fresh data directory for the demo, so queues of earlier runs don't count,
# and the admin endpoint on, on a free port (the listening line names it).
mkdir -p run
rm -rf run/demo-data data/receiver_1_queue_received_messages.jsonl
sed -e "s|^data_dir = .*|data_dir = \"$ROOT/run/demo-data\"|" \
    -e "s|\"certs/|\"$ROOT/certs/|g" \
    -e '/^\[admin\]/,/^\[/{s|^enabled = false|enabled = true|;s|^address = .*|address = "127.0.0.1:0"|;}' \
    config.toml > run/demo.toml

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
assert len(lines) == count == len(ids), "not every message arrived exactly once"
print("== every message arrived, decrypted, exactly once")
first = open(out).readline()
print(f"== the first line receiver_1 wrote to {out}, pretty-printed:")
print(json.dumps(json.loads(first), indent=2, ensure_ascii=False))
content = lines[0].get("content")
try:
    inner = json.loads(content)
except (TypeError, ValueError):
    inner = None
if isinstance(inner, dict):
    print("   its content, as sender_1 wrote it before encrypting (the broker relayed only ciphertext):")
    print(json.dumps(inner, indent=2, ensure_ascii=False))
PY

ENDPOINT=$(sed -n 's/.*admin endpoint on \([^ ]*\).*/\1/p' run/broker.log | head -n1)
echo "== the demo broker as its operator sees it: ciphermq-admin --endpoint $ENDPOINT status"
"$BIN/ciphermq-admin" --endpoint "$ENDPOINT" status

cat <<EOF
== observe a broker of your own: README.md, "Observe it"
   (config.toml: [admin] enabled = true; then $BIN/ciphermq-broker --config config.toml)
   curl --cacert certs/ca.crt --cert certs/admin.crt --key certs/admin.key https://localhost:9091/api/status
   curl --cacert certs/ca.crt --cert certs/admin.crt --key certs/admin.key https://localhost:9091/metrics
   $BIN/ciphermq-admin status          # also: queues, connections, exchanges
   $BIN/ciphermq-admin dashboard       # the web dashboard on http://127.0.0.1:9095/
   The demo broker's own log, connections and declares included: run/broker.log
EOF
