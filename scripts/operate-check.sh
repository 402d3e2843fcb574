#!/usr/bin/env bash
# Runs the README's "Operate" commands against the real binaries, as an
# operator would, in a scratch directory: --check-config, rotating the
# server certificate (ciphermq-pki init --force, ciphermq-admin reload: new
# handshakes get it; a client's with issue --force; list), revoking a client
# (ciphermq-pki revoke, tls.crl_path, reload: its open session is closed and
# its handshakes fail; the list renewed), an upgrade
# (SIGTERM drains and exits 0, the new binary checks the config and starts
# on the same data), and a backup and restore of the data directory with
# the Postgres mirror (the watermark deleted as the README says: rows
# caught up, none twice). The systemd and container commands need root and
# a service manager: packaging/systemd/smoke.sh and packaging/docker/smoke.sh
# run those. scripts/test.sh runs this after the tests.
#
#   scripts/operate-check.sh        # debug binaries; PROFILE=release for those
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PROFILE=${PROFILE:-debug}
PG_DB=ciphermq_operate_check

if [ "$PROFILE" = release ]; then
  cargo build -q --release -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
else
  cargo build -q -p ciphermq-broker -p ciphermq-clients -p ciphermq-admin
fi
TARGET=${CARGO_TARGET_DIR:-target}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
BIN=$TARGET/$PROFILE

