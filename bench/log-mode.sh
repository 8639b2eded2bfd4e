#!/usr/bin/env bash
# Log mode's delivery beside table mode's, in one run, written to bench/RESULTS-log-delivery.md
# (see bench/README.md): the drain of DRAIN_EVENTS events to one endpoint and to three, and
# commit-to-receipt latency at 5,000 events/s. One cluster on 127.0.0.1 with wal_level =
# logical and 2 relay workers; nginx answers 204 and logs each delivery's receipt.
set -euo pipefail
cd "$(dirname "$0")/.."

DRAIN_EVENTS=${BENCH_DRAIN_EVENTS:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-20}
LATENCY_RATE=${BENCH_LATENCY_RATE:-5000}
. bench/lib.sh

scripts/setup.sh nginx-light wrk
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-bench-log.XXXXXX)
chmod 755 "$DIR"
PORT=15343
RECEIVER_PORT=8797
URL="http://127.0.0.1:$RECEIVER_PORT/events"
trap stop_and_remove EXIT
trap 'exit 130' INT TERM

start_receiver "$DIR" "$RECEIVER_PORT"
start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "wal_level = logical" "max_wal_size = '4GB'" \
  "checkpoint_timeout = '30min'" "outbox.poll_interval = '100ms'"
q "CREATE EXTENSION outbox_ext" >/dev/null
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# DRAIN_EVENTS events in transactions of 100, as producers commit them.
enqueue_all() {
  q "DO \$\$ BEGIN FOR i IN 1..$((DRAIN_EVENTS / 100)) LOOP
       PERFORM outbox_enqueue('bench', jsonb_build_object('order_id', n, 'total', 42.5)) FROM generate_series(1, 100) AS n;
       COMMIT;
     END LOOP; END \$\$" >/dev/null
}
empty() { q "TRUNCATE outbox_attempts, outbox_deliveries, outbox, outbox_log" >/dev/null; }
# Back in table mode the relay drops the slot once the log is delivered (docs/log-mode.md):
# table mode is timed after that, as it runs for good.
slot_dropped() { wait_for "NOT EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot)" 30; }
slot_confirmed_to() { q "SELECT confirmed_flush_lsn >= '$1' FROM pg_replication_slots WHERE slot_name = (SELECT slot FROM outbox_log_state)"; }

