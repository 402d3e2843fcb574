#!/usr/bin/env bash
# Runs every check CI runs: formatting, clippy (warnings are errors), the
# fuzz targets' build, the dependency audit, all tests, and the README's "Operate" commands
# (scripts/operate-check.sh), the demo with its port taken
# (scripts/demo-check.sh) and the cluster demo (scripts/cluster-demo.sh).
# Works on a fresh machine: it installs what the tests need first. Ends with
# one line, the totals of every test result (exit 1 if any failed or none ran).
set -euo pipefail
cd "$(dirname "$0")/.."

# Toolchain components (present on the standard image; cheap when they are).
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# glommio needs io_uring and some locked memory; say so plainly if missing.
if [ "$(ulimit -l)" != "unlimited" ] && [ "$(ulimit -l)" -lt 8192 ]; then
  ulimit -l 65536 2>/dev/null || echo "warning: locked-memory limit is $(ulimit -l) KiB; glommio may fail to start (raise ulimit -l)" >&2
fi

# PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth) for the Postgres
# bridge tests: start the machine's cluster if it is down.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "== starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  pg_isready -h 127.0.0.1 -p 5432
fi
# TLS on it (idempotent: a CA and server certificate made once by ciphermq-pki;
# plaintext clients are still served), for the bridge's sslmode tests.
./scripts/pg-tls.sh on

# A one-off build gains nothing from incremental state (1.6 GB of it).
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi

# The build and the tests need about 3 GB; a full disk shows up later as a
# linker "Bus error", so name the real problem first.
avail_mb=$(df -Pm . | awk 'NR==2 {print $4}')
echo "== ${avail_mb} MB free in $(pwd)"
if [ "$avail_mb" -lt 3072 ]; then
  echo "warning: under 3 GB free; the build may fail with 'No space left on device'" >&2
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# The fuzz targets are their own package (fuzz/), outside the workspace, so
# the lines above never build them; compile them here so they cannot rot
# between runs of scripts/fuzz.sh (which runs them, and is not part of CI).
echo "== fuzz targets compile (cargo check; scripts/fuzz.sh runs them)"
command -v c++ >/dev/null || {
  echo "== installing g++ (libFuzzer is C++)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
}
cargo check -q --locked --manifest-path fuzz/Cargo.toml --bins --target-dir target/fuzz-check
# The dependency tree against deny.toml (licences, bans, sources, advisories;
# docs/SUPPLY_CHAIN.md). Installs cargo-deny the first time.
./scripts/audit.sh
# promtool (Debian's prometheus package) for broker/tests/metrics_exposition.rs.
# Its post-install does not start a Prometheus server where policy-rc.d
# forbids it (containers); where one starts, it listens on 9090, which no
# test uses.
command -v promtool >/dev/null || {
  echo "== installing promtool (Debian's prometheus package)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}
# Headless Chromium (Debian's chromium package) for broker/tests/dashboard.rs,
# which loads the web dashboard in a real browser.
[ -x /usr/bin/chromium ] || {
  echo "== installing chromium (headless, for the dashboard's browser test)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
}
echo "== cargo test"
python3 -c 'import nacl' 2>/dev/null || python3 -m pip install --quiet pynacl  # libsodium for clients/tests/libsodium_interop.rs
mkdir -p target
# Every test binary runs, even after one fails (--no-fail-fast): a failure
# early in the list must not hide the rest. The status of `cargo test`
# itself, not tee's.
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee target/test-output.log
status=${PIPESTATUS[0]}
# The Postgres tests once more with the bridge on verify-full TLS (the CA
# scripts/pg-tls.sh made): every bridge connection encrypted and checked.
echo "== Postgres tests with database.sslmode = verify-full"
(
  export CIPHERMQ_TEST_PG_SSLMODE=verify-full
  export CIPHERMQ_TEST_PG_CA=${CIPHERMQ_PG_TLS_DIR:-/var/lib/postgresql/ciphermq-tls}/ca.crt
  failed=0
  cargo test -p ciphermq-pgbridge || failed=1
  cargo test -p ciphermq-broker --test pg_bridge --test pg_outage || failed=1
  exit $failed
) 2>&1 | tee target/test-output-pg-tls.log
pg_tls=${PIPESTATUS[0]}
# The README's "Operate" commands, run as an operator would.
echo "== scripts/operate-check.sh"
./scripts/operate-check.sh
operate=$?
# The demo, with its example port taken by someone else's listener.
echo "== scripts/demo-check.sh"
./scripts/demo-check.sh
demo=$?
# The cluster demo: three nodes on the local PostgreSQL (debug binaries).
echo "== scripts/cluster-demo.sh"
PROFILE=debug COUNT=200 ./scripts/cluster-demo.sh
cluster_demo=$?
set -e

# One line to end on: every `test result:` line summed (unit, integration
# and doc tests), the test binaries run and those that failed (a failed test,
# or no result line at all: the binary crashed or was killed), and a non-zero
# exit if any failed or none ran.
awk -v status="$status" -v operate="$operate" -v demo="$demo" -v cluster_demo="$cluster_demo" -v pg_tls="$pg_tls" '
  /^ +(Running|Doc-tests) / {
    if (open) crashed++
    started++
    open = 1
  }
  /^test result:/ {
    results++
    open = 0
    for (i = 2; i <= NF; i++) {
      if ($i == "passed;") passed += $(i - 1)
      if ($i == "failed;") { failed += $(i - 1); if ($(i - 1) > 0) failing++ }
      if ($i == "ignored;") ignored += $(i - 1)
    }
  }
  END {
    if (open) crashed++
    line = sprintf("== tests: %d passed, %d failed, %d ignored; %d test binaries run, %d failed", passed, failed, ignored, started, failing + crashed)
    if (crashed > 0) line = line sprintf(" (%d ended without a result line)", crashed)
    if (results == 0) line = line " (no test result line in target/test-output.log)"
    else if (status != 0 && failed == 0 && crashed == 0) line = line " (cargo test exited with status " status ")"
    if (pg_tls != 0) line = line "; Postgres tests with verify-full FAILED (target/test-output-pg-tls.log)"
    if (operate != 0) line = line "; scripts/operate-check.sh FAILED"
    else line = line "; scripts/operate-check.sh passed"
    if (demo != 0) line = line "; scripts/demo-check.sh FAILED"
    else line = line "; scripts/demo-check.sh passed"
    if (cluster_demo != 0) line = line "; scripts/cluster-demo.sh FAILED"
    else line = line "; scripts/cluster-demo.sh passed"
    print line
    exit (results == 0 || failed > 0 || crashed > 0 || status != 0 || operate != 0 || demo != 0 || cluster_demo != 0 || pg_tls != 0) ? 1 : 0
  }' target/test-output.log
