#!/usr/bin/env bash
# The benchmark: one run, one table, written to bench/RESULTS.md. See bench/README.md.
# Everything runs on 127.0.0.1: a throwaway cluster with outbox_ext preloaded (2 workers),
# nginx answering 204 as the receiver, pgbench and wrk as the load.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh nginx-light wrk
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chmod 755 "$DIR"
PORT=54339
RECEIVER_PORT=8799
URL="http://127.0.0.1:$RECEIVER_PORT/events"
DURATION=${BENCH_SECONDS:-30}
DRAIN_EVENTS=${BENCH_DRAIN_EVENTS:-100000}
RETAINED_ROWS=${BENCH_RETAINED_ROWS:-1000000}

cleanup() {
  stop_cluster
  [ -f "$DIR/nginx.pid" ] && nginx -c "$DIR/nginx.conf" -s stop 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

sed -e "s|@DIR@|$DIR|g" -e "s|@PORT@|$RECEIVER_PORT|g" bench/nginx.conf.in > "$DIR/nginx.conf"
nginx -c "$DIR/nginx.conf"

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
psql_cluster -q -c "CREATE EXTENSION outbox_ext"
q() { psql_cluster -tA -c "$1"; }
now() { date +%s.%N; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / s }'; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
pgbench_tps() { PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n "$@" postgres 2>&1 | awk '/^tps = / { printf "%.0f", $3 }'; }
set_url() {
  q "ALTER SYSTEM SET outbox.webhook_url = '$1'" >/dev/null
  q "SELECT pg_reload_conf()" >/dev/null
}
wait_for() { # wait_for SQL-condition deadline-seconds
  local deadline=$((SECONDS + $2))
  until [ "$(q "SELECT $1")" = t ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: timed out waiting for $1" >&2; exit 1; }
    sleep 0.05
  done
}
worker_pids() { q "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type = 'outbox_ext relay'"; }
anon_kib() { # the largest private (anonymous) memory among the workers now
  local max=0 kib
  for pid in $(worker_pids); do
    kib=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ "${kib:-0}" -gt "$max" ] && max=$kib
  done
  echo "$max"
}

cat > "$DIR/insert.sql" <<'SQL'
INSERT INTO outbox (topic, payload) VALUES ('bench', '{"order_id": 1, "total": 42.5}');
SQL
cat > "$DIR/enqueue.sql" <<'SQL'
SELECT outbox_enqueue('bench', '{"order_id": 1, "total": 42.5}');
SQL
cat > "$DIR/latency.sql" <<'SQL'
SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));
SQL
claim=$(sed -e 's/\$1/100/' -e 's/\$2/30000/' -e 's/@extschema@/public/g' sql/claim_batch.sql | grep -v '^--')
# The workers' claim, then their mark-sent UPDATE on the ids it returned: one transaction per
# batch, as a DO block so that pgbench can pass the ids from one statement to the next.
printf 'DO $$DECLARE ids bigint[]; BEGIN WITH claimed AS (%s) SELECT array_agg(id) INTO ids FROM claimed; %s; END$$;\n' \
  "$(echo "$claim" | tr '\n' ' ' | sed 's/RETURNING id,.*/RETURNING id/')" \
  "$(grep -v '^--' sql/mark_sent.sql | sed -e 's/\$1/ids/' -e 's/@extschema@/public/g' \
       -e "s/\\\$2/(SELECT oid FROM pg_extension WHERE extname = 'outbox_ext')/" | tr '\n' ' ')" > "$DIR/claim_mark.sql"
printf 'BEGIN;\n%s;\nROLLBACK;\n' "$(echo "$claim" | tr '\n' ' ')" > "$DIR/claim_only.sql"

