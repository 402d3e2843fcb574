#!/usr/bin/env bash
# Audits the dependency tree against deny.toml with cargo-deny: licences,
# bans (wildcards, duplicates), sources, and advisories from the RustSec
# database, and with cargo-machete for dependencies that no code uses.
# docs/SUPPLY_CHAIN.md explains the policy and its exceptions.
#
#   scripts/audit.sh                                  # installs cargo-deny if missing
#   CIPHERMQ_ADVISORY_DB=/path/to/advisory-db scripts/audit.sh   # advisories offline
set -euo pipefail
cd "$(dirname "$0")/.."

DENY_VERSION=0.20.2
MACHETE_VERSION=0.9.2
ADVISORY_DB_URL=https://github.com/rustsec/advisory-db

if ! cargo deny --version 2>/dev/null | grep -qF "$DENY_VERSION"; then
  echo "== installing cargo-deny $DENY_VERSION (compiled from crates.io: a few minutes, once)"
  cargo install --locked --quiet cargo-deny --version "$DENY_VERSION"
fi

if ! cargo machete --version 2>/dev/null | grep -qF "$MACHETE_VERSION"; then
  echo "== installing cargo-machete $MACHETE_VERSION (about a minute, once)"
  cargo install --locked --quiet cargo-machete --version "$MACHETE_VERSION"
fi
echo "== cargo machete (dependencies no code uses)"
cargo machete

echo "== cargo deny check licenses bans sources"
cargo deny --log-level error check licenses bans sources

# Advisories need the RustSec database, a git repository on github.com.
if [ -n "${CIPHERMQ_ADVISORY_DB:-}" ]; then
  # cargo-deny keeps the database of its default URL under db-path, in a
  # directory named after that URL: a clone of the given copy goes there,
  # and --offline keeps cargo-deny from fetching.
  db_home=$(mktemp -d)
  trap 'rm -rf "$db_home"' EXIT
  git clone --quiet "$CIPHERMQ_ADVISORY_DB" "$db_home/db/advisory-db-3157b0e258782691"
  sed "s|^\[advisories\]|[advisories]\ndb-path = \"$db_home/db\"|" deny.toml > "$db_home/deny.toml"
  echo "== cargo deny check advisories (offline: $CIPHERMQ_ADVISORY_DB, last change $(git -C "$db_home/db/advisory-db-3157b0e258782691" log -1 --format=%cs))"
  cargo deny --log-level error --offline --config "$db_home/deny.toml" check advisories
elif timeout 20 git ls-remote --quiet "$ADVISORY_DB_URL" HEAD >/dev/null 2>&1; then
  echo "== cargo deny check advisories"
  cargo deny --log-level error check advisories
else
  echo "== advisories: NOT CHECKED: the RustSec database ($ADVISORY_DB_URL) cannot be fetched from this machine; set CIPHERMQ_ADVISORY_DB to a local clone to check offline"
fi
