#!/usr/bin/env bash
# The outbox binary's end-to-end tests (cli/tests/): a cluster of their own with the extension's
# library installed (some tests compare the SQL install with it, or refuse it) and no relay
# workers, and one on PORT + 3 that loads no outbox library, as a managed server, and offers TLS
# (or, where this major's server has no OpenSSL, a third on PORT + 4 that does); each test
# makes its own database and roles. tests/managed_page.rs runs the managed page's
# steps against a server and a PgBouncer of its own, on PORT + 1 and PORT + 2.
#
# On the PostgreSQL major OUTBOX_PG_MAJOR names (15 unless set). Where the extension does not
# build for it, the tests that need the extension (their names say "extension") are left out:
# that major's suite is the SQL install's.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/cluster.sh
only_sql_install=()
if extension_builds; then
  install_extension
else
  only_sql_install=(--skip extension)
fi
# The rule the line above relies on: a test (or helper) that makes the extension says so in its
# name.
unnamed=$(awk 'FNR == 1 { name = "" }
               /^[[:space:]]*(pub )?fn / { name = $0; sub(/^[[:space:]]*(pub )?fn /, "", name); sub(/[(<].*/, "", name) }
               /CREATE EXTENSION/ && tolower(name) !~ /extension/ { print FILENAME ": " name }' cli/tests/*.rs cli/tests/support/*.rs | sort -u)
[ -z "$unnamed" ] || { echo "cli/test.sh: these tests make the extension but lack \"extension\" in their names:" >&2; echo "$unnamed" >&2; exit 1; }

DIR=$(mktemp -d /tmp/outbox-cli.XXXXXX)
chmod 755 "$DIR"
PORT=15360
# The clusters below, each stopped if it was started.
MAIN_DIR=$DIR/pg MANAGED_DIR=$DIR/pg-managed TLS_DIR=$DIR/pg-tls
cleanup() {
  CLUSTER_DIR=$MAIN_DIR stop_cluster
  CLUSTER_DIR=$MANAGED_DIR stop_cluster
  CLUSTER_DIR=$TLS_DIR PG_BIN=$TLS_PG_BIN stop_cluster
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# TLS as a managed server offers it: a certificate for 127.0.0.1 signed by a CA of the test's
# own, and another CA that signed nothing the server shows.
TLS=$DIR/tls
mkdir -p "$TLS"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=outbox test CA" -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=another CA" -keyout "$TLS/other-ca.key" -out "$TLS/other-ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$TLS/server.key" -out "$TLS/server.csr" 2>/dev/null
openssl x509 -req -in "$TLS/server.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" -CAcreateserial -days 2 \
  -extfile <(echo "subjectAltName = IP:127.0.0.1") -out "$TLS/server.pem" 2>/dev/null
chown postgres "$TLS/server.key" "$TLS/server.pem" 2>/dev/null || true
chmod 600 "$TLS/server.key"

# A second cluster that loads no outbox library, as a managed server: there every outbox.*
# name is a placeholder that any role may SET. It offers TLS and logical decoding, as managed
# servers do; where this major's server was built without OpenSSL (18's with headers:
# scripts/servers.sh), a build of the same major that has it offers TLS instead.
ssl=("ssl = on" "ssl_cert_file = '$TLS/server.pem'" "ssl_key_file = '$TLS/server.key'")
managed_ssl=()
[ "$TLS_PG_BIN" != "$PG_BIN" ] || managed_ssl=("${ssl[@]}")
MANAGED_PORT=$((PORT + 3))
start_cluster "$MANAGED_DIR" "$MANAGED_PORT" "shared_preload_libraries = ''" "wal_level = logical" "${managed_ssl[@]}"
TLS_PORT=$MANAGED_PORT
if [ "$TLS_PG_BIN" != "$PG_BIN" ]; then
  TLS_PORT=$((PORT + 4))
  PG_BIN=$TLS_PG_BIN start_cluster "$TLS_DIR" "$TLS_PORT" "shared_preload_libraries = ''" "wal_level = logical" "${ssl[@]}"
fi

start_cluster "$MAIN_DIR" "$PORT" "outbox.workers = 0" "wal_level = logical"
echo "== cli/tests on PostgreSQL $("$PG_BIN/postgres" --version | awk '{ print $3 }')${only_sql_install:+ (the SQL install only)}"
# One at a time: a test's relay must not deliver another test's events.
OUTBOX_TEST_URL="postgres://postgres@127.0.0.1:$PORT/postgres" OUTBOX_TEST_TLS="$TLS" \
  OUTBOX_TEST_MANAGED_URL="postgres://postgres@127.0.0.1:$MANAGED_PORT/postgres" \
  OUTBOX_TEST_TLS_URL="postgres://postgres@127.0.0.1:$TLS_PORT/postgres" \
  cargo test -q -p outbox --test '*' -- --test-threads=1 "${only_sql_install[@]}" "$@"

# The console in Debian's Chromium, driven by Playwright (cargo test built target/debug/outbox).
OUTBOX_TEST_URL="postgres://postgres@127.0.0.1:$PORT/postgres" OUTBOX=target/debug/outbox python3 cli/tests/browser/console_test.py "$@"
