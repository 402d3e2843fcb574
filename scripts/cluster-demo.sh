#!/usr/bin/env bash
# A CipherMQ cluster on this host: three nodes on loopback, coordinated by
# the local PostgreSQL (127.0.0.1:5432, user postgres, a database of their
# own: ciphermq_cluster_demo, made afresh). receiver_1 starts on node-1 and
# receiver_2 on node-2; a sender that knows only node-3, which holds neither,
# publishes COUNT end-to-end encrypted messages to each, following the
# nodes' redirects, and while it does, receiver_2 is moved to node-3
# (`ciphermq-admin move`). It checks that every message arrived decrypted
# exactly once, prints the figures and the cluster as an operator sees it,
# and stops everything it started.
#   COUNT=2000 ./scripts/cluster-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COUNT=${COUNT:-500}
DB=${CLUSTER_DEMO_DB:-ciphermq_cluster_demo}
PROFILE=${PROFILE:-release}

echo "== building the broker, the clients, ciphermq-admin and the cluster_publish example ($PROFILE)"
flag=""
[ "$PROFILE" = release ] && flag=--release
cargo build $flag -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
cargo build $flag -p ciphermq-client-examples --example cluster_publish
BIN=${CARGO_TARGET_DIR:-target}/$PROFILE

echo "== certificates and keys (whatever exists is kept)"
"$BIN/ciphermq-pki" --out certs --keys keys >/dev/null

echo "== PostgreSQL: database $DB, made afresh"
psql -h 127.0.0.1 -U postgres -d postgres -qAtc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
psql -h 127.0.0.1 -U postgres -d postgres -qAtc "CREATE DATABASE $DB" >/dev/null

W=run/cluster
rm -rf "$W"
mkdir -p "$W"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# One config per node: the example config with the Postgres backend, the
# cluster on, a data directory of its own and the admin endpoint on.
for n in 1 2 3; do
  sed -e "s|^data_dir = .*|data_dir = \"$ROOT/$W/node-$n-data\"|" \
      -e "s|\"certs/|\"$ROOT/certs/|g" \
      -e '/^\[admin\]/,/^\[/{s|^enabled = false|enabled = true|;s|^address = .*|address = "127.0.0.1:0"|;}' \
      -e '/^\[database\]/,/^\[/{s|^backend = .*|backend = "postgres"|;s|^dbname = .*|dbname = "'"$DB"'"|;s|^sslmode = .*|sslmode = "disable"|;}' \
      -e '/^\[cluster\]/,/^\[/{s|^enabled = false|enabled = true|;s|^node_id = .*|node_id = "node-'"$n"'"|;}' \
      config.toml > "$W/node-$n.toml"
done

ADDRS=() ENDPOINTS=()
for n in 1 2 3; do
  "$BIN/ciphermq-broker" --config "$W/node-$n.toml" --address 127.0.0.1:0 >"$W/node-$n.out" 2>"$W/node-$n.log" &
  PIDS+=($!)
  line=
  for _ in $(seq 300); do
    line=$(grep -m1 '^ciphermq-broker listening on ' "$W/node-$n.out" 2>/dev/null || true)
    [ -n "$line" ] && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || { echo "node-$n did not start:" >&2; cat "$W/node-$n.out" "$W/node-$n.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$line" ] || { echo "node-$n did not start within 30 s" >&2; cat "$W/node-$n.log" >&2; exit 1; }
  ADDRS+=("$(echo "$line" | sed -n 's/^ciphermq-broker listening on \([^ ]*\) .*/\1/p')")
  ENDPOINTS+=("$(echo "$line" | sed -n 's/.*admin endpoint on \([^ ,]*\).*/\1/p')")
  echo "   node-$n on ${ADDRS[-1]} (admin endpoint ${ENDPOINTS[-1]}, logs $W/node-$n.log)"
done

# The receivers' configs: the example's, with absolute paths and their own
# certificates.
for r in receiver_1 receiver_2; do
  python3 - "$ROOT" "$r" "$W/$r.json" <<'PY'
import json, sys
root, cn, out = sys.argv[1:]
c = json.load(open(f"{root}/clients/examples/receiver.json"))
c["tls"]["certificate_path"] = f"{root}/certs/ca.crt"
c["tls"]["client_cert_path"] = f"{root}/certs/{cn}.crt"
c["tls"]["client_key_path"] = f"{root}/certs/{cn}.key"
c["private_key_path"] = f"{root}/keys/{{cn}}_private.key"
json.dump(c, open(out, "w"), indent=2)
PY
done