echo "== limits (workers idle: outbox.webhook_url is empty)"
receiver_rps=$(wrk -t1 -c32 -d10s -s bench/post.lua "http://127.0.0.1:$RECEIVER_PORT/load" | awk '/^Requests\/sec:/ { printf "%.0f", $2 }')
echo "receiver: $receiver_rps POST/s"
pgbench_tps -c8 -j2 -T5 -f "$DIR/insert.sql" >/dev/null # warm-up: the new cluster's first WAL segments
# This disk's commit rate wanders; alternate the two and keep each one's median of three.
median3() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
inserts=() enqueues=()
for round in 1 2 3; do
  q "TRUNCATE outbox" >/dev/null
  inserts+=("$(pgbench_tps -c8 -j2 -T5 -f "$DIR/insert.sql")")
  q "TRUNCATE outbox" >/dev/null
  enqueues+=("$(pgbench_tps -c8 -j2 -T5 -f "$DIR/enqueue.sql")")
done
insert_tps=$(median3 "${inserts[@]}")
enqueue_alone_tps=$(median3 "${enqueues[@]}")
echo "plain INSERT: $insert_tps rows/s (rounds: ${inserts[*]}); outbox_enqueue alone: $enqueue_alone_tps/s (rounds: ${enqueues[*]})"
q "TRUNCATE outbox" >/dev/null
q "INSERT INTO outbox (topic, payload) SELECT 'bench', '{\"n\": 1}' FROM generate_series(1, 300000)" >/dev/null
q "VACUUM ANALYZE outbox" >/dev/null
t0=$(now); pgbench_tps -c2 -j2 -t1500 -f "$DIR/claim_mark.sql" >/dev/null; t1=$(now)
sql_drain=$(rate "$(q "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")" "$(elapsed "$t0" "$t1")")
echo "SQL-only claim+mark: $sql_drain rows/s"

echo "== drain: $DRAIN_EVENTS events enqueued, then delivered"
q "TRUNCATE outbox" >/dev/null
q "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, $DRAIN_EVENTS) n" >/dev/null
peak_anon=$(anon_kib)
t0=$(now)
set_url "$URL"
deadline=$((SECONDS + 300))
until [ "$(q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")" = 0 ]; do
  [ $SECONDS -lt $deadline ] || { echo "bench: drain timed out" >&2; exit 1; }
  kib=$(anon_kib); [ "$kib" -gt "$peak_anon" ] && peak_anon=$kib
  sleep 0.05
done
t1=$(now)
drain_seconds=$(elapsed "$t0" "$t1")
drain_rate=$(rate "$DRAIN_EVENTS" "$drain_seconds")
echo "drain: $drain_rate events/s ($(printf '%.2f' "$drain_seconds") s); worker private memory peak $((peak_anon / 1024)) MiB"

echo "== keep-up: 8 producers for ${DURATION}s while the workers deliver"
q "TRUNCATE outbox" >/dev/null
enqueue_tps=$(pgbench_tps -c8 -j2 -T"$DURATION" -f "$DIR/enqueue.sql")
read -r enqueued sent backlog <<<"$(q "SELECT count(*), count(sent_at), count(*) - count(sent_at) FROM outbox" | tr '|' ' ')"
delivery_rate=$(rate "$sent" "$DURATION")
backlog_seconds=$(awk -v b="$backlog" -v r="$enqueue_tps" 'BEGIN { printf "%.2f", b / r }')
ratio=$(awk -v a="$enqueue_tps" -v b="$insert_tps" 'BEGIN { printf "%.0f%%", 100 * a / b }')
echo "keep-up: enqueue $enqueue_tps/s ($ratio of plain INSERT), delivered $delivery_rate/s, backlog $backlog ($backlog_seconds s of enqueue)"
wait_for "count(*) = count(sent_at) FROM outbox" 120

echo "== latency: 500 events/s for ${DURATION}s, commit to receipt"
q "TRUNCATE outbox" >/dev/null
: > "$DIR/deliveries.log"
PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c1 -R500 -T"$DURATION" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
wait_for "count(*) = count(sent_at) FROM outbox" 60
latency_events=$(q "SELECT count(*) FROM outbox")
deadline=$((SECONDS + 30))
until [ "$(wc -l < "$DIR/deliveries.log")" -ge "$latency_events" ]; do
  [ $SECONDS -lt $deadline ] || { echo "bench: receiver logged $(wc -l < "$DIR/deliveries.log") of $latency_events deliveries" >&2; exit 1; }
  sleep 0.05
