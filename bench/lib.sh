# Sourced by the benchmarks (bench/run.sh, bench/latency.sh, bench/pull.sh, bench/ordering.sh):
# the helpers they share. Those that talk to the cluster need scripts/cluster.sh and the
# CLUSTER_PORT its start_cluster sets, when they are called.
DOWN_PORT=9 # the endpoint that is down points here, where nothing may listen
# Found out before a run rather than in the middle of it.
refuse_if_down_port_listens() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$DOWN_PORT") 2>/dev/null; then
    echo "bench: something listens on 127.0.0.1:$DOWN_PORT, where the endpoint that is down should point" >&2
    exit 1
  fi
}

# start_receiver DIR PORT: nginx answering 204 on 127.0.0.1:PORT (bench/nginx.conf.in), its
# files in DIR; stop_receiver DIR stops it, if it was started.
start_receiver() {
  sed -e "s|@DIR@|$1|g" -e "s|@PORT@|$2|g" bench/nginx.conf.in > "$1/nginx.conf"
  nginx -c "$1/nginx.conf"
}
stop_receiver() { [ ! -f "$1/nginx.pid" ] || nginx -c "$1/nginx.conf" -s stop 2>/dev/null || true; }
# What a benchmark started in its $DIR, its cluster and receiver, stopped and removed: at exit.
stop_and_remove() {
  stop_cluster
  stop_receiver "$DIR"
  rm -rf "$DIR"
}

