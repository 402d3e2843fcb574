#!/usr/bin/env bash
# CipherMQ's main job on a fresh checkout: build, make the certificates and
# keys, start a broker with the example config (durable queues, embedded key
# store sealed under certs/aes.key), run a receiver and a sender of COUNT
# end-to-end encrypted messages, check that every one arrived decrypted
# exactly once, print throughput and one decrypted message, say how to
# observe a broker, and stop everything it started. It builds every binary
# the README's "Try it by hand" and "Observe it" use, so those build nothing.
#   COUNT=100000 ./scripts/demo.sh
# It starts its broker on a free port of its own, so a broker already
# running on 5700 is neither used nor disturbed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COUNT=${COUNT:-10000}

PROFILE=${PROFILE:-release}   # PROFILE=debug: the test build's binaries (scripts/demo-check.sh)
if [ "$PROFILE" = release ]; then
  echo "== building the broker, the clients and ciphermq-admin (release; the first build takes about 5 minutes on 2 cores)"
  cargo build --release -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
else
  echo "== building the broker, the clients and ciphermq-admin (debug)"
  cargo build -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
fi
BIN=${CARGO_TARGET_DIR:-target}/$PROFILE

echo "== certificates and keys (whatever exists is kept: ciphermq-pki list shows it)"
"$BIN/ciphermq-pki" --out certs --keys keys >/dev/null
echo "   certs/: CA, server, admin, sender_1, sender_2, receiver_1, receiver_2, aes.key (seals the broker's key store);"
echo "   keys/: X25519 pairs of the receivers; ca/: the CA key"

# A fresh data directory for the demo, so queues of earlier runs don't count,
# and the admin endpoint on, on a free port (the listening line names it).
mkdir -p run
rm -rf run/demo-data run/received
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

# A port of its own, chosen by the kernel: a broker already on 5700 (yours,
# from "Try it by hand") is left alone. The broker prints the address it got
# on stdout once it serves; its log goes to stderr.
echo "== broker on a free port (logs: run/broker.log)"
"$BIN/ciphermq-broker" --config run/demo.toml --address 127.0.0.1:0 >run/broker.out 2>run/broker.log &
BROKER=$!
LISTENING=
for _ in $(seq 300); do
  LISTENING=$(grep -m1 '^ciphermq-broker listening on ' run/broker.out 2>/dev/null || true)
  [ -n "$LISTENING" ] && break
  kill -0 "$BROKER" 2>/dev/null || { echo "the broker did not start:" >&2; cat run/broker.out run/broker.log >&2; exit 1; }
  sleep 0.1
done
[ -n "$LISTENING" ] || { echo "the broker did not say it listens within 30 s:" >&2; cat run/broker.log >&2; exit 1; }
ADDR=$(echo "$LISTENING" | sed -n 's/^ciphermq-broker listening on \([^ ]*\) .*/\1/p')
ENDPOINT=$(echo "$LISTENING" | sed -n 's/.*admin endpoint on \([^ ,]*\).*/\1/p')
echo "   listening on $ADDR, admin endpoint on $ENDPOINT"

echo "== receiver_1: registers its public key, consumes, decrypts, writes, acks (logs: run/receiver.log)"
"$BIN/ciphermq-receiver" --config clients/examples/receiver.json --address "$ADDR" \
    --output-dir run/received --count "$COUNT" --json run/receiver.json >run/receiver.log 2>&1 &
RECV=$!

echo "== sender_1: fetches receiver_1's key, encrypts and publishes $COUNT messages"
"$BIN/ciphermq-sender" --config clients/examples/sender.json --address "$ADDR" --count "$COUNT" \
    --json run/sender.json >run/sender.log 2>&1 \
    || { cat run/sender.log; exit 1; }
wait "$RECV" || { cat run/receiver.log; exit 1; }
RECV=

OUT=run/received/receiver_1_queue_received_messages.jsonl
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
   What receiver_1 decrypted: $OUT
EOF
