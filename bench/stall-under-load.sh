#!/usr/bin/env bash
# What one large operation does to the other clients of its shard: fills
# one queue with COUNT messages (no consumer), then runs a publisher +
# consumer pair at a fixed 5,000 msg/s on another queue of the same shard
# and, 3 s into its 8 s, purges or deletes the full queue, or closes a
# receiver holding COUNT deliveries unacked (`close`: QUEUES queues, each
# consumed with PREFETCH; bench/hoarder.py), or does nothing (the
# baseline). Prints the pair's publish->ACK and delivery
# percentiles, the bench's stall windows, and the broker's stall count
# (ciphermq_shard_stalls_total) and warnings during the run.
#
#   bench/stall-under-load.sh purge|delete|close|none [BROKER_BIN]
#
# Durable, 1 shard, 300 B bodies in the full queue (COUNT, default 990,000),
# 1 KiB for the pair. Needs release builds of ciphermq-broker, -bench,
# -admin and -pki (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
op=${1:?purge, delete, close or none}
BIN=${BIN:-target/release}
BROKER_BIN=${2:-$BIN/ciphermq-broker}
COUNT=${COUNT:-990000}
PORT=${PORT:-5790}
QUEUES=${QUEUES:-100}
PREFETCH=${PREFETCH:-10000}
W=$(mktemp -d)
HOARDER=
trap 'kill $HOARDER $BROKER 2>/dev/null || true; wait 2>/dev/null; rm -rf "$W"' EXIT
"$BIN/ciphermq-pki" --out "$W/certs" --keys "$W/keys" >/dev/null
cat >"$W/config.toml" <<TOML
[server]
address = "127.0.0.1:$PORT"
shards = 1
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
memory_budget_mb = 4096
[acl]
admin_cns = ["admin"]
sender_cns = ["sender_1", "sender_2"]
receiver_cns = ["receiver_1", "receiver_2"]
[admin]
enabled = true
address = "127.0.0.1:$((PORT + 1))"
TOML
"$BROKER_BIN" --config "$W/config.toml" >"$W/broker.log" 2>&1 &
BROKER=$!
sleep 2
bench() { "$BIN/ciphermq-bench" --target ciphermq --addr "127.0.0.1:$PORT" --certs "$W/certs" "$@"; }
admin() { "$BIN/ciphermq-admin" --endpoint "127.0.0.1:$((PORT + 1))" --broker "127.0.0.1:$PORT" --ca "$W/certs/ca.crt" --cert "$W/certs/admin.crt" --key "$W/certs/admin.key" "$@"; }
stalls() { admin --json status >/dev/null; curl -s --cacert "$W/certs/ca.crt" --cert "$W/certs/admin.crt" --key "$W/certs/admin.key" \
  "https://127.0.0.1:$((PORT + 1))/metrics" | awk '/^ciphermq_shard_stalls_total/ {s += $2} END {print s + 0}'; }
if [ "$op" = close ]; then
  bench --count "$COUNT" --size 300 --publishers 2 --consumers 0 --queues "$QUEUES" >/dev/null
  queues=$(seq -f "receiver_1_bench_q%g" 0 $((QUEUES - 1)))
  # shellcheck disable=SC2086 # one argument per queue
  sleep 1000 | python3 bench/hoarder.py "127.0.0.1:$PORT" "$W/certs" receiver_1 "$PREFETCH" "$COUNT" $queues >"$W/hoarder.txt" &
  HOARDER=$!
  until grep -q holding "$W/hoarder.txt" 2>/dev/null; do
    kill -0 $HOARDER || { echo "the hoarder failed" >&2; exit 1; }
    sleep 0.2
  done
else
  bench --count "$COUNT" --size 300 --publishers 2 --consumers 0 >/dev/null
fi
sleep 1
before=$(stalls)
bench --receiver receiver_2 --rate 5000 --duration 8s --size 1024 >"$W/pair.txt" 2>&1 &
pair=$!
sleep 3
case $op in
  purge) admin purge receiver_1_bench_q0 ;;
  delete) admin delete queue receiver_1_bench_q0 ;;
  close) kill $HOARDER; HOARDER= ;;
  none) ;;
  *) echo "unknown op $op" >&2; exit 2 ;;
esac
wait $pair
echo "broker stalls during the run: $(($(stalls) - before))"
[ -z "${KEEP_LOG:-}" ] || cp "$W/broker.log" "$KEEP_LOG"
grep "stalled" "$W/broker.log" | sed 's/.*late_ms/  late_ms/' || true
grep -E "^ciphermq run|^ciphermq  " "$W/pair.txt"
