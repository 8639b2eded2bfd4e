#!/usr/bin/env bash
# The pull-consumer clients, each driven through the same scenarios (clients/conformance.py)
# against a throwaway cluster with outbox_ext preloaded, on 127.0.0.1. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
install_extension >/dev/null

DIR=$(mktemp -d /tmp/outbox-clients.XXXXXX)
chmod 755 "$DIR"
PORT=15352
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 1"
# Only pull endpoints here: without default, no event waits for a webhook that nobody serves.
psql_cluster -q -c "CREATE EXTENSION outbox_ext" -c "SELECT outbox_endpoint_drop('default')"
export DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres"

clients/java/build.sh >/dev/null

failed=0
python3 clients/conformance.py python python3 clients/python/example.py || failed=1
python3 clients/conformance.py node node clients/node/example.js || failed=1
python3 clients/conformance.py java java -cp clients/java/build:/usr/share/java/postgresql.jar outbox.Example || failed=1
exit $failed
