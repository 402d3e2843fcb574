#!/usr/bin/env bash
# Runs ciphermq.service under a real systemd, inside a container whose PID 1
# is systemd, as README.md "Operate" installs it: the sysusers file, the unit,
# a config with its certificates readable by the group ciphermq only. Then:
# READY (Type=notify) and the status line, watchdog pings, end-to-end
# encrypted messages through it, `systemctl reload` (check, then SIGHUP),
# `systemctl stop` (STOPPING, drain, exit status 0), and the journal holding
# each line once.
#
#   IMAGE=<a Debian 12 image whose command is /lib/systemd/systemd> packaging/systemd/smoke.sh
#
# Needs a Docker daemon that may give the container CAP_SYS_ADMIN (systemd
# and the unit's sandboxing make mount namespaces), so CI does not run it.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${IMAGE:?set IMAGE to a Debian 12 image with systemd as its command}"
COUNT=${COUNT:-2000}
name=ciphermq-systemd-$$
work=$(mktemp -d)
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
inside() { docker exec "$name" "$@"; }

echo "== release binaries (the host is Debian 12 too: the same glibc)"
cargo build --release -q -p ciphermq-broker -p ciphermq-clients
BIN=${CARGO_TARGET_DIR:-target}/release

echo "== systemd in a container ($IMAGE)"
docker run -d --name "$name" --cap-add SYS_ADMIN --security-opt seccomp=unconfined \
  --tmpfs /run --tmpfs /run/lock -v /sys/fs/cgroup:/sys/fs/cgroup:ro "$IMAGE" >/dev/null
for _ in $(seq 30); do
  state=$(inside systemctl is-system-running 2>/dev/null || true)
  case "$state" in running | degraded) break ;; esac
  sleep 1
done
echo "   system: $state"

echo "== install: sysusers, the unit, /etc/ciphermq (0640 root:ciphermq)"
"$BIN/ciphermq-pki" --out "$work/certs" --keys "$work/keys" >/dev/null
sed -e 's|"certs/|"/etc/ciphermq/certs/|g' \
    -e 's|^data_dir = .*|data_dir = "/var/lib/ciphermq"|' \
    -e 's|^dir = "logs"|dir = "/var/log/ciphermq"|' config.toml >"$work/config.toml"
inside mkdir -p /etc/ciphermq /opt/demo
docker cp "$BIN/ciphermq-broker" "$name:/usr/local/bin/ciphermq-broker"
docker cp packaging/systemd/ciphermq.service "$name:/etc/systemd/system/ciphermq.service"
docker cp packaging/systemd/ciphermq.sysusers "$name:/tmp/ciphermq.sysusers"
docker cp "$work/config.toml" "$name:/etc/ciphermq/config.toml"
docker cp "$work/certs" "$name:/etc/ciphermq/certs"
inside sh -c 'systemd-sysusers /tmp/ciphermq.sysusers >/dev/null 2>&1
  chown -R root:ciphermq /etc/ciphermq && chmod 0750 /etc/ciphermq/certs
  chmod 0640 /etc/ciphermq/config.toml /etc/ciphermq/certs/*.key
  systemctl daemon-reload'

echo "== systemctl start ciphermq (Type=notify: returns once READY=1 came)"
inside systemctl start ciphermq
show() { inside systemctl show ciphermq -p "$1" --value; }
echo "   ActiveState=$(show ActiveState) SubState=$(show SubState) StatusText=$(show StatusText)"
[ "$(show ActiveState)" = active ]
echo "   WatchdogUSec=$(show WatchdogUSec) (pings every half of it)"

echo "== $COUNT encrypted messages through it (clients inside the container)"
docker cp "$BIN/ciphermq-sender" "$name:/opt/demo/"
docker cp "$BIN/ciphermq-receiver" "$name:/opt/demo/"
docker cp "$work/certs" "$name:/opt/demo/certs"
docker cp "$work/keys" "$name:/opt/demo/keys"
for role in sender receiver; do
  sed -e 's|\.\./\.\./certs|/opt/demo/certs|; s|\.\./\.\./keys|/opt/demo/keys|; s|\.\./\.\./data|/opt/demo/out|' \
    "clients/examples/$role.json" >"$work/$role.json"
  docker cp "$work/$role.json" "$name:/opt/demo/$role.json"
done
inside sh -c "cd /opt/demo && (./ciphermq-receiver --config receiver.json --count $COUNT --no-progress >receiver.log 2>&1 &) \
  && ./ciphermq-sender --config sender.json --count $COUNT --no-progress >sender.log 2>&1"
for _ in $(seq 30); do
  got=$(inside sh -c 'wc -l </opt/demo/out/receiver_1_queue_received_messages.jsonl' 2>/dev/null || echo 0)
  [ "$got" -ge "$COUNT" ] && break
  sleep 1
done
echo "   received and decrypted: $got"
[ "$got" -eq "$COUNT" ]

echo "== systemctl reload (--check-config, then SIGHUP)"
inside systemctl reload ciphermq
sleep 1
inside journalctl -u ciphermq --no-pager -o cat | grep -i -m1 "reload"
[ "$(show ActiveState)" = active ]

echo "== systemctl stop (STOPPING=1, drain, exit status)"
inside systemctl stop ciphermq
echo "   ActiveState=$(show ActiveState) Result=$(show Result) ExecMainStatus=$(show ExecMainStatus)"
[ "$(show Result)" = success ]
[ "$(show ExecMainStatus)" = 0 ]

echo "== the journal holds each line once (console to stderr, no JSON files)"
dups=$(inside sh -c 'journalctl -u ciphermq --no-pager -o cat | grep -v "^$" | sort | uniq -d | wc -l')
echo "   repeated lines: $dups; files in /var/log/ciphermq: $(inside sh -c 'ls /var/log/ciphermq | wc -l')"
[ "$dups" -eq 0 ]
echo "== ok: ciphermq.service started (notify), served $COUNT messages, reloaded and stopped cleanly under systemd"
