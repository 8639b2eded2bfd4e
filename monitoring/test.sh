#!/usr/bin/env bash
# Monitoring, end to end: the alert rules checked and unit tested with promtool; then the real
# prometheus-postgres-exporter with monitoring/queries.yaml against a throwaway cluster whose
# workers deliver to a receiver on 127.0.0.1 (one endpoint answering 204, one 503, one down),
# scraped over 127.0.0.1 and checked by monitoring/check_metrics.py. Two databases have the
# extension, each scraped through its own data source name (the exporter's way to read several
# databases), so every outbox series carries a database label. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh prometheus prometheus-postgres-exporter
. scripts/cluster.sh
install_extension >/dev/null

echo "== alert rules"
promtool check rules monitoring/alerts.yml
promtool test rules monitoring/alerts.test.yml
python3 monitoring/check_runbook.py

DIR=$(mktemp -d /tmp/outbox-monitoring.XXXXXX)
chmod 755 "$DIR"
PORT=15353
RECEIVER_PORT=8796
EXPORTER_PORT=9188
exporter=
cleanup() {
  [ -z "$exporter" ] || kill "$exporter" 2>/dev/null || true
  stop_cluster
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== the exporter against a cluster"
start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "outbox.poll_interval = '200ms'" \
  "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/ok'"
psql_cluster -q -c "CREATE EXTENSION outbox_ext" \
  -c "SELECT outbox_endpoint_set('failing', 'http://127.0.0.1:$RECEIVER_PORT/fail', max_attempts => 2)" \
  -c "SELECT outbox_endpoint_set('down', 'http://127.0.0.1:9/', max_attempts => 1000)" \
  -c "CREATE DATABASE shop" >/dev/null
psql_cluster -q -d shop -c "CREATE EXTENSION outbox_ext" >/dev/null
# The collectors that read the whole server are off: with two data source names on one server
# they would report the same series twice.
DATA_SOURCE_NAME="postgresql://postgres@127.0.0.1:$PORT/postgres?sslmode=disable,postgresql://postgres@127.0.0.1:$PORT/shop?sslmode=disable" \
  prometheus-postgres-exporter --web.listen-address="127.0.0.1:$EXPORTER_PORT" \
  --extend.query-path=monitoring/queries.yaml --disable-default-metrics --disable-settings-metrics \
  --no-collector.database --no-collector.bgwriter \
  >"$DIR/exporter.log" 2>&1 &
exporter=$!
cargo build --release -q -p outbox
MONITORING_OUTBOX_BINARY="$PWD/target/release/outbox" MONITORING_PGPORT=$PORT MONITORING_RECEIVER_PORT=$RECEIVER_PORT \
  MONITORING_METRICS_URL="http://127.0.0.1:$EXPORTER_PORT/metrics" python3 monitoring/check_metrics.py ||
  { echo "exporter log:" >&2; tail -n 20 "$DIR/exporter.log" >&2; exit 1; }
