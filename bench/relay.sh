#!/usr/bin/env bash
# The managed-PostgreSQL benchmark: the SQL install and `outbox relay` against the extension and
# its workers, in one run, written to bench/RESULTS-relay.md (on PostgreSQL 15; on the major
# OUTBOX_PG_MAJOR names, bench/RESULTS-relay-pg<major>.md). See bench/README.md.
# Everything runs on 127.0.0.1: one cluster with outbox_ext preloaded (2 workers), serving the
# extension in database `postgres`; database `sqli` holds the SQL install (`outbox migrate` as
# a role with only CREATE), served by two `outbox relay` processes, directly or through
# PgBouncer in transaction mode; nginx answers 204.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${BENCH_SECONDS:-8}
ROUNDS=${BENCH_ROUNDS:-5}
DRAIN_EVENTS=${BENCH_DRAIN_EVENTS:-100000}
DRAIN_ROUNDS=${BENCH_DRAIN_ROUNDS:-3}
LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-20}
POLL_MS=100
. bench/lib.sh

scripts/setup.sh nginx-light wrk
. scripts/cluster.sh
RESULTS=bench/RESULTS-relay.md
[ "$PG_MAJOR" = 15 ] || RESULTS=bench/RESULTS-relay-pg$PG_MAJOR.md
install_extension
cargo build --release -q -p outbox
OUTBOX=$PWD/target/release/outbox

DIR=$(mktemp -d /tmp/outbox-bench-relay.XXXXXX)
chmod 755 "$DIR"
PORT=15341
RECEIVER_PORT=8796
BOUNCER_PORT=16341
URL="http://127.0.0.1:$RECEIVER_PORT/events"
SQLI="postgres://outbox_relay@127.0.0.1:$PORT/sqli"
SQLI_BOUNCER="postgres://outbox_relay@127.0.0.1:$BOUNCER_PORT/sqli"
relay_pids=()

