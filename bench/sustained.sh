#!/usr/bin/env bash
# Log mode held at a steady rate for a long time, written to bench/RESULTS-sustained.md and
# plotted in bench/sustained.svg (see bench/README.md): BENCH_SUSTAINED_RATE events/s (default
# 10,000, in transactions of 10 from 8 clients) for BENCH_SUSTAINED_SECONDS (default 1800), while
# 2 relay workers deliver them to nginx. Every 10 s it records what was enqueued and delivered,
# the slot's lag, the sizes of the log, of the table path and of the WAL, and the dead rows of
# the one table log mode updates (outbox_log_state, once per confirmation).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${BENCH_SUSTAINED_RATE:-10000}
DURATION=${BENCH_SUSTAINED_SECONDS:-1800}
MINUTES=$((DURATION / 60))
SAMPLE_SECONDS=10
. bench/lib.sh

scripts/setup.sh nginx-light gnuplot-nox
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-bench-sustained.XXXXXX)
chmod 755 "$DIR"
PORT=15344
RECEIVER_PORT=8796
cleanup() {
  [ -z "${producers:-}" ] || kill "$producers" 2>/dev/null || true
  stop_and_remove
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_receiver "$DIR" "$RECEIVER_PORT"
# The server's defaults otherwise (max_wal_size, checkpoints, autovacuum): what is measured is
# whether they keep up. /load logs nothing: half a gigabyte of receipts would be the largest
# file here.
start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "wal_level = logical" \
  "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/load'"
q "CREATE EXTENSION outbox_ext" >/dev/null
q "SELECT outbox_set_mode('log')" >/dev/null
wait_for "EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot WHERE NOT s.recovering AND s.confirmed_at IS NOT NULL)" 30

echo "SELECT outbox_enqueue('sustained', jsonb_build_object('order_id', n, 'total', 42.5)) FROM generate_series(1, 10) AS n;" > "$DIR/enqueue.sql"
echo "== $RATE events/s for $DURATION s in log mode (transactions of 10, 8 clients)"
PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c8 -j2 -R$((RATE / 10)) -T"$DURATION" \
  -f "$DIR/enqueue.sql" postgres > "$DIR/pgbench.log" 2>&1 &
producers=$!
started=$(q "SELECT clock_timestamp()")
# One row a sample: seconds, events enqueued and delivered so far, the slot's lag (bytes,
# seconds), the log's size, the table path's (outbox and outbox_deliveries), the WAL's (bytes),
# outbox_log_state's dead rows.
sample() {
  q "SELECT round(extract(epoch FROM clock_timestamp() - '$started'))::int,
            (SELECT last_value FROM outbox_id_seq),
            (SELECT sum(delivered) FROM outbox_workers()),
            l.lag_bytes, round(l.lag_seconds::numeric, 2),
            (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_log')),
            pg_total_relation_size('outbox') + pg_total_relation_size('outbox_deliveries'),
            (SELECT sum(size) FROM pg_ls_waldir()),
            (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'outbox_log_state'::regclass)
       FROM outbox_log_lag() AS l" | tr '|' ' '
}
: > "$DIR/samples"
while kill -0 "$producers" 2>/dev/null; do
  sample | tee -a "$DIR/samples" | awk '{ printf "%5d s: %d enqueued, %d delivered, slot %.2f s behind\n", $1, $2, $3, $5 }'
  sleep "$SAMPLE_SECONDS" # the sampling interval itself
done
wait "$producers" || { cat "$DIR/pgbench.log" >&2; exit 1; }
deadline=$((SECONDS + 120))
until [ "$(q "SELECT lag_seconds < 1 AND (SELECT sum(delivered) FROM outbox_workers()) >= (SELECT last_value FROM outbox_id_seq) FROM outbox_log_lag()")" = t ]; do
  [ $SECONDS -lt $deadline ] || { echo "bench: the relay did not catch up within 2 minutes" >&2; exit 1; }
  sleep 0.5
done
sample >> "$DIR/samples"

# The rates between samples; then the plot.
awk 'NR > 1 { printf "%d %.0f %.0f %s %s %.1f %.1f %.1f %s\n", $1, ($2 - e) / ($1 - t), ($3 - d) / ($1 - t), $4, $5,
              $6 / 1048576, $7 / 1048576, $8 / 1048576, $9 } { t = $1; e = $2; d = $3 }' "$DIR/samples" > "$DIR/rates"
gnuplot <<EOF
set terminal svg size 900,900 dynamic font "sans,11"
set output "bench/sustained.svg"
set multiplot layout 3,1 title "outbox\\\\_ext log mode, $RATE events/s asked for $DURATION s ($(date -u +%Y-%m-%d), $(nproc) cores)"
set xlabel "seconds"
set key top left
set grid
set ylabel "events/s"
set yrange [0:*]
plot "$DIR/rates" using 1:2 with lines title "enqueued", "" using 1:3 with lines title "delivered"
set ylabel "seconds behind"
plot "$DIR/rates" using 1:5 with lines title "slot lag (outbox\\\\_log\\\\_lag)"
set ylabel "MB"
plot "$DIR/rates" using 1:6 with lines title "outbox\\\\_log", "" using 1:7 with lines title "outbox + outbox\\\\_deliveries", \
     "" using 1:8 with lines title "WAL (pg\\\\_wal)"
unset multiplot
EOF

read -r enqueued delivered <<<"$(tail -1 "$DIR/samples" | awk '{ print $2, $3 }')"
# The last sample comes after the relay caught up, not 10 s after the one before it.
summary=$(awk 'NR == 1 { low = $3 } { n++; if (NR < total && $3 < low) low = $3; if ($4 > lb) lb = $4; if ($5 > ls) ls = $5
                 if ($8 > w) w = $8; if ($9 > dead) dead = $9; if (n == 1) { tp0 = $7 } tp = $7; log_mb = $6 }
               END { printf "%.0f %d %.2f %.0f %d %.1f %.1f %.0f", low, lb, ls, w, dead, tp0, tp, log_mb }' total="$(wc -l < "$DIR/rates")" "$DIR/rates")
read -r lowest_delivery max_lag_bytes max_lag_seconds max_wal_mb max_dead table_path_start table_path_end log_mb <<<"$summary"
pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
cat > bench/RESULTS-sustained.md <<EOF
# Log mode, sustained

\`bench/sustained.sh\`, $(date -u +%Y-%m-%d), on $(nproc) cores, PostgreSQL $pg_version with
\`wal_level = logical\` and its defaults otherwise (\`max_wal_size\`, checkpoints, autovacuum),
2 relay workers, nginx on 127.0.0.1 answering 204. pgbench asked for $RATE events/s for
$DURATION s ($MINUTES minutes): transactions of 10 \`outbox_enqueue\` calls from 8 clients. Sampled every
${SAMPLE_SECONDS} s; the plot is [sustained.svg](sustained.svg).

| | |
|---|---|
| events enqueued, delivered | $enqueued, $delivered |
| enqueued, mean rate | $((enqueued / DURATION))/s |
| delivered, lowest rate over ${SAMPLE_SECONDS} s while enqueuing | $lowest_delivery/s |
| slot lag, largest sample | $max_lag_seconds s, $max_lag_bytes bytes |
| WAL kept, largest sample | $max_wal_mb MB |
| \`outbox_log_state\` dead rows, largest sample (autovacuum) | $max_dead |
| \`outbox\` + \`outbox_deliveries\`, first and last sample | $table_path_start MB, $table_path_end MB |
| \`outbox_log\` at the end | $log_mb MB |

\`outbox_log\` grows through each hour and is bounded by its hourly partitions: the relay drops
a partition once its hour has passed and every event in it is confirmed, so the log holds at
most the current and the previous hour. Nothing else grows with the events: a delivery the
receiver acknowledges writes no row, and the slot is confirmed after every read.
EOF
echo "== written bench/RESULTS-sustained.md and bench/sustained.svg"
