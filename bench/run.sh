#!/usr/bin/env bash
# The benchmark: one run, one table, written to bench/RESULTS.md. See bench/README.md.
# Everything runs on 127.0.0.1: a throwaway cluster with outbox_ext preloaded (2 workers),
# nginx answering 204 as the receiver, pgbench and wrk as the load. Then, unless
# BENCH_COMPARE_0_1_0=0, the same drain with 0.1.0's library and with this version's, each in a
# new cluster, alternating, and this version's library put back.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_SECONDS:-30}
DRAIN_EVENTS=${BENCH_DRAIN_EVENTS:-100000}
RETAINED_ROWS=${BENCH_RETAINED_ROWS:-1000000}
COMPARE_0_1_0=${BENCH_COMPARE_0_1_0:-1}
OLD_COMMIT=63b0dfc # 0.1.0 as released
# A target directory of its own, kept between runs: next time only the crate is rebuilt.
OLD_TARGET=$PWD/target/bench-0.1.0
. bench/lib.sh
# Both found out now rather than after the rest of the run.
if [ "$COMPARE_0_1_0" = 1 ] && ! git cat-file -e "$OLD_COMMIT^{commit}" 2>/dev/null; then
  echo "bench: commit $OLD_COMMIT (0.1.0) is not in this clone; fetch the history or set BENCH_COMPARE_0_1_0=0" >&2
  exit 1
fi
refuse_if_down_port_listens