W=$(mktemp -d)
BROKER=
HELD=
cleanup() {
  [ -n "$HELD" ] && kill "$HELD" 2>/dev/null || true
  [ -n "$BROKER" ] && kill -9 "$BROKER" 2>/dev/null || true
  pkill -P $$ -x sleep 2>/dev/null || true   # what fed the held session
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
fail() {
  echo "operate-check: FAILED: $*" >&2
  echo "--- broker log (last 30 lines)" >&2
  tail -n 30 "$W/broker.log" >&2 || true
  exit 1
}
cd "$W"
mkdir bin
cp "$BIN/ciphermq-broker" "$BIN/ciphermq-admin" "$BIN/ciphermq-pki" bin/
export PATH=$W/bin:$PATH

psql_do() { psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_do -d postgres -c "DROP DATABASE IF EXISTS $PG_DB" -c "CREATE DATABASE $PG_DB"

echo "== certificates (ciphermq-pki), a config with the admin endpoint and the Postgres mirror"
ciphermq-pki >/dev/null
sed -e "s|^data_dir = .*|data_dir = \"$W/data\"|" \
    -e "s|\"certs/|\"$W/certs/|g" \
    -e '/^\[server\]/,/^\[/{s|^address = .*|address = "127.0.0.1:0"|;s|^shards = .*|shards = 2|;}' \
    -e '/^\[admin\]/,/^\[/{s|^enabled = false|enabled = true|;s|^address = .*|address = "127.0.0.1:0"|;}' \
    -e '/^\[database\]/,/^\[/{s|^backend = .*|backend = "postgres"|;s|^dbname = .*|dbname = "'"$PG_DB"'"|;s|^flush_interval_ms = .*|flush_interval_ms = 20|;}' \
    "$ROOT/config.toml" > config.toml

echo "== ciphermq-broker --check-config"
ciphermq-broker --check-config --config config.toml | grep "config OK" >/dev/null || fail "check-config"

start() {
  : > broker.log
  ciphermq-broker --config config.toml >>broker.log 2>&1 &
  BROKER=$!
  for _ in $(seq 300); do
    grep -q "listening on" broker.log && break
    kill -0 "$BROKER" 2>/dev/null || fail "the broker did not start"
    sleep 0.1
  done
  grep -q "listening on" broker.log || fail "no listening line"
  ADDR=$(sed -n 's/.*listening on \([^ ]*\) with.*/\1/p' broker.log | head -n1)
  ENDPOINT=$(sed -n 's/.*admin endpoint on \([^ ]*\).*/\1/p' broker.log | head -n1)
}
# `systemctl stop`: SIGTERM, the drain, exit status 0.
stop() {
  kill -TERM "$BROKER"
  local rc=0
  wait "$BROKER" || rc=$?
  BROKER=
  [ "$rc" = 0 ] || fail "the broker exited $rc on SIGTERM"
}
admin() { ciphermq-admin --endpoint "$ENDPOINT" --broker "$ADDR" "$@"; }
# Lines sent as CN $1 (certs/$1.crt), then quit; what the broker answered.
as_cn() {
  local cn=$1
  shift
  printf '%s\n' "$@" quit |
    openssl s_client -quiet -connect "$ADDR" -cert "certs/$cn.crt" -key "certs/$cn.key" \
      -CAfile certs/ca.crt -verify_return_error 2>/dev/null || true
}
served_serial() {
  openssl s_client -connect "$ADDR" -cert certs/admin.crt -key certs/admin.key \
    -CAfile certs/ca.crt </dev/null 2>/dev/null | openssl x509 -noout -serial
}
envelope() {
  printf '{"message_id":"%s","receiver_client_id":"receiver_1","enc_session_key":"a2V5","nonce":"bm9uY2U=","ciphertext":"QUFB"}' "$1"
}
mirrored() { psql_do -d "$PG_DB" -At -c "$1"; }
# Waits (5 s at most) until ciphermq-admin shows ops_q with $1 ready
# messages: the endpoint's figures are refreshed every second or so.
expect_ready() {
  local ready=none
  for _ in $(seq 50); do
    ready=$(admin queues --json | python3 -c 'import json,sys; q=[q for q in json.load(sys.stdin)["queues"] if q["name"]=="ops_q"]; print(q[0]["ready"] if q else "none")')
    [ "$ready" = "$1" ] && return 0
    sleep 0.1
  done
  fail "ops_q shows $ready ready messages, not $1 ($2)"
}

start
admin status >/dev/null || fail "ciphermq-admin status"

echo "== rotating the server certificate: ciphermq-pki init --force, check, ciphermq-admin reload"
before=$(served_serial)
ciphermq-pki init --force >/dev/null
ciphermq-pki issue sender_1 --force >/dev/null
ciphermq-pki list >/dev/null
ciphermq-broker --check-config --config config.toml >/dev/null || fail "check-config after the rotation"
admin reload >/dev/null || fail "ciphermq-admin reload"
after=$(served_serial)
on_disk=$(openssl x509 -noout -serial -in certs/server.crt)
[ "$before" != "$after" ] || fail "still serving the old certificate ($before)"
[ "$after" = "$on_disk" ] || fail "serving $after, not certs/server.crt ($on_disk)"
echo "   served $before, then $after"

echo "== revoking sender_2: ciphermq-pki revoke, tls.crl_path, ciphermq-admin reload"
# sender_2 connected beforehand, and holding its session open.
(echo heartbeat; exec sleep 60) |
  openssl s_client -quiet -connect "$ADDR" -cert certs/sender_2.crt -key certs/sender_2.key \
    -CAfile certs/ca.crt >held.out 2>&1 &
HELD=$!
for _ in $(seq 100); do grep -q "OK heartbeat" held.out && break; sleep 0.1; done
grep -q "OK heartbeat" held.out || fail "sender_2's session did not start"
ciphermq-pki revoke sender_2 >/dev/null 2>&1
sed -i "s|^key_path = \"$W/certs/server.key\"|&\ncrl_path = \"$W/certs/ca.crl\"|" config.toml
grep -q "^crl_path" config.toml || fail "crl_path not set"
ciphermq-broker --check-config --config config.toml >/dev/null || fail "check-config with the CRL"
admin reload >/dev/null || fail "reload with the CRL"
for _ in $(seq 100); do kill -0 "$HELD" 2>/dev/null || break; sleep 0.1; done
kill -0 "$HELD" 2>/dev/null && fail "sender_2's open session was not closed"
HELD=
as_cn sender_2 heartbeat | grep "OK heartbeat" >/dev/null && fail "sender_2 still completes a handshake"
as_cn sender_1 heartbeat | grep "OK heartbeat" >/dev/null || fail "sender_1 (re-issued) was turned away"
ciphermq-pki revoke | grep "1 certificate(s) revoked, CRL number 2" >/dev/null || fail "renewing the list"
admin reload >/dev/null || fail "reload with the renewed list"
as_cn sender_2 heartbeat | grep "OK heartbeat" >/dev/null && fail "sender_2 served after the renewal"
echo "   sender_2's session closed, its handshakes refused; sender_1 served"

echo "== a message through, then an upgrade: stop (drain, exit 0), install, check, start"
as_cn admin "declare_exchange ops" "declare_queue ops_q" "bind ops_q ops k" >/dev/null
as_cn sender_1 "publish ops k $(envelope m-1)" | grep "ACK m-1" >/dev/null || fail "publish m-1"
stop
install -m 0755 "$BIN/ciphermq-broker" bin/ciphermq-broker
ciphermq-broker --check-config --config config.toml >/dev/null || fail "check-config after the upgrade"
start
expect_ready 1 "after the upgrade"

echo "== backup (stopped), one more message, restore, the mirror's watermark deleted, start"
stop
cp -a data backup
start
as_cn sender_1 "publish ops k $(envelope m-2)" | grep "ACK m-2" >/dev/null || fail "publish m-2"
for _ in $(seq 100); do
  [ "$(mirrored "SELECT count(*) FROM message_metadata WHERE message_id IN ('m-1','m-2')")" = 2 ] && break
  sleep 0.1
done
stop
rm -rf data && cp -a backup data
psql_do -d "$PG_DB" -c "DELETE FROM ciphermq_mirror_watermark;"
start
expect_ready 1 "after the restore: m-1 only"
for _ in $(seq 100); do
  n=$(mirrored "SELECT count(*) FROM ciphermq_mirror_watermark")
  [ "$n" != 0 ] && break
  sleep 0.1
done
rows=$(mirrored "SELECT count(*) || ' ' || count(DISTINCT message_id) FROM message_metadata")
[ "$rows" = "2 2" ] || fail "the mirror holds '$rows' (rows, distinct ids), not 2 2"
stop
psql_do -d postgres -c "DROP DATABASE IF EXISTS $PG_DB"
echo "operate-check: every README Operate command that runs without root passed"