echo "== receiver_1 on node-1, receiver_2 on node-2: each is placed on the node it connects to first"
for i in 1 2; do
  r=receiver_$i
  "$BIN/ciphermq-receiver" --config "$W/$r.json" --address "${ADDRS[$((i - 1))]}" \
      --output-dir "$W/received" --count "$COUNT" --json "$W/$r-report.json" >"$W/$r.log" 2>&1 &
  PIDS+=($!)
done
for r in receiver_1 receiver_2; do
  for _ in $(seq 300); do
    grep -q "consuming" "$W/$r.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "consuming" "$W/$r.log" || { echo "$r did not start consuming:" >&2; cat "$W/$r.log" >&2; exit 1; }
done

echo "== sender_1 knows only node-3 (${ADDRS[2]}), which holds neither receiver: $COUNT messages to each"
started=$(date +%s.%N)
CIPHERMQ_SEEDS="${ADDRS[2]}" CIPHERMQ_RECEIVERS=receiver_1,receiver_2 CIPHERMQ_CERTS="$ROOT/certs" \
  CIPHERMQ_KEYS="$W/sender-keys" CIPHERMQ_INTERVAL_MS=${INTERVAL_MS:-10} \
  "$BIN/examples/cluster_publish" "$COUNT" >"$W/sender.log" 2>&1 &
SENDER=$!
# While it sends: once a third of receiver_2's messages are stored, move
# receiver_2 from node-2 to node-3, drain-first, with what it holds.
for _ in $(seq 600); do
  n=$(grep -c "^receiver_2: " "$W/sender.log" 2>/dev/null || true)
  [ "${n:-0}" -ge $((COUNT / 3)) ] && break
  kill -0 "$SENDER" 2>/dev/null || break
  sleep 0.05
done
echo "== while it sends (${n:-0} of receiver_2's stored): ciphermq-admin move receiver_2 node-3"
move_started=$(date +%s.%N)
"$BIN/ciphermq-admin" --broker "${ADDRS[1]}" --endpoint "${ENDPOINTS[1]}" --cert "$ROOT/certs/admin.crt" \
  --key "$ROOT/certs/admin.key" --ca "$ROOT/certs/ca.crt" move receiver_2 node-3 | sed 's/^/   /'
move_finished=$(date +%s.%N)
after=$(grep -c "^receiver_2: " "$W/sender.log" 2>/dev/null || true)
wait "$SENDER" || { cat "$W/sender.log"; exit 1; }
finished=$(date +%s.%N)
python3 -c "import sys; print(f'   the move took {float(sys.argv[2]) - float(sys.argv[1]):.2f} s; {sys.argv[3]} of receiver_2\'s messages were stored when it ended, the rest after it, on node-3')" \
  "$move_started" "$move_finished" "$after"
grep "lives on" "$W/sender.log" | sed 's/^/   /'
for i in 1 2; do
  wait "${PIDS[$((i + 2))]}" || { cat "$W/receiver_$i.log"; exit 1; }
done

python3 - "$W" "$COUNT" "$started" "$finished" <<'PY'
import json, sys
w, count, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
redirects = [l for l in open(f"{w}/sender.log") if "redirects followed" in l][0].split()[0]
print(f"   sender: {2 * count} messages acked in {t1 - t0:.1f} s ({2 * count / (t1 - t0):,.0f} msg/s, "
      f"one at a time, encryption included), {redirects} redirects followed")
for cn in ("receiver_1", "receiver_2"):
    lines = [json.loads(l) for l in open(f"{w}/received/{cn}_queue_received_messages.jsonl")]
    ids = {l["message_id"] for l in lines}
    wrong = [l for l in lines if f"for {cn}" not in l.get("content", "")]
    print(f"   {cn}: {len(lines)} messages decrypted, {len(ids)} distinct, {len(wrong)} not for it")
    assert len(lines) == count == len(ids) and not wrong, f"{cn}: not every message arrived exactly once"
print("== every message arrived at its receiver's node, decrypted, exactly once")
PY

echo "== the cluster as its operator sees it: ciphermq-admin --endpoint ${ENDPOINTS[2]} nodes"
"$BIN/ciphermq-admin" --endpoint "${ENDPOINTS[2]}" nodes
echo "   receiver_2 now lives on node-3 at epoch 2; a node silent past its lease is taken over by the others (docs/CLUSTER.md)."