stop_relays() {
  local pid
  for pid in "${relay_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${relay_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  relay_pids=()
}
cleanup() {
  stop_relays
  stop_pgbouncer "$DIR/pgbouncer"
  stop_and_remove
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_receiver "$DIR" "$RECEIVER_PORT"
start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
psql_cluster -q -c "CREATE EXTENSION outbox_ext" -c "CREATE DATABASE sqli" -c "CREATE ROLE outbox_owner LOGIN" \
  -c "GRANT CREATE ON DATABASE sqli TO outbox_owner" -c "CREATE ROLE outbox_relay LOGIN IN ROLE outbox_owner"
"$OUTBOX" migrate --database-url "postgres://outbox_owner@127.0.0.1:$PORT/sqli" 2>/dev/null
# The endpoint default, at the relays' --webhook-url, as the workers' is at outbox.webhook_url.
psql_cluster -q -d sqli -c "SELECT outbox.outbox_endpoint_set('default', NULL)"
start_pgbouncer "$DIR/pgbouncer" "$BOUNCER_PORT" outbox_relay

# qs: a query on the SQL install, as q is on the extension's database.
qs() { PGOPTIONS="-c search_path=outbox" psql_cluster -d sqli -tA -c "$1"; }
empty() { q "TRUNCATE outbox_attempts, outbox_deliveries, outbox" >/dev/null; qs "TRUNCATE outbox_attempts, outbox_deliveries, outbox" >/dev/null; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "SELECT outbox_enqueue('bench', '{\"order_id\": 1, \"total\": 42.5}');" > "$DIR/enqueue.sql"

echo "== enqueue: the extension's outbox_enqueue (C) and the SQL install's (PL/pgSQL), 8 clients, $ROUNDS interleaved rounds"
# No URL anywhere and no relay running: nothing is delivered while the producers run.
enqueue_tps() { # enqueue_tps DATABASE SYNCHRONOUS_COMMIT
  PGOPTIONS="-c synchronous_commit=$2 -c search_path=outbox,public" PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres \
    pgbench -n -c8 -j2 -T"$SECONDS_PER_RUN" -f "$DIR/enqueue.sql" "$1" 2>&1 | awk '/^tps = / { printf "%.0f", $3 }'
}
declare -A tps
for commit in on off; do
  c_runs="" sql_runs=""
  for round in $(seq "$ROUNDS"); do
    empty
    c_runs="$c_runs $(enqueue_tps postgres "$commit")"
    empty
    sql_runs="$sql_runs $(enqueue_tps sqli "$commit")"
  done
  tps[c_$commit]=$(echo $c_runs | median) tps[sql_$commit]=$(echo $sql_runs | median)
  echo "synchronous_commit $commit: C$c_runs; SQL$sql_runs; medians ${tps[c_$commit]} and ${tps[sql_$commit]} ($(percent "${tps[sql_$commit]}" "${tps[c_$commit]}"))"
done
empty

echo "== SQL-only ceiling: claim + mark sent of $DRAIN_EVENTS events, 1 client, one transaction per batch of 100"
write_claim_statements outbox "$DIR"
qs "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, $DRAIN_EVENTS) n" >/dev/null
qs "VACUUM ANALYZE outbox, outbox_deliveries" >/dev/null
t0=$(now)
PGOPTIONS='-c jit=off' PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c1 -t $((DRAIN_EVENTS / 100)) -f "$DIR/claim_mark.sql" sqli >/dev/null 2>&1
ceiling=$(rate "$(qs "SELECT count(sent_at) FROM outbox_deliveries")" "$(elapsed "$t0" "$(now)")")
echo "SQL-only claim+mark: $ceiling deliveries/s"
empty

echo "== drain: $DRAIN_EVENTS events to one endpoint; 2 workers, 2 relays direct, 2 relays through PgBouncer; $DRAIN_ROUNDS rounds"
peak_rss=0
relay_drain() { # relay_drain URL: starts two relays once the events wait, times the drain, stops them
  local t0 deadline kib pid
  qs "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, $DRAIN_EVENTS) n" >/dev/null
  t0=$(now)
  for i in 1 2; do
    "$OUTBOX" relay --database-url "$1" --schema outbox --webhook-url "$URL" 2>>"$DIR/relay.log" &
    relay_pids+=($!)
  done
  deadline=$((SECONDS + 300))
  until [ "$(qs "SELECT NOT EXISTS (SELECT FROM outbox_deliveries WHERE sent_at IS NULL AND dead_at IS NULL)")" = t ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: relay drain timed out" >&2; exit 1; }
    for pid in "${relay_pids[@]}"; do
      kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
      [ "${kib:-0}" -gt "$peak_rss" ] && peak_rss=$kib
    done
    sleep 0.05
  done
  drain_seconds=$(elapsed "$t0" "$(now)")
  stop_relays
  empty
}
workers_runs="" direct_runs="" bouncer_runs=""
for round in $(seq "$DRAIN_ROUNDS"); do
  set_url ""
  q "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, $DRAIN_EVENTS) n" >/dev/null
  drain outbox_deliveries "$URL"
  workers_runs="$workers_runs $(rate "$DRAIN_EVENTS" "$drain_seconds")"
  set_url ""
  empty
  relay_drain "$SQLI"
  direct_runs="$direct_runs $(rate "$DRAIN_EVENTS" "$drain_seconds")"
  relay_drain "$SQLI_BOUNCER"
  bouncer_runs="$bouncer_runs $(rate "$DRAIN_EVENTS" "$drain_seconds")"
  echo "round $round: workers $(echo $workers_runs | awk '{ print $NF }'), relays $(echo $direct_runs | awk '{ print $NF }')," \
       "through PgBouncer $(echo $bouncer_runs | awk '{ print $NF }') events/s"
done
workers_drain=$(echo $workers_runs | median) direct_drain=$(echo $direct_runs | median) bouncer_drain=$(echo $bouncer_runs | median)
peak_mib=$(awk -v k="$peak_rss" 'BEGIN { printf "%.0f", k / 1024 }')
echo "medians: workers $workers_drain, relays $direct_drain ($(percent "$direct_drain" "$workers_drain")), through PgBouncer $bouncer_drain ($(percent "$bouncer_drain" "$workers_drain")); relay resident memory peak $peak_mib MiB"

echo "== latency: 500 events/s for ${LATENCY_SECONDS}s to the SQL install, commit to receipt"
echo "SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$DIR/latency.sql"
relay_latency() { # relay_latency FLAGS...: two relays with FLAGS; sets p50 p99 pmax
  local events
  for i in 1 2; do
    "$OUTBOX" relay --database-url "$SQLI" --schema outbox --webhook-url "$URL" "$@" 2>>"$DIR/relay.log" &
    relay_pids+=($!)
  done
  local deadline=$((SECONDS + 30))
  until [ "$(qs "SELECT count(*) FROM outbox_relays")" = 2 ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: the relays did not start" >&2; exit 1; }
    sleep 0.05
  done
  : > "$DIR/deliveries.log"
  PGOPTIONS="-c search_path=outbox" PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres \
    pgbench -n -c1 -R500 -T"$LATENCY_SECONDS" -f "$DIR/latency.sql" sqli >/dev/null 2>&1
  until [ "$(qs "SELECT count(*) = count(sent_at) FROM outbox_deliveries")" = t ]; do sleep 0.1; done
  events=$(qs "SELECT count(*) FROM outbox_deliveries")
  read -r p50 p99 pmax <<<"$(PGDATABASE=sqli PGOPTIONS="-c search_path=outbox" receipt_latency "$DIR/deliveries.log" default "$events")"
  echo "$* over $events events: p50 $p50 ms, p99 $p99 ms, max $pmax ms"
  stop_relays
  empty
}
relay_latency --listen-url "$SQLI" --poll-interval 1s
listen_p50=$p50 listen_p99=$p99
relay_latency --poll-interval "${POLL_MS}ms"
poll_p50=$p50 poll_p99=$p99

pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
cat > "$RESULTS" <<EOF
# Managed PostgreSQL: the SQL install and \`outbox relay\`

Written by \`bench/relay.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores, PostgreSQL $pg_version, commit
$(git rev-parse --short HEAD)). One cluster, 127.0.0.1 only; nginx answers 204.

| measure | this run | goal |
|---|---|---|
| \`outbox_enqueue\`, SQL install / extension, synchronous_commit on (8 clients, median of $ROUNDS interleaved runs) | ${tps[sql_on]} / ${tps[c_on]} tx/s = $(percent "${tps[sql_on]}" "${tps[c_on]}") | ≥ 90% |
| the same, synchronous_commit off (CPU-bound) | ${tps[sql_off]} / ${tps[c_off]} tx/s = $(percent "${tps[sql_off]}" "${tps[c_off]}") | ≥ 90% |
| SQL-only claim + mark sent (1 client, batches of 100): the ceiling | $ceiling deliveries/s | |
| drain of $DRAIN_EVENTS events: 2 workers (median of $DRAIN_ROUNDS) | $workers_drain events/s ($(percent "$workers_drain" "$ceiling") of the ceiling) | |
| drain: 2 \`outbox relay\`, direct | $direct_drain events/s = $(percent "$direct_drain" "$workers_drain") of the workers' | ≥ 80% |
| drain: 2 \`outbox relay\` through PgBouncer (transaction mode) | $bouncer_drain events/s = $(percent "$bouncer_drain" "$workers_drain") of the workers' | ≥ 60% |
| relay resident memory, peak over the drains | $peak_mib MiB | ≤ 50 MiB |
| commit to receipt at 500 events/s, LISTEN | p50 $listen_p50 ms, p99 $listen_p99 ms | p50 ≤ 5, p99 ≤ 25 |
| the same, polling every $POLL_MS ms, no LISTEN | p50 $poll_p50 ms, p99 $poll_p99 ms | p99 ≤ $((POLL_MS + 25)) |

Runs: enqueue C on/off, SQL on/off per round as printed by the script; drains per round: workers
$workers_runs, relays $direct_runs, through PgBouncer $bouncer_runs events/s.
EOF
echo "== written to $RESULTS"
[ "$PG_MAJOR" != 15 ] || python3 scripts/readme-figures.py # the README quotes its figures of the SQL install
cat "$RESULTS"
