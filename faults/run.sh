#!/usr/bin/env bash
# The fault-injection suite (see faults/run.py), twice: with the extension's relay workers (2 of
# them), then with two `outbox relay` processes and no workers; each run in its own cluster,
# with a receiver on 127.0.0.1. FAULT_EVENTS sets the size (default 2000 committed events a
# scenario); FAULT_MODE=workers or FAULT_MODE=relays runs one of the two.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
install_extension
MODE=${FAULT_MODE:-both}

DIR=$(mktemp -d /tmp/outbox-faults.XXXXXX)
chmod 755 "$DIR"
PORT=15350
RECEIVER_PORT=8797
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$MODE" != relays ]; then
  echo "== relay workers"
  start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/events'"
  psql_cluster -q -c "CREATE EXTENSION outbox_ext"
  FAULT_PGDATA="$DIR/pg/data" FAULT_PGPORT=$PORT FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
  stop_cluster
fi

if [ "$MODE" != workers ]; then
  echo "== outbox relay processes"
  cargo build --release -q -p outbox
  start_cluster "$DIR/pg-relays" "$PORT" "outbox.workers = 0"
  psql_cluster -q -c "CREATE EXTENSION outbox_ext"
  FAULT_RELAYS="$PWD/target/release/outbox" FAULT_PGDATA="$DIR/pg-relays/data" FAULT_PGPORT=$PORT \
    FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
fi