scripts/setup.sh nginx-light wrk
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chmod 755 "$DIR"
OLD_TREE=$DIR/0.1.0
PORT=15339
RECEIVER_PORT=8799
URL="http://127.0.0.1:$RECEIVER_PORT/events"
CLUSTER_SETTINGS=("outbox.workers = 2" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'")
library_replaced=0 # 1 while 0.1.0's library is installed instead of this version's

cleanup() { # each step is done even if the one before failed
  stop_cluster
  [ ! -f "$DIR/nginx.pid" ] || nginx -c "$DIR/nginx.conf" -s stop 2>/dev/null || true
  [ ! -d "$OLD_TREE" ] || git worktree remove --force "$OLD_TREE" || true
  rm -rf "$DIR"
  # Last: if this build fails too, nothing else is left behind.
  if [ "$library_replaced" = 1 ]; then
    echo "bench: putting this version's library back" >&2
    install_extension
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

sed -e "s|@DIR@|$DIR|g" -e "s|@PORT@|$RECEIVER_PORT|g" bench/nginx.conf.in > "$DIR/nginx.conf"
nginx -c "$DIR/nginx.conf"

start_cluster "$DIR/pg" "$PORT" "${CLUSTER_SETTINGS[@]}"
psql_cluster -q -c "CREATE EXTENSION outbox_ext"
empty_tables() { q "TRUNCATE outbox_attempts, outbox_deliveries, outbox" >/dev/null; }
# Endpoints b and c beside default, subscribed to every event: three deliveries per event.
# Created disabled, so that the workers leave their deliveries alone until they are enabled.
add_b_c() {
  q "SELECT outbox_endpoint_set(n, '$URL/' || n) FROM unnest('{b,c}'::text[]) n;
     SELECT outbox_endpoint_disable(n) FROM unnest('{b,c}'::text[]) n" >/dev/null
}
drop_b_c() { q "SELECT outbox_endpoint_drop(n) FROM unnest('{b,c}'::text[]) n" >/dev/null; }
insert_events() { # insert_events COUNT TOPIC SENT_AT: events, each with its delivery to default
  q "WITH event AS (INSERT INTO outbox (topic, payload) SELECT '$2', '{\"n\": 1}' FROM generate_series(1, $1) RETURNING id)
     INSERT INTO outbox_deliveries (event_id, endpoint, sent_at) SELECT id, 'default', $3 FROM event" >/dev/null
}
enqueue_drain_events() { q "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n))) FROM generate_series(1, $DRAIN_EVENTS) n" >/dev/null; }
cat > "$DIR/insert.sql" <<'SQL'
INSERT INTO outbox (topic, payload) VALUES ('bench', '{"order_id": 1, "total": 42.5}');
SQL
cat > "$DIR/enqueue.sql" <<'SQL'
SELECT outbox_enqueue('bench', '{"order_id": 1, "total": 42.5}');
SQL
# The least any outbox that keeps a delivery row per endpoint can cost: the event's row and
# one delivery row, in one plain statement, with no check, routing or wakeup.
cat > "$DIR/two_rows.sql" <<'SQL'
WITH event AS (INSERT INTO outbox (topic, payload) VALUES ('bench', '{"order_id": 1, "total": 42.5}') RETURNING id)
INSERT INTO outbox_deliveries (event_id, endpoint) SELECT id, 'default' FROM event;
SQL
write_claim_statements public "$DIR"

echo "== limits (workers idle: outbox.webhook_url is empty)"
receiver_rps=$(wrk -t1 -c32 -d10s -s bench/post.lua "http://127.0.0.1:$RECEIVER_PORT/load" | awk '/^Requests\/sec:/ { printf "%.0f", $2 }')
echo "receiver: $receiver_rps POST/s"
pgbench_tps -c8 -j2 -T5 -f "$DIR/insert.sql" >/dev/null # warm-up: the new cluster's first WAL segments
# This disk's commit rate wanders: the measures alternate, five rounds, and each keeps its
# median. b and c exist only for the three-endpoint runs.
declare -A runs=()
measure() { # measure NAME SYNCHRONOUS_COMMIT SCRIPT: 8 clients for 5 s on empty tables
  empty_tables
  runs[$1]+=" $(PGOPTIONS="-c synchronous_commit=$2" pgbench_tps -c8 -j2 -T5 -f "$DIR/$3")"
}
median5() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
for round in 1 2 3 4 5; do
  for commit in on off; do
    measure "insert-$commit" "$commit" insert.sql
    measure "enqueue-$commit" "$commit" enqueue.sql
    measure "two_rows-$commit" "$commit" two_rows.sql
  done
  add_b_c
  for commit in on off; do
    measure "enqueue3-$commit" "$commit" enqueue.sql
  done
  empty_tables
  drop_b_c
done
for commit in on off; do
  echo "rounds, synchronous_commit $commit: plain INSERT${runs[insert-$commit]}; outbox_enqueue${runs[enqueue-$commit]}; event and delivery rows${runs[two_rows-$commit]}; with three endpoints${runs[enqueue3-$commit]}"
done
insert_on=$(median5 ${runs[insert-on]}) insert_off=$(median5 ${runs[insert-off]})
enqueue_on=$(median5 ${runs[enqueue-on]}) enqueue_off=$(median5 ${runs[enqueue-off]})
enqueue3_on=$(median5 ${runs[enqueue3-on]}) enqueue3_off=$(median5 ${runs[enqueue3-off]})
two_rows_on=$(median5 ${runs[two_rows-on]}) two_rows_off=$(median5 ${runs[two_rows-off]})
two_rows_ratios="$(percent "$two_rows_on" "$insert_on") / $(percent "$two_rows_off" "$insert_off")"
enqueue_ratios="$(percent "$enqueue_on" "$insert_on") / $(percent "$enqueue_off" "$insert_off")"
enqueue3_ratios="$(percent "$enqueue3_on" "$insert_on") / $(percent "$enqueue3_off" "$insert_off")"
echo "plain INSERT: $insert_on / $insert_off rows/s (synchronous_commit on / off)"
echo "outbox_enqueue, one endpoint: $enqueue_on / $enqueue_off events/s ($enqueue_ratios of plain INSERT)"
echo "outbox_enqueue, three endpoints: $enqueue3_on / $enqueue3_off events/s ($enqueue3_ratios of plain INSERT)"
echo "event and delivery rows in one plain statement: $two_rows_on / $two_rows_off events/s ($two_rows_ratios of plain INSERT)"
empty_tables
insert_events 300000 bench NULL
q "VACUUM ANALYZE outbox, outbox_deliveries" >/dev/null
# With JIT off, as the workers run their statements: the claim's estimated cost is high enough
# to have each one compiled, which costs more than running it.
t0=$(now); PGOPTIONS='-c jit=off' pgbench_tps -c2 -j2 -t1500 -f "$DIR/claim_mark.sql" >/dev/null; t1=$(now)
sql_drain=$(rate "$(q "SELECT count(sent_at) FROM outbox_deliveries")" "$(elapsed "$t0" "$t1")")
echo "SQL-only claim+mark: $sql_drain deliveries/s"

echo "== drain: $DRAIN_EVENTS events enqueued, then delivered to one endpoint"
empty_tables
enqueue_drain_events
drain outbox_deliveries "$URL"
drain_rate=$(rate "$DRAIN_EVENTS" "$drain_seconds")
echo "drain: $drain_rate events/s ($(printf '%.2f' "$drain_seconds") s, $(percent "$drain_rate" "$sql_drain") of SQL-only)"

echo "== fan-out drain: $DRAIN_EVENTS events enqueued, then each delivered to default, b and c"
set_url ""
empty_tables
add_b_c
enqueue_drain_events
drain outbox_deliveries "$URL" "SELECT outbox_endpoint_enable(n) FROM unnest('{b,c}'::text[]) n"
fanout_rate=$(rate $((3 * DRAIN_EVENTS)) "$drain_seconds")
peak_mib=$((peak_anon / 1024))
echo "fan-out drain: $fanout_rate deliveries/s ($(printf '%.2f' "$drain_seconds") s); worker private memory peak over both drains $peak_mib MiB"
empty_tables
drop_b_c

echo "== keep-up: 8 producers for ${DURATION}s while the workers deliver"
empty_tables
enqueue_tps=$(pgbench_tps -c8 -j2 -T"$DURATION" -f "$DIR/enqueue.sql")
read -r enqueued sent backlog <<<"$(q "SELECT count(*), count(sent_at), count(*) - count(sent_at) FROM outbox_deliveries" | tr '|' ' ')"
delivery_rate=$(rate "$sent" "$DURATION")
backlog_seconds=$(awk -v b="$backlog" -v r="$enqueue_tps" 'BEGIN { printf "%.2f", b / r }')
ratio=$(percent "$enqueue_tps" "$insert_on")
echo "keep-up: enqueued $enqueued at $enqueue_tps/s ($ratio of plain INSERT), delivered $delivery_rate/s, backlog $backlog ($backlog_seconds s of enqueue)"
wait_for "count(*) = count(sent_at) FROM outbox_deliveries" 120

echo "== latency: 500 events/s for ${DURATION}s, commit to receipt, with endpoint down failing beside default"
empty_tables
latency_step "$DURATION"
empty_tables
q "SELECT outbox_endpoint_drop('down')" >/dev/null

echo "== growth: claim time with $RETAINED_ROWS sent deliveries retained versus none"
set_url ""
empty_tables
insert_events 1000 pending NULL
q "VACUUM ANALYZE outbox, outbox_deliveries" >/dev/null
claim_lat() { PGOPTIONS='-c jit=off' PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c1 -T5 -f "$DIR/claim_only.sql" postgres 2>&1 | awk '/^latency average/ { print $4 }'; }
empty_ms=$(claim_lat)
insert_events "$RETAINED_ROWS" history "now()"
q "VACUUM ANALYZE outbox, outbox_deliveries" >/dev/null
full_ms=$(claim_lat)
growth=$(awk -v a="$full_ms" -v b="$empty_ms" 'BEGIN { printf "%.2f", a / b }')
echo "claim of 100: $empty_ms ms with no history, $full_ms ms with $RETAINED_ROWS sent deliveries (x$growth)"

pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
ext_version=$(q "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'")
stop_cluster # its library is about to be replaced

# 0.1.0 against this version: the same drain, each in a new cluster, alternating, three rounds;
# the medians are compared. (A drain at the end of a long run, in a cluster that has seen it
# all, against one in a new cluster, measured the clusters as much as the versions.) The two
# libraries are installed once each and then swapped by copying their files.
old_drain_rate= new_drain_rate= old_rates= new_rates= old_sql_rates= new_sql_rates=
if [ "$COMPARE_0_1_0" = 1 ]; then
  echo "== 0.1.0 against this version: the same drain in a new cluster each, alternating, 3 rounds"
  libdir=$("$PG_BIN/pg_config" --pkglibdir) extdir="$("$PG_BIN/pg_config" --sharedir)/extension"
  save_library() { mkdir -p "$DIR/lib-$1"; cp "$libdir/outbox_ext.so" "$extdir"/outbox_ext.control "$extdir"/outbox_ext--*.sql "$DIR/lib-$1/"; }
  use_library() {
    as_root rm -f "$extdir"/outbox_ext.control "$extdir"/outbox_ext--*.sql
    as_root install -m 644 "$DIR/lib-$1"/outbox_ext.control "$DIR/lib-$1"/outbox_ext--*.sql "$extdir/"
    as_root install -m 755 "$DIR/lib-$1/outbox_ext.so" "$libdir/"
  }
  save_library current
  git worktree add --quiet --detach "$OLD_TREE" "$OLD_COMMIT"
  library_replaced=1
  # Built and installed by 0.1.0's own script.
  (cd "$OLD_TREE"; export CARGO_TARGET_DIR=$OLD_TARGET; . scripts/cluster.sh; install_extension)
  save_library 0.1.0
  # 0.1.0's claim and mark-sent statements (one table: outbox), as its workers ran them on the
  # default batch and lease, in one transaction per batch like claim_mark.sql.
  old_sql() { git show "$OLD_COMMIT:sql/$1" | grep -v '^ *--' | tr '\n' ' '; }
  printf 'DO $$DECLARE batch_ids bigint[]; BEGIN WITH claimed AS (%s) SELECT array_agg(claimed.id) INTO batch_ids FROM claimed; %s; END$$;\n' \
    "$(old_sql claim_batch.sql | sed -e 's/\$1/100/g' -e 's/\$2/30000/g')" "$(old_sql mark_sent.sql | sed -e 's/\$1/batch_ids/g')" > "$DIR/claim_mark-0.1.0.sql"
  # fresh_drain LIBRARY VERSION TABLE EVENT_ROWS CLAIM_MARK: in a new cluster, the drain
  # (fresh_rate), then the SQL-only ceiling of claim and mark-sent (fresh_sql_rate).
  fresh_drain() {
    use_library "$1"
    start_cluster "$DIR/pg-$1" "$PORT" "${CLUSTER_SETTINGS[@]}"
    psql_cluster -q -c "CREATE EXTENSION outbox_ext"
    [ "$(q "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'")" = "$2" ] ||
      { echo "bench: the cluster did not get outbox_ext $2" >&2; exit 1; }
    enqueue_drain_events
    drain "$3" "$URL"
    fresh_rate=$(rate "$DRAIN_EVENTS" "$drain_seconds")
    set_url ""
    q "TRUNCATE $3, outbox CASCADE" >/dev/null
    q "$4" >/dev/null
    q "VACUUM ANALYZE $3, outbox" >/dev/null
    t0=$(now); PGOPTIONS='-c jit=off' pgbench_tps -c2 -j2 -t1500 -f "$DIR/$5" >/dev/null; t1=$(now)
    fresh_sql_rate=$(rate "$(q "SELECT count(sent_at) FROM $3")" "$(elapsed "$t0" "$t1")")
    stop_cluster
  }
  rows_now="WITH event AS (INSERT INTO outbox (topic, payload) SELECT 'bench', '{\"n\": 1}' FROM generate_series(1, 300000) RETURNING id)
            INSERT INTO outbox_deliveries (event_id, endpoint) SELECT id, 'default' FROM event"
  rows_0_1_0="INSERT INTO outbox (topic, payload) SELECT 'bench', '{\"n\": 1}' FROM generate_series(1, 300000)"
  for round in 1 2 3; do
    fresh_drain current "$ext_version" outbox_deliveries "$rows_now" claim_mark.sql
    new_rates+=" $fresh_rate" new_sql_rates+=" $fresh_sql_rate"
    fresh_drain 0.1.0 0.1.0 outbox "$rows_0_1_0" claim_mark-0.1.0.sql
    old_rates+=" $fresh_rate" old_sql_rates+=" $fresh_sql_rate"
    echo "round $round: drain: this version $(echo "$new_rates" | awk '{ print $NF }'), 0.1.0 $fresh_rate events/s;" \
         "SQL-only: this version $(echo "$new_sql_rates" | awk '{ print $NF }'), 0.1.0 $fresh_sql_rate deliveries/s"
  done
  median3() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
  # shellcheck disable=SC2086 # one word per rate
  new_drain_rate=$(median3 $new_rates) old_drain_rate=$(median3 $old_rates)
  # shellcheck disable=SC2086 # one word per rate
  new_sql_rate=$(median3 $new_sql_rates) old_sql_rate=$(median3 $old_sql_rates)
  echo "medians: drain: this version $new_drain_rate, 0.1.0 $old_drain_rate events/s ($(percent "$new_drain_rate" "$old_drain_rate"));" \
       "SQL-only: this version $new_sql_rate, 0.1.0 $old_sql_rate deliveries/s ($(percent "$new_sql_rate" "$old_sql_rate"))"
  echo "== putting this version's library back"
  use_library current
  library_replaced=0
fi

drain_ratios="$(percent "$drain_rate" "$sql_drain") of SQL-only"
old_drain_result="not measured (BENCH_COMPARE_0_1_0=0)" old_sql_result=$old_drain_result
if [ -n "$old_drain_rate" ]; then
  old_drain_result="$new_drain_rate / $old_drain_rate events/s: $(percent "$new_drain_rate" "$old_drain_rate") of 0.1.0 (this version:$new_rates; 0.1.0:$old_rates)"
  old_sql_result="$new_sql_rate / $old_sql_rate deliveries/s: $(percent "$new_sql_rate" "$old_sql_rate") of 0.1.0 (this version:$new_sql_rates; 0.1.0:$old_sql_rates)"
fi
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
cat > bench/RESULTS.md <<EOF
# Benchmark results

Command: \`bench/run.sh\` (one run; all on 127.0.0.1). Recorded $(date -u +"%Y-%m-%d %H:%M UTC").

Machine: $(nproc) cores ($cpu), $mem, $(uname -sr), PostgreSQL $pg_version,
outbox_ext $ext_version with 2 workers, default settings
(batch_size 100, concurrency 128, synchronous_commit on). Receiver: nginx $(nginx -v 2>&1 | cut -d/ -f2) answering 204.

| measure | result | target |
|---|---|---|
| receiver alone (wrk, 32 connections) | $receiver_rps POST/s | — |
| plain INSERT into outbox (pgbench, 8 clients; median of 5 × 5 s), synchronous_commit on / off | $insert_on / $insert_off rows/s | — |
| \`outbox_enqueue\`, one endpoint, workers idle (same), on / off | $enqueue_on / $enqueue_off events/s ($enqueue_ratios of plain INSERT) | ≥ 85% |
| \`outbox_enqueue\`, three endpoints, workers idle (same), on / off | $enqueue3_on / $enqueue3_off events/s ($enqueue3_ratios of plain INSERT) | — |
| the event's row and one delivery row in one plain statement (same): the least a delivery row per endpoint costs | $two_rows_on / $two_rows_off events/s ($two_rows_ratios of plain INSERT) | — |
| SQL-only claim + mark sent, one endpoint (pgbench, 2 clients, batch 100) | $sql_drain deliveries/s | — |
| drain: $DRAIN_EVENTS events enqueued, then delivered to one endpoint | $drain_rate events/s ($drain_ratios) | ≥ 20,000; ≥ 45% of SQL-only |
| the same drain, this version / 0.1.0 (library of commit $OLD_COMMIT), each in a new cluster, alternating; medians of 3 | $old_drain_result | ≥ 90% of 0.1.0 |
| the SQL-only claim + mark sent after each of those drains, this version / 0.1.0 (their own statements): what each schema's statements reach | $old_sql_result | — |
| drain: $DRAIN_EVENTS events enqueued, then delivered to three endpoints | $fanout_rate deliveries/s | ≥ 15,000 |
| keep-up: enqueue rate, 8 producers, ${DURATION} s | $enqueue_tps/s ($ratio of plain INSERT) | ≥ 90% |
| keep-up: delivery rate | $delivery_rate/s | keeps pace |
| keep-up: backlog at the end | $backlog events ($backlog_seconds s of enqueue) | < 1 s |
| latency at 500 events/s with a second endpoint down, p50 / p99 / max | $p50 / $p99 / $pmax ms (endpoint down: $down_failures failed attempts) | ≤ 5 / ≤ 25 ms |
| claim of 100 deliveries: no history / $RETAINED_ROWS sent deliveries retained | $empty_ms / $full_ms ms (x$growth) | ≤ 1.2× |
| worker private memory (RssAnon) peak during the two drains | $peak_mib MiB | ≤ 64 MiB |

Latency runs from \`clock_timestamp()\` inside the enqueuing transaction (just before its
commit) to nginx's \`\$msec\` when the request arrived (millisecond resolution).
EOF
echo "== written to bench/RESULTS.md"
python3 scripts/readme-figures.py # the figures README.md and docs/performance.md quote, from it
cat bench/RESULTS.md
