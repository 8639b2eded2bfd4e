#!/usr/bin/env bash
# The pull-consumer clients, each driven through the same scenarios (clients/conformance.py),
# twice: against a cluster with outbox_ext preloaded, then as a managed server is used (no
# library loaded, the outbox installed by `outbox migrate` as a role with only CREATE) through
# Debian's PgBouncer in transaction mode. All on 127.0.0.1. Run by scripts/test.sh. On the
# PostgreSQL major OUTBOX_PG_MAJOR names (15 unless set): where the extension does not build
# for it, against the SQL install only.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
if extension_builds; then install_extension >/dev/null; fi
cargo build --release -q -p outbox

DIR=$(mktemp -d /tmp/outbox-clients.XXXXXX)
chmod 755 "$DIR"
PORT=15352
BOUNCER_PORT=16352
cleanup() { stop_pgbouncer "$DIR/pgbouncer"; stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

clients/java/build.sh >/dev/null

failed=0
conform() {
  python3 clients/conformance.py python python3 clients/python/example.py || failed=1
  python3 clients/conformance.py node node clients/node/example.js || failed=1
  python3 clients/conformance.py java java -cp clients/java/build:/usr/share/java/postgresql.jar outbox.Example || failed=1
}

if extension_builds; then
  echo "== the clients against the extension on PostgreSQL $PG_MAJOR"
  start_cluster "$DIR/pg" "$PORT" "outbox.workers = 1"
  # Only pull endpoints here: without default, no event waits for a webhook that nobody serves.
  psql_cluster -q -c "CREATE EXTENSION outbox_ext" -c "SELECT outbox_endpoint_drop('default')"
  DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres" conform
  stop_cluster
fi

echo "== the clients against the SQL install on PostgreSQL $PG_MAJOR, through PgBouncer in transaction mode"
start_cluster "$DIR/pg-sql" "$PORT" "shared_preload_libraries = ''"
psql_cluster -q -c "CREATE ROLE outbox_owner LOGIN" -c "GRANT CREATE ON DATABASE postgres TO outbox_owner"
target/release/outbox migrate --database-url "postgres://outbox_owner@127.0.0.1:$PORT/postgres" --schema outbox 2>/dev/null
# The clients name the functions unqualified, as with the extension in public: the database
# puts the outbox's schema on every session's path (a pooler passes no startup options).
psql_cluster -q -c "ALTER DATABASE postgres SET search_path = outbox, public"
start_pgbouncer "$DIR/pgbouncer" "$BOUNCER_PORT" postgres
OUTBOX_SCHEMA=outbox DATABASE_URL="postgresql://postgres@127.0.0.1:$BOUNCER_PORT/postgres" conform
exit $failed
