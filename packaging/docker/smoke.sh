#!/usr/bin/env bash
# Builds the container image and runs it as packaging/docker/README.md says:
# fresh certificates mounted read-only, the io_uring seccomp profile, a named
# volume; waits for the HEALTHCHECK to pass, runs --check-config inside,
# moves end-to-end encrypted messages through it with the host's sender and
# receiver, restarts the container and checks that nothing comes back twice,
# then stops it and checks the exit status of the drain.
#
#   packaging/docker/smoke.sh                  # build and run
#   SKIP_BUILD=1 IMAGE=ciphermq packaging/docker/smoke.sh
#   MEMLOCK=8388608:8388608 packaging/docker/smoke.sh   # where the daemon may not lift the limit
#
# Needs a Docker daemon with BuildKit, so it is not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE=${IMAGE:-ciphermq:smoke}
PORT=${PORT:-15700}
COUNT=${COUNT:-2000}
# --ulimit memlock: unlimited, as the README says; a daemon whose own hard
# limit is lower (and may not raise it) needs that limit given instead.
MEMLOCK=${MEMLOCK:--1:-1}
DOCKERFILE=${DOCKERFILE:-packaging/docker/Dockerfile}
name=ciphermq-smoke-$$
work=$(mktemp -d)
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker volume rm -f "$name-data" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ "${SKIP_BUILD:-}" != 1 ]; then
  echo "== docker build -f $DOCKERFILE -t $IMAGE ."
  docker build -f "$DOCKERFILE" -t "$IMAGE" .
fi
echo "== the host's clients (release)"
cargo build --release -q -p ciphermq-clients
BIN=${CARGO_TARGET_DIR:-target}/release

echo "== certificates, readable by the container's user (GID 10001)"
"$BIN/ciphermq-pki" --out "$work/certs" --keys "$work/keys" >/dev/null
chgrp -R 10001 "$work/certs"
chmod 0750 "$work/certs"
chmod 0640 "$work/certs"/*.key

start() {
  docker run -d --name "$name" \
    --security-opt seccomp=packaging/docker/seccomp-io_uring.json \
    --ulimit "memlock=$MEMLOCK" --stop-timeout 40 \
    -p "127.0.0.1:$PORT:5700" \
    -v "$work/certs:/etc/ciphermq/certs:ro" -v "$name-data:/var/lib/ciphermq" \
    "$IMAGE" >/dev/null
  for _ in $(seq 60); do
    status=$(docker inspect -f '{{.State.Health.Status}}' "$name")
    [ "$status" = healthy ] && break
    [ "$(docker inspect -f '{{.State.Running}}' "$name")" = true ] || { docker logs "$name"; exit 1; }
    sleep 1
  done
  echo "   health: $status"
  [ "$status" = healthy ] || { docker logs "$name"; exit 1; }
}

echo "== docker run (seccomp-io_uring.json, memlock $MEMLOCK, a named volume)"
start
docker logs "$name" 2>&1 | grep -m1 listening

echo "== --check-config inside the container"
docker exec "$name" ciphermq-broker --check-config --config /etc/ciphermq/config.toml

# The demo's client configs, pointed at this run's certificates and keys.
for role in sender receiver; do
  sed -e "s|\.\./\.\./certs|$work/certs|; s|\.\./\.\./keys|$work/keys|; s|\.\./\.\./data|$work/out|" \
    "clients/examples/$role.json" >"$work/$role.json"
done
out="$work/out/receiver_1_queue_received_messages.jsonl"

echo "== $COUNT encrypted messages: sender_1 -> container -> receiver_1"
"$BIN/ciphermq-receiver" --config "$work/receiver.json" --address "127.0.0.1:$PORT" \
  --count "$COUNT" >"$work/receiver.log" 2>&1 &
recv=$!
"$BIN/ciphermq-sender" --config "$work/sender.json" --address "127.0.0.1:$PORT" \
  --count "$COUNT" >"$work/sender.log" 2>&1 || { cat "$work/sender.log"; exit 1; }
wait "$recv" || { cat "$work/receiver.log"; exit 1; }
got=$(wc -l <"$out")
echo "   received and decrypted: $got"
[ "$got" -eq "$COUNT" ]

echo "== restart with the same volume: acknowledged messages stay acknowledged"
docker stop "$name" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$name")
echo "   docker stop: exit status $code"
[ "$code" -eq 0 ]
docker rm "$name" >/dev/null
start
"$BIN/ciphermq-receiver" --config "$work/receiver.json" --address "127.0.0.1:$PORT" \
  --idle-exit 3 --json "$work/receiver2.json" >"$work/receiver2.log" 2>&1 || { cat "$work/receiver2.log"; exit 1; }
again=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["received"])' "$work/receiver2.json")
echo "   deliveries after the restart: $again"
[ "$again" -eq 0 ]

docker stop "$name" >/dev/null
echo "== ok: image $IMAGE built, healthy, moved $COUNT messages, drained and stopped with status 0 twice"
