#!/usr/bin/env bash
# The demo as a newcomer runs it, with port 5700 (the example configs' port)
# already taken by someone else's listener: the demo must still pass, on a
# port of its own, and never connect to that listener. Debug binaries (the
# test build's); a few hundred messages. scripts/test.sh runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d)
HOLDER=
cleanup() {
  [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

# Someone else's service on 5700: it counts the connections it accepts.
python3 - "$W/accepted" "$W/ready" <<'PY' &
import socket, sys
accepted, ready = sys.argv[1], sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", 5700))
except OSError as e:
    open(ready, "w").write(f"taken already: {e}\n")
    sys.exit(0)
s.listen(16)
open(ready, "w").write("held\n")
n = 0
while True:
    c, _ = s.accept()
    n += 1
    open(accepted, "w").write(f"{n}\n")
    c.close()
PY
HOLDER=$!
for _ in $(seq 100); do [ -s "$W/ready" ] && break; sleep 0.1; done
echo "== demo-check: port 5700 $(cat "$W/ready" 2>/dev/null || echo 'state unknown')"

if ! PROFILE=debug COUNT=300 ./scripts/demo.sh >"$W/demo.log" 2>&1; then
  cat "$W/demo.log" >&2
  echo "demo-check: FAILED: scripts/demo.sh failed with port 5700 taken" >&2
  exit 1
fi
grep -q "every message arrived, decrypted, exactly once" "$W/demo.log" || {
  cat "$W/demo.log" >&2; echo "demo-check: FAILED: the demo did not check its messages" >&2; exit 1; }
if [ -s "$W/accepted" ]; then
  cat "$W/demo.log" >&2
  echo "demo-check: FAILED: the demo connected $(cat "$W/accepted") time(s) to the listener on 5700" >&2
  exit 1
fi
echo "== demo-check passed: the demo ran on a port of its own and left 5700 alone"