done
read -r p50 p99 pmax <<<"$(psql_cluster -tA -q <<SQL | tr '|' ' '
CREATE TEMP TABLE receipts (id bigint, at numeric);
\copy receipts FROM '$DIR/deliveries.log' WITH (DELIMITER ' ')
WITH latency AS (
  SELECT (min(r.at) - (o.payload->>'t')::numeric) * 1000 AS ms
    FROM outbox o JOIN receipts r ON r.id = o.id GROUP BY o.id, o.payload)
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(max(ms), 1)
  FROM latency;
SQL
)"
echo "latency over $latency_events events: p50 $p50 ms, p99 $p99 ms, max $pmax ms"

echo "== growth: claim time with $RETAINED_ROWS sent rows retained versus none"
set_url ""
q "TRUNCATE outbox" >/dev/null
q "INSERT INTO outbox (topic, payload) SELECT 'pending', '{}' FROM generate_series(1, 1000)" >/dev/null
q "VACUUM ANALYZE outbox" >/dev/null
claim_lat() { PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c1 -T5 -f "$DIR/claim_only.sql" postgres 2>&1 | awk '/^latency average/ { print $4 }'; }
empty_ms=$(claim_lat)
q "INSERT INTO outbox (topic, payload, sent_at) SELECT 'history', '{\"order_id\": 1}', now() FROM generate_series(1, $RETAINED_ROWS)" >/dev/null
q "VACUUM ANALYZE outbox" >/dev/null
full_ms=$(claim_lat)
growth=$(awk -v a="$full_ms" -v b="$empty_ms" 'BEGIN { printf "%.2f", a / b }')
echo "claim of 100: $empty_ms ms with no history, $full_ms ms with $RETAINED_ROWS sent rows (x$growth)"

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
cat > bench/RESULTS.md <<EOF
# Benchmark results

Command: \`bench/run.sh\` (one run; all on 127.0.0.1). Recorded $(date -u +"%Y-%m-%d %H:%M UTC").

Machine: $(nproc) cores ($cpu), $mem, $(uname -sr), PostgreSQL $(q "SHOW server_version" | cut -d' ' -f1),
outbox_ext $(q "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'") with 2 workers, default settings
(batch_size 100, concurrency 128, synchronous_commit on). Receiver: nginx $(nginx -v 2>&1 | cut -d/ -f2) answering 204.

| measure | result | target |
|---|---|---|
| receiver alone (wrk, 32 connections) | $receiver_rps POST/s | — |
| plain INSERT into outbox (pgbench, 8 clients; median of 3 × 5 s) | $insert_tps rows/s | — |
| \`outbox_enqueue\` alone, workers idle (same) | $enqueue_alone_tps/s | — |
| SQL-only claim + mark sent (pgbench, 2 clients, batch 100) | $sql_drain rows/s | — |
| drain: $DRAIN_EVENTS events enqueued, then delivered | $drain_rate events/s | ≥ 20,000 |
| keep-up: enqueue rate, 8 producers, ${DURATION} s | $enqueue_tps/s ($ratio of plain INSERT) | ≥ 90% |
| keep-up: delivery rate | $delivery_rate/s | keeps pace |
| keep-up: backlog at the end | $backlog events ($backlog_seconds s of enqueue) | < 1 s |
| latency at 500 events/s, p50 / p99 / max | $p50 / $p99 / $pmax ms | ≤ 5 / ≤ 25 ms |
| claim of 100 rows: no history / $RETAINED_ROWS sent rows retained | $empty_ms / $full_ms ms (x$growth) | ≤ 1.2× |
| worker private memory (RssAnon) peak during the drain | $((peak_anon / 1024)) MiB | ≤ 64 MiB |

Latency runs from \`clock_timestamp()\` inside the enqueuing transaction (just before its
commit) to nginx's \`\$msec\` when the request arrived (millisecond resolution).
EOF
echo "== written to bench/RESULTS.md"
cat bench/RESULTS.md
