#!/usr/bin/env bash
# Log mode's delivery beside table mode's, in one run, written to bench/RESULTS-log-delivery.md
# (on PostgreSQL 15; on the major OUTBOX_PG_MAJOR names, bench/RESULTS-log-delivery-pg<major>.md;
# see bench/README.md): the drain of DRAIN_EVENTS events to one endpoint and to three, and
# commit-to-receipt latency at 5,000 events/s, for each relay: the 2 background workers, which
# read the slot (outbox_log_read), and `outbox relay`, which streams it over a replication
# connection. A cluster on 127.0.0.1 with wal_level = logical per relay; nginx answers 204 and
# logs each delivery's receipt.
set -euo pipefail
cd "$(dirname "$0")/.."

DRAIN_EVENTS=${BENCH_DRAIN_EVENTS:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-20}
LATENCY_RATE=${BENCH_LATENCY_RATE:-5000}
. bench/lib.sh

scripts/setup.sh nginx-light wrk
. scripts/cluster.sh
RESULTS=bench/RESULTS-log-delivery.md
[ "$PG_MAJOR" = 15 ] || RESULTS=bench/RESULTS-log-delivery-pg$PG_MAJOR.md
install_extension
cargo build --release -q -p outbox
OUTBOX=$PWD/target/release/outbox

DIR=$(mktemp -d /tmp/outbox-bench-log.XXXXXX)
chmod 755 "$DIR"
PORT=15343
RECEIVER_PORT=8797
URL="http://127.0.0.1:$RECEIVER_PORT/events"
relay_pid=
stop_relay() { [ -z "$relay_pid" ] || { kill "$relay_pid" 2>/dev/null || true; wait "$relay_pid" 2>/dev/null || true; relay_pid=; }; }
trap 'stop_relay; stop_and_remove' EXIT
trap 'exit 130' INT TERM
start_receiver "$DIR" "$RECEIVER_PORT"
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# in_sql CONDITION SECONDS: waits until CONDITION holds, in one session that looks every 5 ms
# (a psql per look, 50 times a second, took a sixth of these 2 cores from what is measured).
in_sql() {
  q "DO \$\$ DECLARE deadline timestamptz := clock_timestamp() + interval '$2 seconds';
     BEGIN WHILE NOT coalesce(($1), false) AND clock_timestamp() < deadline LOOP COMMIT; PERFORM pg_sleep(0.005); END LOOP; END \$\$" >/dev/null
  [ "$(q "SELECT coalesce(($1), false)")" = t ] || { echo "bench: timed out waiting for $1" >&2; exit 1; }
}
# DRAIN_EVENTS events in transactions of 100, as producers commit them.
enqueue_all() {
  q "DO \$\$ BEGIN FOR i IN 1..$((DRAIN_EVENTS / 100)) LOOP
       PERFORM outbox_enqueue('bench', jsonb_build_object('order_id', n, 'total', 42.5)) FROM generate_series(1, 100) AS n;
       COMMIT;
     END LOOP; END \$\$" >/dev/null
}
empty() { q "TRUNCATE outbox_attempts, outbox_deliveries, outbox, outbox_log" >/dev/null; }
slot_ready="EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot WHERE NOT s.recovering)"
# Back in table mode the relay drops the slot once the log is delivered (docs/log-mode.md):
# table mode is timed after that, as it runs for good.
slot_dropped="NOT EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot)"

# table_drain ENDPOINTS: times the drain in table mode of what was enqueued while every
# endpoint was disabled, from their enabling on.
table_drain() {
  local t0
  q "SELECT outbox_endpoint_disable(name) FROM outbox_endpoints" >/dev/null
  enqueue_all
  t0=$(now)
  q "SELECT outbox_endpoint_enable(name) FROM outbox_endpoints" >/dev/null
  in_sql "NOT EXISTS (SELECT FROM outbox_deliveries WHERE sent_at IS NULL AND dead_at IS NULL AND NOT waiting)" 300
  rate $((DRAIN_EVENTS * $1)) "$(elapsed "$t0" "$(now)")"
  [ "$(q "SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NULL")" = 0 ] || { echo "bench: deliveries died during the drain" >&2; exit 1; }
  empty
}
# log_drain ENDPOINTS: the bench takes the log's lease from the relay (a new fence, for an
# hour) while the events are enqueued, then lets it go, and times until the relay has
# confirmed the slot past the last of them.
log_drain() {
  local target t0
  q "UPDATE outbox_log_state SET reader_fence = reader_fence + 1, reader_until = now() + interval '1 hour'" >/dev/null
  enqueue_all
  target=$(q "SELECT pg_current_wal_lsn()")
  t0=$(now)
  q "UPDATE outbox_log_state SET reader_until = NULL" >/dev/null
  in_sql "SELECT confirmed_flush_lsn >= '$target' FROM pg_replication_slots WHERE slot_name = (SELECT slot FROM outbox_log_state)" 300
  rate $((DRAIN_EVENTS * $1)) "$(elapsed "$t0" "$(now)")"
  [ "$(q "SELECT count(*) FROM outbox_deliveries")" = 0 ] || { echo "bench: a log-mode delivery failed" >&2; exit 1; }
  empty
}

