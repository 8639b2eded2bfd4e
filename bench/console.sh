#!/usr/bin/env bash
# The console on large tables: how long each page's answer takes with 1,000,000 retained events
# and 100,000 dead deliveries, written to bench/RESULTS-console.md. See bench/README.md.
# One cluster on 127.0.0.1 with no library loaded; the SQL install by `outbox migrate`; rows
# written straight into its tables (as years of enqueues would leave them); `outbox console` as
# the operator's role. Each figure is the median of 7 requests, timed by curl from the request
# to the last byte of the answer (server time plus loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

EVENTS=${BENCH_CONSOLE_EVENTS:-1000000}
DEAD=${BENCH_CONSOLE_DEAD:-100000}
TARGET_MS=300
scripts/setup.sh
. scripts/cluster.sh
cargo build --release -q -p outbox
OUTBOX=$PWD/target/release/outbox

DIR=$(mktemp -d /tmp/outbox-bench-console.XXXXXX)
chmod 755 "$DIR"
PORT=15343
CONSOLE_PORT=18343
console_pid=
cleanup() {
  [ -z "$console_pid" ] || { kill -TERM "$console_pid" 2>/dev/null; wait "$console_pid" 2>/dev/null || true; }
  stop_cluster
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "shared_preload_libraries = ''" "max_wal_size = '4GB'"
psql_cluster -q -c "CREATE DATABASE console" -c "CREATE ROLE outbox_owner LOGIN" -c "GRANT CREATE ON DATABASE console TO outbox_owner" \
  -c "CREATE ROLE ops LOGIN"
"$OUTBOX" migrate --database-url "postgres://outbox_owner@127.0.0.1:$PORT/console" 2>/dev/null
qc() { psql_cluster -d console -tA -c "$1"; }

echo "bench: writing $EVENTS events over 7 days, one delivery each to billing, $DEAD of them dead with a failed attempt"
started=$(date +%s)
qc "SELECT outbox.outbox_endpoint_set('billing', 'http://127.0.0.1:9/', '{order.*}')" >/dev/null
qc "INSERT INTO outbox.outbox (topic, payload, key, created_at)
    SELECT CASE WHEN n % 10 = 0 THEN 'order.cancelled' ELSE 'order.placed' END,
           jsonb_build_object('order', n, 'customer', 'c-' || (n % 5000), 'total', n % 977),
           'customer-' || (n % 5000), now() - interval '7 days' * (1 - n::float8 / $EVENTS)
      FROM generate_series(1, $EVENTS) AS n" >/dev/null
qc "INSERT INTO outbox.outbox_deliveries (event_id, endpoint, available_at, attempts, fence, sent_at, dead_at, last_error)
    SELECT o.id, 'billing', o.created_at, 1, 1,
           CASE WHEN o.id % ($EVENTS / $DEAD) <> 0 THEN o.created_at + interval '50 milliseconds' END,
           CASE WHEN o.id % ($EVENTS / $DEAD) = 0 THEN o.created_at + interval '1 minute' END,
           CASE WHEN o.id % ($EVENTS / $DEAD) = 0 THEN 'HTTP 503' END
      FROM outbox.outbox AS o" >/dev/null
qc "INSERT INTO outbox.outbox_attempts (event_id, endpoint, attempt, failed_at, status, duration_ms, error, response)
    SELECT d.event_id, d.endpoint, 1, d.dead_at, 503, 12.5, 'HTTP 503', 'busy'
      FROM outbox.outbox_deliveries AS d WHERE d.dead_at IS NOT NULL" >/dev/null
qc "VACUUM ANALYZE" >/dev/null
echo "bench: $(qc "SELECT count(*) FROM outbox.outbox") events, $(qc "SELECT count(*) FROM outbox.outbox_deliveries WHERE dead_at IS NOT NULL") dead, in $(( $(date +%s) - started )) s"

# The operator's role, as its GRANT recipe (docs/security.md) grants it.
recipe=$(awk '/^-- operator: watches/ { on = 1 } on && /^```/ { exit } on' docs/security.md)
psql_cluster -d console -q -c "GRANT USAGE ON SCHEMA outbox TO ops" -c "SET ROLE outbox_owner" -c "$recipe"

"$OUTBOX" console --database-url "postgres://ops@127.0.0.1:$PORT/console" --listen "127.0.0.1:$CONSOLE_PORT" 2>"$DIR/console.log" &
console_pid=$!
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$CONSOLE_PORT/" >/dev/null && break; sleep 0.05; done

dead_id=$(qc "SELECT max(event_id) FROM outbox.outbox_deliveries WHERE dead_at IS NOT NULL")
middle=$((EVENTS / 2))
out=bench/RESULTS-console.md
{
  echo "# Console page timings"
  echo
  echo "\`bench/console.sh\`, $(date -u +%Y-%m-%d), on $(nproc) cores: $EVENTS retained events over 7 days, one delivery"
  echo "each, $DEAD of them dead (each with a failed attempt in the history); \`outbox console\` as the"
  echo "operator's role of its GRANT recipe, against the SQL install. Median of 7 requests, from"
  echo "the request to the last byte of the answer. Target: each page ≤ ${TARGET_MS} ms."
  echo
  echo "| page | request | median ms | slowest ms | within target |"
  echo "|---|---|---|---|---|"
} > "$out"
slowest_page=0
time_page() { # time_page LABEL PATH
  local times median worst
  times=$(for _ in 1 2 3 4 5 6 7; do
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$CONSOLE_PORT/$2"
  done)
  if echo "$times" | grep -qv '^200 '; then
    echo "bench: $2 answered $(echo "$times" | grep -v '^200 ' | head -1)" >&2
    exit 1
  fi
  median=$(echo "$times" | awk '{ print $2 * 1000 }' | sort -n | sed -n 4p)
  worst=$(echo "$times" | awk '{ print $2 * 1000 }' | sort -n | tail -1)
  printf '| %s | `%s` | %.1f | %.1f | %s |\n' "$1" "$2" "$median" "$worst" \
    "$(awk -v m="$median" -v t=$TARGET_MS 'BEGIN { print (m <= t) ? "yes" : "NO" }')" | tee -a "$out"
  awk -v m="$median" -v s="$slowest_page" 'BEGIN { exit !(m > s) }' && slowest_page=$median || true
}
time_page "overview: endpoints" "api/endpoints"
time_page "overview: last hour, consumers" "api/activity"
time_page "overview: relays" "api/relays"
time_page "events, newest" "api/events"
time_page "events, a page deep in the history" "api/events?after=$middle:billing"
time_page "events, dead" "api/events?state=dead"
time_page "events, dead of an endpoint" "api/events?state=dead&endpoint=billing"
time_page "events, pending (none)" "api/events?state=pending"
time_page "events, by topic prefix" "api/events?topic=order.*"
time_page "events, by a rare topic" "api/events?topic=order.cancelled"
time_page "events, by key" "api/events?key=customer-42"
time_page "events, by JSON path" "api/events?path=%24.total%20%3F%20(%40%20%3D%3D%205)"
time_page "events, in a time window" "api/events?since=$(date -u -d '3 days ago' +%Y-%m-%dT%H:%MZ)&until=$(date -u -d '2 days ago' +%Y-%m-%dT%H:%MZ)"
time_page "events, one id" "api/events?id=$middle"
time_page "count, dead (capped at 10,000)" "api/count?state=dead"
time_page "count, everything (capped at 10,000)" "api/count"
time_page "event detail, dead with history" "api/event?id=$dead_id"
{
  echo
  echo "Slowest page: ${slowest_page} ms. The exact count a bulk action shows before it runs"
  echo "(\`api/count/exact?…\`) reads every match and may take longer; it runs under a 60 s statement timeout."
} | tee -a "$out"
echo "bench: written to $out"
