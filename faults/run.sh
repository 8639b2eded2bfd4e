#!/usr/bin/env bash
# The fault-injection suite (see faults/run.py): its own cluster with 2 relay workers and a
# receiver on 127.0.0.1. FAULT_EVENTS sets the size (default 2000 committed events a scenario).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-faults.XXXXXX)
chmod 755 "$DIR"
PORT=15350
RECEIVER_PORT=8797
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/events'"
psql_cluster -q -c "CREATE EXTENSION outbox_ext"
FAULT_PGDATA="$DIR/pg/data" FAULT_PGPORT=$PORT FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
