#!/usr/bin/env bash
# The fault-injection suite (see faults/run.py), three times: with the extension's relay workers (2 of
# them), then with two `outbox relay` processes on the SQL install; each run in its own cluster,
# with a receiver on 127.0.0.1. FAULT_EVENTS sets the size (default 2000 committed events a
# scenario); FAULT_MODE=workers or FAULT_MODE=relays runs one of the two. Then the workers again,
# in log mode, ending with a failover to a standby (FAULT_MODE=log runs that alone). On the
# PostgreSQL major OUTBOX_PG_MAJOR names (15 unless set); where the extension does not build
# for it, FAULT_MODE=relays is the one that can run.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
MODE=${FAULT_MODE:-all}
if extension_builds; then
  install_extension
elif [ "$MODE" != relays ]; then
  echo "faults: the extension does not build for PostgreSQL $PG_MAJOR; run FAULT_MODE=relays" >&2
  exit 1
fi
export FAULT_PG_BIN=$PG_BIN

DIR=$(mktemp -d /tmp/outbox-faults.XXXXXX)
chmod 755 "$DIR"
PORT=15350
RECEIVER_PORT=8797
# The log pass ends on a promoted standby (faults/run.py's failover_to_a_standby).
stop_standby() {
  [ ! -f "$DIR/pg-standby/data/postmaster.pid" ] || as_postgres "$PG_BIN/pg_ctl" -D "$DIR/pg-standby/data" -m fast -w stop >/dev/null 2>&1 || true
}
cleanup() { stop_cluster; stop_standby; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$MODE" = all ] || [ "$MODE" = workers ]; then
  echo "== relay workers"
  start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/events'"
  psql_cluster -q -c "CREATE EXTENSION outbox_ext"
  FAULT_PGDATA="$DIR/pg/data" FAULT_PGPORT=$PORT FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
  stop_cluster
fi

if [ "$MODE" = all ] || [ "$MODE" = relays ]; then
  # As a managed server is used: no outbox library loaded, the outbox installed by
  # `outbox migrate` as a role with nothing but CREATE on the database, the relays connecting
  # as another ordinary role through PgBouncer in transaction mode (and directly for LISTEN).
  echo "== outbox relay processes on the SQL install, through PgBouncer"
  cargo build --release -q -p outbox
  start_cluster "$DIR/pg-relays" "$PORT" "shared_preload_libraries = ''"
  psql_cluster -q -c "CREATE ROLE outbox_owner LOGIN" -c "GRANT CREATE ON DATABASE postgres TO outbox_owner" \
    -c "CREATE ROLE outbox_relay LOGIN IN ROLE outbox_owner"
  target/release/outbox migrate --database-url "postgres://outbox_owner@127.0.0.1:$PORT/postgres" --schema outbox
  # The scenarios deliver to the endpoint default, at the relays' --webhook-url.
  psql_cluster -q -c "SELECT outbox.outbox_endpoint_set('default', NULL)"
  BOUNCER_PORT=16350
  start_pgbouncer "$DIR/pgbouncer" "$BOUNCER_PORT" outbox_relay postgres
  trap 'stop_pgbouncer "$DIR/pgbouncer"; cleanup' EXIT
  PGOPTIONS="-c search_path=outbox,public" FAULT_SCHEMA=outbox FAULT_RELAYS="$PWD/target/release/outbox" \
    FAULT_RELAY_URL="postgres://outbox_relay@127.0.0.1:$BOUNCER_PORT/postgres" \
    FAULT_LISTEN_URL="postgres://outbox_relay@127.0.0.1:$PORT/postgres" \
    FAULT_PGBOUNCER_CONFIG="$DIR/pgbouncer/pgbouncer.ini" \
    FAULT_PGDATA="$DIR/pg-relays/data" FAULT_PGPORT=$PORT FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
fi

if [ "$MODE" = all ] || [ "$MODE" = log ]; then
  echo "== relay workers, log mode"
  stop_cluster
  start_cluster "$DIR/pg-log" "$PORT" "outbox.workers = 2" "wal_level = logical" \
    "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/events'"
  psql_cluster -q -c "CREATE EXTENSION outbox_ext" -c "SELECT outbox_set_mode('log')"
  FAULT_LOG_MODE=1 FAULT_PGDATA="$DIR/pg-log/data" FAULT_PGPORT=$PORT FAULT_RECEIVER_PORT=$RECEIVER_PORT python3 faults/run.py
  stop_standby
fi