# latency MODE: commit to receipt at LATENCY_RATE events/s for LATENCY_SECONDS in MODE; prints
# "committed p50 p99 max" (ms). 16 clients: with 4, each commit waiting for its own WAL flush
# capped pgbench near 2,500 commits/s.
latency() {
  local committed
  q "SELECT outbox_set_mode('$1')" >/dev/null
  if [ "$1" = log ]; then
    # Timed once the relay has made the slot and caught up with it.
    in_sql "$slot_ready" 30
    in_sql "SELECT lag_bytes < 1000000 FROM outbox_log_lag()" 60
  else
    in_sql "$slot_dropped" 30
  fi
  empty
  : > "$DIR/deliveries.log"
  PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c16 -j2 -R"$LATENCY_RATE" -T"$LATENCY_SECONDS" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
  committed=$(q "SELECT count(*) FROM (SELECT id FROM outbox WHERE topic = 'latency' UNION SELECT id FROM outbox_log WHERE topic = 'latency') AS e")
  local deadline=$((SECONDS + 60))
  until [ "$(wc -l < "$DIR/deliveries.log")" -ge "$committed" ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: receiver logged $(wc -l < "$DIR/deliveries.log") of $committed" >&2; exit 1; }
    sleep 0.05
  done
  echo "$committed $(psql_cluster -tA -q <<SQL | tr '|' ' '
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
}

declare -A runs medians latencies
# measure RELAY: a cluster of its own, served by the workers or by `outbox relay` (as a
# superuser, which may stream the slot); drains in interleaved rounds, then latency.
measure() {
  local relay=$1 round fanout
  if [ "$relay" = workers ]; then
    start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "wal_level = logical" "max_wal_size = '4GB'" \
      "checkpoint_timeout = '30min'" "outbox.poll_interval = '100ms'"
    q "CREATE EXTENSION outbox_ext" >/dev/null
  else
    start_cluster "$DIR/pg" "$PORT" "outbox.workers = 0" "wal_level = logical" "max_wal_size = '4GB'" \
      "checkpoint_timeout = '30min'"
    q "CREATE EXTENSION outbox_ext" >/dev/null
    local url="postgres://postgres@127.0.0.1:$PORT/postgres"
    "$OUTBOX" relay --database-url "$url" --listen-url "$url" --poll-interval 100ms 2>"$DIR/relay.log" &
    relay_pid=$!
  fi
  q "SELECT outbox_endpoint_set('default', '$URL')" >/dev/null
  echo "== $relay: drain of $DRAIN_EVENTS events (transactions of 100), $ROUNDS interleaved rounds"
  for round in $(seq "$ROUNDS"); do
    for fanout in 1 3; do
      q "SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'" >/dev/null
      [ "$fanout" = 1 ] || q "SELECT outbox_endpoint_set('copy-' || n, '$URL') FROM generate_series(2, $fanout) AS n" >/dev/null
      q "SELECT outbox_set_mode('table')" >/dev/null
      in_sql "$slot_dropped" 30
      runs[${relay}_table_$fanout]="${runs[${relay}_table_$fanout]:-} $(table_drain "$fanout")"
      q "SELECT outbox_set_mode('log')" >/dev/null
      in_sql "$slot_ready" 30
      runs[${relay}_log_$fanout]="${runs[${relay}_log_$fanout]:-} $(log_drain "$fanout")"
      echo "round $round, $fanout endpoint(s): table$(echo ${runs[${relay}_table_$fanout]} | awk '{ print " " $NF }'), log$(echo ${runs[${relay}_log_$fanout]} | awk '{ print " " $NF }') deliveries/s"
    done
  done
  q "SELECT outbox_endpoint_drop(name) FROM outbox_endpoints WHERE name LIKE 'copy-%'" >/dev/null
  for mode in table log; do
    echo "== $relay: latency, $LATENCY_RATE events/s for ${LATENCY_SECONDS}s in $mode mode, commit to receipt"
    latencies[${relay}_$mode]=$(latency "$mode")
    echo "${latencies[${relay}_$mode]}" | awk '{ printf "%s events: p50 %s ms, p99 %s ms, max %s ms\n", $1, $2, $3, $4 }'
  done
  for key in table_1 log_1 table_3 log_3; do medians[${relay}_$key]=$(echo ${runs[${relay}_$key]} | median); done
  if [ "$relay" = process ] && grep -q "cannot stream" "$DIR/relay.log"; then
    echo "bench: outbox relay did not stream: $(cat "$DIR/relay.log")" >&2
    exit 1
  fi
}
echo "SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$DIR/latency.sql"
measure workers
stop_cluster
measure process

# PostgreSQL's own streaming of the same inserts at the same rate, with no relay and no HTTP:
# pg_recvlogical (test_decoding) over a replication connection, each event timed as it arrives.
echo "== ceiling: pg_recvlogical at $LATENCY_RATE events/s, commit to receipt"
stop_relay
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
in_sql "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'bench_stream'" 10
q "SELECT pg_drop_replication_slot('bench_stream')" >/dev/null
read -r stream_p50 stream_p99 <<<"$(sort -n "$DIR/stream.log" | awk '{ v[NR] = $1 } END { printf "%.1f %.1f", v[int(NR * 0.5)], v[int(NR * 0.99)] }')"
echo "pg_recvlogical over $stream_events events: p50 $stream_p50 ms, p99 $stream_p99 ms"

# The work of a drain without the relay: the same receiver's rate for event-sized POSTs from
# wrk (C, 128 connections, one thread like the relay's), on the same cores.
echo "== ceiling: wrk POSTs to the receiver"
receiver_rps=$(wrk -t1 -c128 -d10s -s bench/post.lua "http://127.0.0.1:$RECEIVER_PORT/load" | awk '/^Requests\/sec:/ { printf "%.0f", $2 }')
echo "receiver: $receiver_rps requests/s"

latency_cell() { echo "${latencies[$1]}" | awk '{ printf "%s / %s", $2, $3 }'; }
pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
cat > "$RESULTS" <<EOF
# Log mode: delivery beside table mode

\`bench/log-mode.sh\`, $(date -u +%Y-%m-%d), on $(nproc) cores, PostgreSQL $pg_version with
\`wal_level = logical\`, nginx on 127.0.0.1 answering 204. Each relay in a cluster of its own:
the 2 background workers, which read the slot (\`outbox_log_read\`), and \`outbox relay\`
as a superuser, which streams it over a replication connection. Events are enqueued in
transactions of 100 before the relay may read them; each drain figure is the median of
$ROUNDS interleaved rounds. Latency: pgbench (16 clients, \`synchronous_commit = on\`) asked
for $LATENCY_RATE events/s for ${LATENCY_SECONDS} s, commit to receipt, p50 / p99 in ms.

| | workers, table mode | workers, log mode | \`outbox relay\`, table mode | \`outbox relay\`, log mode | target (log mode) |
|---|---|---|---|---|---|
| drain of $DRAIN_EVENTS events, one endpoint (deliveries/s) | ${medians[workers_table_1]} | ${medians[workers_log_1]} | ${medians[process_table_1]} | ${medians[process_log_1]} | 40000, 1.5× table |
| drain, three endpoints (deliveries/s) | ${medians[workers_table_3]} | ${medians[workers_log_3]} | ${medians[process_table_3]} | ${medians[process_log_3]} | 60000 |
| latency at $LATENCY_RATE events/s (ms) | $(latency_cell workers_table) | $(latency_cell workers_log) | $(latency_cell process_table) | $(latency_cell process_log) | 5 / 25 |

Log mode over table mode, one endpoint: workers $(percent "${medians[workers_log_1]}" "${medians[workers_table_1]}"),
\`outbox relay\` $(percent "${medians[process_log_1]}" "${medians[process_table_1]}"); three endpoints: workers
$(percent "${medians[workers_log_3]}" "${medians[workers_table_3]}"), \`outbox relay\` $(percent "${medians[process_log_3]}" "${medians[process_table_3]}").

Table mode's drain is timed from enabling the endpoints until every delivery is marked sent;
log mode's from handing the relay the lease until the slot is confirmed past the last event
(every delivery acknowledged, none written). The bench waits in one session that looks every
5 ms. The HTTP work alone, event-sized POSTs from wrk (one thread, 128 connections) to the
same receiver on the same cores, runs at $receiver_rps requests/s, with no database at all.

The same inserts at the same rate streamed by PostgreSQL itself, \`pg_recvlogical\` over a
replication connection with no relay and no HTTP, arrived $stream_p50 ms after commit at the
median (p99 $stream_p99 ms): the ceiling of a reader of the log here.

Rounds (deliveries/s), one endpoint: workers table:${runs[workers_table_1]}; workers log:${runs[workers_log_1]};
\`outbox relay\` table:${runs[process_table_1]}; \`outbox relay\` log:${runs[process_log_1]}.
Three endpoints: workers table:${runs[workers_table_3]}; workers log:${runs[workers_log_3]};
\`outbox relay\` table:${runs[process_table_3]}; \`outbox relay\` log:${runs[process_log_3]}.
Latency, events committed: workers table $(echo "${latencies[workers_table]}" | cut -d' ' -f1), log
$(echo "${latencies[workers_log]}" | cut -d' ' -f1); \`outbox relay\` table $(echo "${latencies[process_table]}" | cut -d' ' -f1), log
$(echo "${latencies[process_log]}" | cut -d' ' -f1); max (ms): $(echo "${latencies[workers_table]}" | cut -d' ' -f4),
$(echo "${latencies[workers_log]}" | cut -d' ' -f4), $(echo "${latencies[process_table]}" | cut -d' ' -f4), $(echo "${latencies[process_log]}" | cut -d' ' -f4).
EOF
echo "== written $RESULTS"
[ "$PG_MAJOR" != 15 ] || python3 scripts/readme-figures.py # the README quotes its drains and latencies
