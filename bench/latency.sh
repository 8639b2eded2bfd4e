#!/usr/bin/env bash
# The latency step of bench/run.sh alone, in a cluster of its own: 500 events/s for
# LATENCY_SECONDS (30) with endpoint `down` failing beside `default`, commit to receipt at
# nginx. What runs first is chosen, to find what the step depends on: LATENCY_DRAIN=1 drains
# 100,000 events (to one endpoint, then to three), LATENCY_KEEPUP=1 (the default) has 8
# producers enqueue for 30 s while the workers deliver, LATENCY_RESTART=1 restarts the workers
# just before. Statements slower than LATENCY_EXPLAIN_MS (1000) are logged with their plans
# (auto_explain) in the server log, which is kept as /tmp/outbox-latency-server.log.
# Prints p50 / p99 / max in ms and the failed attempts to `down`. All on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${LATENCY_SECONDS:-30}
. bench/lib.sh
refuse_if_down_port_listens
scripts/setup.sh nginx-light
. scripts/cluster.sh
install_extension
DIR=$(mktemp -d /tmp/outbox-latency.XXXXXX)
chmod 755 "$DIR"
RECEIVER_PORT=8797
URL="http://127.0.0.1:$RECEIVER_PORT/events"
cleanup() {
  [ ! -d "$DIR/pg" ] || cp "$DIR/pg/server.log" /tmp/outbox-latency-server.log
  stop_and_remove
}
trap cleanup EXIT
start_receiver "$DIR" "$RECEIVER_PORT"
start_cluster "$DIR/pg" 15338 "outbox.workers = 2" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'" \
  "shared_preload_libraries = 'outbox_ext,auto_explain'" "auto_explain.log_min_duration = '${LATENCY_EXPLAIN_MS:-1000}ms'" \
  "auto_explain.log_nested_statements = on"
psql_cluster -q -c "CREATE EXTENSION outbox_ext"
empty_tables() { q "TRUNCATE outbox_deliveries, outbox" >/dev/null; }
drain_to() { # drain_to ENDPOINTS: 100,000 events enqueued with no URL, then delivered to each
  set_url ""
  q "SELECT outbox_endpoint_set(n, '$URL/' || n) FROM unnest('{$1}'::text[]) n WHERE n <> 'default'" >/dev/null
  q "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, 100000) n" >/dev/null
  set_url "$URL"
  wait_for "NOT EXISTS (SELECT FROM outbox_deliveries WHERE sent_at IS NULL AND dead_at IS NULL)" 300
  empty_tables
  q "SELECT outbox_endpoint_drop(n) FROM unnest('{$1}'::text[]) n WHERE n <> 'default'" >/dev/null
}
echo "SELECT outbox_enqueue('bench', '{\"order_id\": 1, \"total\": 42.5}');" > "$DIR/enqueue.sql"
set_url "$URL"
if [ "${LATENCY_DRAIN:-0}" = 1 ]; then
  drain_to default && drain_to default,b,c
  echo "drained 100,000 events to one endpoint, then to three"
fi
if [ "${LATENCY_KEEPUP:-1}" = 1 ]; then
  echo "keep-up: $(pgbench_tps -c8 -j2 -T30 -f "$DIR/enqueue.sql") events/s for 30 s"
  wait_for "count(*) = count(sent_at) FROM outbox_deliveries" 180
fi
empty_tables
if [ "${LATENCY_RESTART:-0}" = 1 ]; then
  old_pids=$(q "SELECT string_agg(pid::text, ',') FROM outbox_workers()")
  q "SELECT pg_terminate_backend(pid) FROM outbox_workers()" >/dev/null
  wait_for "count(*) = 2 FROM outbox_workers() WHERE pid NOT IN ($old_pids)" 30
  echo "workers restarted"
fi
latency_step "$SECONDS_RUN"