q() { psql_cluster -tA -c "$1"; }
now() { date +%s.%N; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / s }'; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
percent() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
pgbench_tps() { PGHOST=127.0.0.1 PGPORT=$CLUSTER_PORT PGUSER=postgres pgbench -n "$@" postgres 2>&1 | awk '/^tps = / { printf "%.0f", $3 }'; }
wait_for() { # wait_for SQL-condition deadline-seconds
  local deadline=$((SECONDS + $2))
  until [ "$(q "SELECT $1")" = t ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: timed out waiting for $1" >&2; exit 1; }
    sleep 0.05
  done
}
set_url() { # returns once every worker has read it: before that, a worker may still use the old URL
  local since
  since=$(q "SELECT clock_timestamp()")
  q "ALTER SYSTEM SET outbox.webhook_url = '$1'" >/dev/null
  q "SELECT pg_reload_conf()" >/dev/null
  wait_for "bool_and(settings_loaded_at > '$since') FROM outbox_workers()" 10
}
worker_pids() { q "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type = 'outbox_ext relay'"; }
anon_kib() { # anon_kib PID...: the largest private (anonymous) memory among these workers now
  local max=0 kib pid
  for pid in "$@"; do
    kib=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ "${kib:-0}" -gt "$max" ] && max=$kib
  done
  echo "$max"
}
peak_anon=0
# drain TABLE URL [SQL]: times the delivery of what the caller enqueued while
# outbox.webhook_url was empty: runs SQL (whatever else has to start), sets URL and waits until
# no row of TABLE is left to deliver (drain_seconds). Samples the workers' memory meanwhile
# (peak_anon).
drain() {
  local t0 deadline kib pids pending="sent_at IS NULL AND dead_at IS NULL"
  # 0.1.0's outbox has no waiting column, and its pending index no such condition.
  [ "$1" = outbox ] || pending="$pending AND NOT waiting"
  t0=$(now)
  [ -z "${3:-}" ] || q "$3" >/dev/null
  set_url "$2"
  pids=$(worker_pids)
  deadline=$((SECONDS + 300))
  # Polled through the pending index, with one psql per turn: counting the table, or more
  # clients, 20 times a second would take CPU from the workers.
  until [ "$(q "SELECT NOT EXISTS (SELECT FROM $1 WHERE $pending)")" = t ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: drain timed out" >&2; exit 1; }
    # shellcheck disable=SC2086 # one word per pid
    kib=$(anon_kib $pids); [ "$kib" -gt "$peak_anon" ] && peak_anon=$kib
    sleep 0.05
  done
  drain_seconds=$(elapsed "$t0" "$(now)")
  [ "$(q "SELECT count(*) FROM $1 WHERE sent_at IS NULL")" = 0 ] || { echo "bench: deliveries died during the drain" >&2; exit 1; }
}
# receipt_latency LOG ENDPOINT COUNT: once nginx has logged COUNT deliveries in LOG ("<event
# id> <unix time>" lines), prints "p50 p99 max" in milliseconds from the clock_timestamp() each
# event's payload carries as "t" to the first receipt of its delivery to ENDPOINT.
receipt_latency() {
  local deadline=$((SECONDS + 30))
  until [ "$(wc -l < "$1")" -ge "$3" ]; do
    [ $SECONDS -lt $deadline ] || { echo "bench: receiver logged $(wc -l < "$1") of $3 deliveries" >&2; exit 1; }
    sleep 0.05
  done
  psql_cluster -tA -q <<SQL | tr '|' ' '
CREATE TEMP TABLE receipts (id bigint, at numeric);
\copy receipts FROM '$1' WITH (DELIMITER ' ')
WITH latency AS (
  SELECT (min(r.at) - (o.payload->>'t')::numeric) * 1000 AS ms
    FROM outbox_deliveries d
    JOIN outbox o ON o.id = d.event_id
    JOIN receipts r ON r.id = d.event_id
   WHERE d.endpoint = '$2'
   GROUP BY o.id, o.payload)
SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(max(ms), 1)
  FROM latency;
SQL
}
# latency_step SECONDS: the latency step of bench/run.sh (and bench/latency.sh): endpoint `down`
# (DOWN_PORT) failing beside `default`, 500 events/s for SECONDS from
# one pgbench client, each event carrying the clock_timestamp() of its transaction, on empty
# tables and with nginx logging to $DIR/deliveries.log. Sets p50, p99, pmax (ms),
# latency_events and down_failures; leaves `down` and the rows in place.
latency_step() {
  echo "SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())));" > "$DIR/latency.sql"
  q "SELECT outbox_endpoint_set('down', 'http://127.0.0.1:$DOWN_PORT/events')" >/dev/null
  local failed_before
  failed_before=$(q "SELECT sum(failed) FROM outbox_workers()")
  : > "$DIR/deliveries.log"
  PGHOST=127.0.0.1 PGPORT=$CLUSTER_PORT PGUSER=postgres pgbench -n -c1 -R500 -T"$1" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
  wait_for "count(*) = count(sent_at) FROM outbox_deliveries WHERE endpoint = 'default'" 120
  latency_events=$(q "SELECT count(*) FROM outbox_deliveries WHERE endpoint = 'default'")
  down_failures=$(($(q "SELECT sum(failed) FROM outbox_workers()") - failed_before))
  read -r p50 p99 pmax <<<"$(receipt_latency "$DIR/deliveries.log" default "$latency_events")"
  echo "latency over $latency_events events: p50 $p50 ms, p99 $p99 ms, max $pmax ms; $down_failures failed attempts to down meanwhile"
}

# write_claim_statements SCHEMA DIR: the relay's claim for endpoint default alone, as
# DIR/claim_only.sql (rolled back), and DIR/claim_mark.sql: the claim, then the mark-sent
# statement on what it returned, in one transaction per batch: the SQL-only ceiling of a drain.
write_claim_statements() {
  local schema=$1 claim
  sql_text() { grep -v '^ *--' "sql/$1" | sed "s/@extschema@/$schema/g" | tr '\n' ' '; }
  # The workers' claim for endpoint default alone: batch 100, lease 30 s, 10 attempts, the
  # default bytes budget (64 MB).
  claim=$(sql_text claim_batch.sql | sed -e "s/\\\$1/ARRAY['default']/g" -e 's/\$2/ARRAY[100]/g' -e 's/\$3/ARRAY[30000]/g' -e 's/\$4/ARRAY[10]/g' \
            -e 's/\$5/67108864/g' -e 's/\$6/pg_backend_pid()/g')
  # The claim, then the workers' mark-sent statement on the deliveries it returned: one
  # transaction per batch, as a DO block so that pgbench can pass them from one to the next.
  printf 'DO $$DECLARE delivery record; noted record; batch_endpoints text[]; batch_ids bigint[]; batch_fences integer[]; BEGIN FOR delivery IN %s LOOP CONTINUE WHEN delivery.body IS NULL; batch_endpoints := batch_endpoints || delivery.endpoint; batch_ids := batch_ids || delivery.event_id; batch_fences := batch_fences || delivery.fence; END LOOP; %s; END$$;\n' \
    "$claim" \
    "$(sql_text mark_sent.sql | sed -e 's/\$1/batch_endpoints/g' -e 's/\$2/batch_ids/g' -e 's/\$3/batch_fences/g' \
         -e "s/\\\$4/'$schema.outbox_deliveries'::regclass::oid/g" \
         -e "s/SELECT $schema.outbox_note_acked/SELECT INTO noted $schema.outbox_note_acked/")" > "$2/claim_mark.sql"
  printf 'BEGIN;\n%s;\nROLLBACK;\n' "$claim" > "$2/claim_only.sql"
}
