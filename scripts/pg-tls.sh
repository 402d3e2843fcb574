#!/usr/bin/env bash
# TLS on the machine's PostgreSQL (Debian's cluster, 127.0.0.1:5432, user
# postgres, trust auth), for the Postgres bridge's TLS tests:
#
#   scripts/pg-tls.sh on      # idempotent; prints the CA the tests verify with
#   scripts/pg-tls.sh off     # ssl = off: the server speaks plaintext only
#   scripts/pg-tls.sh status
#
# `on` makes a CA and a server certificate (names localhost, 127.0.0.1, ::1)
# with ciphermq-pki once, keeps them in $CIPHERMQ_PG_TLS_DIR (default
# /var/lib/postgresql/ciphermq-tls: machine-wide, because every checkout's
# tests share the one server and must trust the same CA), renews the server
# certificate when it has under 30 days left, gives the server its copies
# (server.key mode 0600, owned by postgres), sets ssl = on, ssl_cert_file and
# ssl_key_file with ALTER SYSTEM, reloads, and checks a verify-full session.
# A server with ssl = on still accepts plaintext from clients that do not
# ask for TLS, so tests that do not ask keep working; `off` breaks every
# run that requires TLS, other checkouts' included. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${CIPHERMQ_PG_TLS_DIR:-/var/lib/postgresql/ciphermq-tls}
PKI=$DIR/pki                 # ciphermq-pki's files, root only (the CA key)
PSQL=(psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p 5432 -U postgres -d postgres)

usage() {
  echo "usage: $0 on|off|status" >&2
  exit 2
}

setting() { "${PSQL[@]}" -c "SHOW $1"; }

# Waits until the server reports `SHOW $1` = $2 (a reload is asynchronous).
wait_for_setting() {
  for _ in $(seq 1 100); do
    [ "$(setting "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  echo "pg-tls: the server still reports $1 = $(setting "$1") after the reload (want $2); see its log in /var/log/postgresql/" >&2
  return 1
}

# The CA and server certificate, made (or renewed) by ciphermq-pki.
make_certificates() {
  install -d -m 0700 "$PKI"
  local force=()
  if [ -f "$PKI/certs/server.crt" ] && command -v openssl >/dev/null &&
    ! openssl x509 -checkend $((30 * 86400)) -noout -in "$PKI/certs/server.crt" >/dev/null; then
    echo "== pg-tls: the server certificate expires within 30 days; re-issuing it"
    force=(--force)
  fi
  if [ ! -f "$PKI/certs/server.crt" ] || [ ${#force[@]} -gt 0 ]; then
    echo "== pg-tls: making the CA and server certificate with ciphermq-pki in $PKI"
    cargo run -q --locked -p ciphermq-clients --bin ciphermq-pki -- \
      --out "$PKI/certs" --ca-dir "$PKI/ca" init "${force[@]}"
  fi
}

# Copies $1 to $2 with owner postgres and mode $3, only if it changed.
install_as_postgres() {
  if ! cmp -s "$1" "$2" 2>/dev/null || [ "$(stat -c %U:%a "$2")" != "postgres:$3" ]; then
    install -o postgres -g postgres -m "$3" "$1" "$2"
  fi
}

# A verify-full session against the CA, encrypted as the server sees it.
check_tls() {
  local ssl
  ssl=$(psql -X -At "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=verify-full sslrootcert=$DIR/ca.crt" \
    -c "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") || {
    echo "pg-tls: no verify-full session with $DIR/ca.crt (see /var/log/postgresql/)" >&2
    return 1
  }
  [ "$ssl" = t ] || {
    echo "pg-tls: the session is not encrypted (pg_stat_ssl.ssl = $ssl)" >&2
    return 1
  }
}

on() {
  exec 9>/tmp/ciphermq-pg-tls.lock
  flock 9 # checkouts running this at once make one CA, not two
  install -d -o postgres -g postgres -m 0755 "$DIR"
  make_certificates
  install_as_postgres "$PKI/certs/ca.crt" "$DIR/ca.crt" 644
  install_as_postgres "$PKI/certs/server.crt" "$DIR/server.crt" 644
  install_as_postgres "$PKI/certs/server.key" "$DIR/server.key" 600
  if [ "$(setting ssl)" != on ] || [ "$(setting ssl_cert_file)" != "$DIR/server.crt" ] ||
    [ "$(setting ssl_key_file)" != "$DIR/server.key" ]; then
    echo "== pg-tls: ssl = on with $DIR/server.crt"
    "${PSQL[@]}" -c "ALTER SYSTEM SET ssl = on" \
      -c "ALTER SYSTEM SET ssl_cert_file = '$DIR/server.crt'" \
      -c "ALTER SYSTEM SET ssl_key_file = '$DIR/server.key'" \
      -c "SELECT pg_reload_conf()" >/dev/null
    wait_for_setting ssl_key_file "$DIR/server.key"
    wait_for_setting ssl on
  else
    # Same files: a renewed certificate is read again on reload.
    "${PSQL[@]}" -c "SELECT pg_reload_conf()" >/dev/null
  fi
  check_tls
  echo "== pg-tls: on; CA $DIR/ca.crt"
}

off() {
  echo "== pg-tls: ssl = off"
  "${PSQL[@]}" -c "ALTER SYSTEM SET ssl = off" \
    -c "ALTER SYSTEM RESET ssl_cert_file" \
    -c "ALTER SYSTEM RESET ssl_key_file" \
    -c "SELECT pg_reload_conf()" >/dev/null
  wait_for_setting ssl off
}

status() {
  echo "ssl = $(setting ssl), ssl_cert_file = $(setting ssl_cert_file)"
  if [ -f "$DIR/ca.crt" ] && check_tls 2>/dev/null; then
    echo "verify-full with $DIR/ca.crt: ok"
  else
    echo "verify-full with $DIR/ca.crt: no"
  fi
}

[ $# -eq 1 ] || usage
case "$1" in
  on) on ;;
  off) off ;;
  status) status ;;
  *) usage ;;
esac