# table_drain ENDPOINTS: times the workers' drain in table mode (enqueued with no URL, and the
# other endpoints disabled).
table_drain() {
  set_url ""
  q "SELECT outbox_endpoint_disable(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'" >/dev/null
  enqueue_all
  drain outbox_deliveries "$URL" "SELECT outbox_endpoint_enable(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'"
  rate $((DRAIN_EVENTS * $1)) "$drain_seconds"
  empty
}
# log_drain ENDPOINTS: the bench takes the log's lease from the workers (a new fence, for an
# hour) while the events are enqueued, then lets it go, and times until the workers have
# confirmed the slot past the last of them.
log_drain() {
  local target t0 deadline
  q "UPDATE outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour'" >/dev/null
  enqueue_all
  target=$(q "SELECT pg_current_wal_lsn()")
  t0=$(now)
  q "UPDATE outbox_log_state SET reader_until = NULL" >/dev/null
  deadline=$((SECONDS + 300))
  until [ "$(slot_confirmed_to "$target")" = t ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: log drain timed out" >&2; exit 1; }
    sleep 0.02
  done
  rate $((DRAIN_EVENTS * $1)) "$(elapsed "$t0" "$(now)")"
  [ "$(q "SELECT count(*) FROM outbox_deliveries")" = 0 ] || { echo "bench: a log-mode delivery failed" >&2; exit 1; }
  empty
}

echo "== drain: $DRAIN_EVENTS events (transactions of 100), 2 workers, $ROUNDS interleaved rounds"
declare -A runs
for round in $(seq "$ROUNDS"); do
  for fanout in 1 3; do
    q "SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'" >/dev/null
    [ "$fanout" = 1 ] || q "SELECT outbox_endpoint_set('copy-' || n, '$URL') FROM generate_series(2, $fanout) AS n" >/dev/null
    q "SELECT outbox_set_mode('table')" >/dev/null
    slot_dropped
    runs[table_$fanout]="${runs[table_$fanout]:-} $(table_drain "$fanout")"
    set_url "$URL"
    q "SELECT outbox_set_mode('log')" >/dev/null
    wait_for "EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot WHERE NOT s.recovering)" 30
    runs[log_$fanout]="${runs[log_$fanout]:-} $(log_drain "$fanout")"
    echo "round $round, $fanout endpoint(s): table$(echo ${runs[table_$fanout]} | awk '{ print " " $NF }'), log$(echo ${runs[log_$fanout]} | awk '{ print " " $NF }') deliveries/s"
  done
done
q "SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'" >/dev/null
declare -A medians
for key in table_1 log_1 table_3 log_3; do medians[$key]=$(echo ${runs[$key]} | median); done

# latency MODE: commit to receipt at LATENCY_RATE events/s for LATENCY_SECONDS in MODE; sets
# latency_events (committed) and p50, p99, pmax (ms). 16 clients: with 4, each commit waiting
# for its own WAL flush capped pgbench near 2,500 commits/s.
latency() {
  echo "== latency: $LATENCY_RATE events/s for ${LATENCY_SECONDS}s in $1 mode, commit to receipt"
  q "SELECT outbox_set_mode('$1')" >/dev/null
  [ "$1" = log ] || slot_dropped
  # Log mode is timed once the relay has made the slot and caught up with it.
  [ "$1" = table ] || wait_for "EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot WHERE NOT s.recovering)" 30
  [ "$1" = table ] || wait_for "lag_bytes < 1000000 FROM outbox_log_lag()" 60
  empty
  : > "$DIR/deliveries.log"
  PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c16 -j2 -R"$LATENCY_RATE" -T"$LATENCY_SECONDS" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
  latency_events=$(q "SELECT count(*) FROM (SELECT id FROM outbox WHERE topic = 'latency' UNION SELECT id FROM outbox_log WHERE topic = 'latency') AS e")
  local deadline=$((SECONDS + 60))
  until [ "$(wc -l < "$DIR/deliveries.log")" -ge "$latency_events" ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: receiver logged $(wc -l < "$DIR/deliveries.log") of $latency_events" >&2; exit 1; }
    sleep 0.05
  done
  read -r p50 p99 pmax <<<"$(psql_cluster -tA -q <<SQL | tr '|' ' '
CREATE TEMP TABLE receipts (id bigint, at numeric);
\copy receipts FROM '$DIR/deliveries.log' WITH (DELIMITER ' ')
WITH events AS (
  SELECT id, payload FROM outbox WHERE topic = 'latency'
  UNION ALL
  SELECT id, payload FROM outbox_log WHERE topic = 'latency'),
latency AS (
  SELECT (min(r.at) - (e.payload->>'t')::numeric) * 1000 AS ms
    FROM events e JOIN receipts r ON r.id = e.id
   GROUP BY e.id, e.payload)
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(max(ms), 1)
  FROM latency;
SQL
)"
  echo "latency over $latency_events events: p50 $p50 ms, p99 $p99 ms, max $pmax ms"
}
echo "SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$DIR/latency.sql"
latency table
table_latency="$latency_events events ($((latency_events / LATENCY_SECONDS))/s): p50 $p50 ms, p99 $p99 ms, max $pmax ms"
latency log

# PostgreSQL's own streaming of the same inserts at the same rate, with no relay and no HTTP:
# pg_recvlogical (test_decoding) over a replication connection, each event timed as it arrives.
echo "== ceiling: pg_recvlogical at $LATENCY_RATE events/s, commit to receipt"
q "UPDATE outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour'" >/dev/null
empty
q "SELECT pg_create_logical_replication_slot('bench_stream', 'test_decoding')" >/dev/null
pg_recvlogical -h 127.0.0.1 -p "$PORT" -U postgres -d postgres --slot bench_stream --start -f - -F 0 -s 1 2>/dev/null | python3 -u -c '
import re, sys, time
for line in sys.stdin:
    event = re.search(r"payload\[jsonb\]:.\{\"t\": ([0-9.]+)\}", line)
    if event:
        print(f"{(time.time() - float(event.group(1))) * 1000:.3f}", flush=True)' > "$DIR/stream.log" &
PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c16 -j2 -R"$LATENCY_RATE" -T"$LATENCY_SECONDS" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
stream_events=$(q "SELECT count(*) FROM outbox_log WHERE topic = 'latency'")
deadline=$((SECONDS + 60))
until [ "$(wc -l < "$DIR/stream.log")" -ge "$stream_events" ]; do
  [ $SECONDS -lt $deadline ] || { echo "bench: pg_recvlogical received $(wc -l < "$DIR/stream.log") of $stream_events" >&2; exit 1; }
  sleep 0.05
done
pkill -f "slot bench_stream" || true
wait_for "NOT active FROM pg_replication_slots WHERE slot_name = 'bench_stream'" 10
q "SELECT pg_drop_replication_slot('bench_stream')" >/dev/null
q "UPDATE outbox_log_state SET reader_until = NULL" >/dev/null
read -r stream_p50 stream_p99 <<<"$(sort -n "$DIR/stream.log" | awk '{ v[NR] = $1 } END { printf "%.1f %.1f", v[int(NR * 0.5)], v[int(NR * 0.99)] }')"
echo "pg_recvlogical over $stream_events events: p50 $stream_p50 ms, p99 $stream_p99 ms"

# The work of a drain without the relay: the same receiver's rate for event-sized POSTs from
# wrk (C, 128 connections, one thread like the relay's), on the same cores.
echo "== ceiling: wrk POSTs to the receiver"
receiver_rps=$(wrk -t1 -c128 -d10s -s bench/post.lua "http://127.0.0.1:$RECEIVER_PORT/load" | awk '/^Requests\/sec:/ { printf "%.0f", $2 }')
echo "receiver: $receiver_rps requests/s"

pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
cat > bench/RESULTS-log-delivery.md <<EOF
# Log mode: delivery beside table mode

\`bench/log-mode.sh\`, $(date -u +%Y-%m-%d), on $(nproc) cores, PostgreSQL $pg_version with
\`wal_level = logical\`, 2 relay workers, nginx on 127.0.0.1 answering 204. Events are
enqueued in transactions of 100 before the relay may read them; each figure is the median of
$ROUNDS interleaved rounds.

| drain of $DRAIN_EVENTS events | table mode | log mode | log / table |
|---|---|---|---|
| to one endpoint (deliveries/s) | ${medians[table_1]} | ${medians[log_1]} | $(percent "${medians[log_1]}" "${medians[table_1]}") |
| to three endpoints (deliveries/s) | ${medians[table_3]} | ${medians[log_3]} | $(percent "${medians[log_3]}" "${medians[table_3]}") |

Table mode's drain ends when every delivery is marked sent; log mode's when the slot is
confirmed past the last event (every delivery acknowledged, none written). The HTTP work
alone, event-sized POSTs from wrk (one thread, 128 connections) to the same receiver on the
same cores, runs at $receiver_rps requests/s: that is the ceiling of a drain here, with no
database at all.

Commit to receipt, pgbench (16 clients, \`synchronous_commit = on\`) asked for $LATENCY_RATE
events/s for ${LATENCY_SECONDS} s, on these 2 cores beside the relay and the receiver. Log mode
committed $latency_events events ($((latency_events / LATENCY_SECONDS))/s): p50 $p50 ms, p99 $p99 ms, max $pmax ms.
Table mode, in the same run, committed $table_latency. The same inserts at the same rate
streamed by PostgreSQL itself, \`pg_recvlogical\` over a replication connection with no relay
and no HTTP, arrived $stream_p50 ms after commit at the median (p99 $stream_p99 ms): the
ceiling of a reader of the log here.

Rounds (deliveries/s): table, one endpoint:${runs[table_1]}; log, one endpoint:${runs[log_1]};
table, three:${runs[table_3]}; log, three:${runs[log_3]}.
EOF
echo "== written bench/RESULTS-log-delivery.md"
