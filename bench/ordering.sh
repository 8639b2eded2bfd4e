#!/usr/bin/env bash
# The ordering benchmark: one run, written to bench/RESULTS-ordering.md. See bench/README.md.
# A throwaway cluster on 127.0.0.1 with outbox_ext preloaded (2 workers) and nginx answering
# 204, as bench/run.sh; the endpoint default, ordered or not, receives every event.
set -euo pipefail
cd "$(dirname "$0")/.."

EVENTS=${BENCH_EVENTS:-100000}
KEYS=${BENCH_KEYS:-1000}
BLOCKED=${BENCH_BLOCKED_KEYS:-100}
HOT_EVENTS=${BENCH_HOT_EVENTS:-3000}
DURATION=${BENCH_SECONDS:-20}
. bench/lib.sh

scripts/setup.sh nginx-light
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-bench-ordering.XXXXXX)
chmod 755 "$DIR"
PORT=15342
RECEIVER_PORT=8798
URL="http://127.0.0.1:$RECEIVER_PORT/events"
trap stop_and_remove EXIT
trap 'exit 130' INT TERM

start_receiver "$DIR" "$RECEIVER_PORT"
start_cluster "$DIR/pg" "$PORT" "outbox.workers = 2" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
psql_cluster -q -c "CREATE EXTENSION outbox_ext"

ordered() { # ordered true|false: the endpoint default, with its queue emptied
  set_url ""
  q "TRUNCATE outbox_attempts, outbox_deliveries, outbox, outbox_keys, outbox_key_arrivals;
     SELECT outbox_endpoint_set('default', NULL, ordered => $1)" >/dev/null
}
# enqueue_keyed COUNT KEYS [FIRST_KEY]: COUNT events, key i of KEYS in turn (k<FIRST_KEY+i>)
enqueue_keyed() {
  q "SELECT count(outbox_enqueue('bench', jsonb_build_object('n', n), 'k' || (${3:-0} + n % $2)))
       FROM generate_series(0, $1 - 1) n" >/dev/null
}
drain_keyed() { # drain_keyed ORDERED: the drain of EVENTS events over KEYS keys, in events/s
  ordered "$1"
  enqueue_keyed "$EVENTS" "$KEYS"
  drain outbox_deliveries "$URL"
  rate "$EVENTS" "$drain_seconds"
}

echo "== drain: $EVENTS events over $KEYS keys, unordered then ordered"
unordered_rate=$(drain_keyed false)
echo "unordered: $unordered_rate events/s"
ordered_rate=$(drain_keyed true)
echo "ordered: $ordered_rate events/s ($(percent "$ordered_rate" "$unordered_rate") of unordered)"

echo "== $BLOCKED of the $KEYS keys blocked by a dead head"
ordered true
# The blocked keys' first events, made their heads (as a claim would) and dead; then the same
# events as above behind them.
enqueue_keyed "$BLOCKED" "$BLOCKED"
q "SELECT outbox_sequence('default');
   UPDATE outbox_deliveries SET dead_at = now(), attempts = 10, last_error = 'bench'
    WHERE endpoint = 'default' AND NOT waiting" >/dev/null
enqueue_keyed "$EVENTS" "$KEYS"
free_events=$((EVENTS - EVENTS / KEYS * BLOCKED))
t0=$(now)
set_url "$URL"
wait_for "count(*) = $free_events FROM outbox_deliveries WHERE sent_at IS NOT NULL" 300
blocked_rate=$(rate "$free_events" "$(elapsed "$t0" "$(now)")")
read -r blocked_keys behind <<<"$(q "SELECT blocked_keys, waiting FROM outbox_endpoint_stats() WHERE endpoint = 'default'" | tr '|' ' ')"
echo "the other keys: $blocked_rate events/s ($(percent "$blocked_rate" "$ordered_rate") of the unblocked ordered drain); stats: $blocked_keys blocked keys, $behind waiting"

echo "== one hot key: $HOT_EVENTS events, one at a time"
ordered true
enqueue_keyed "$HOT_EVENTS" 1
drain outbox_deliveries "$URL"
hot_rate=$(rate "$HOT_EVENTS" "$drain_seconds")
echo "hot key drain: $hot_rate events/s"

echo "== one hot key at 100 events/s for ${DURATION}s: commit to receipt"
ordered true
set_url "$URL"
cat > "$DIR/latency.sql" <<'SQL'
SELECT outbox_enqueue('latency', jsonb_build_object('t', extract(epoch FROM clock_timestamp())), 'hot');
SQL
: > "$DIR/deliveries.log"
PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres pgbench -n -c1 -R100 -T"$DURATION" -f "$DIR/latency.sql" postgres >/dev/null 2>&1
wait_for "count(*) = count(sent_at) FROM outbox_deliveries" 60
latency_events=$(q "SELECT count(*) FROM outbox_deliveries")
read -r p50 p99 pmax <<<"$(receipt_latency "$DIR/deliveries.log" default "$latency_events")"
echo "hot key latency over $latency_events events: p50 $p50 ms, p99 $p99 ms, max $pmax ms"

cat > bench/RESULTS-ordering.md <<RESULTS
# Ordering benchmark results

Command: \`bench/ordering.sh\` (one run; all on 127.0.0.1). Recorded $(date -u +"%Y-%m-%d %H:%M UTC").

Machine: $(nproc) cores, PostgreSQL $(q "SHOW server_version" | cut -d' ' -f1), outbox_ext $(q "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'"),
2 workers, default settings (batch_size 100, concurrency 128). Receiver: nginx answering 204.

| measure | result | target |
|---|---|---|
| drain of $EVENTS events over $KEYS keys, endpoint not ordered | $unordered_rate events/s | — |
| the same, endpoint ordered | $ordered_rate events/s ($(percent "$ordered_rate" "$unordered_rate") of unordered) | ≥ 50% of unordered |
| the same with $BLOCKED keys blocked by a dead head: the other keys' events | $blocked_rate events/s ($(percent "$blocked_rate" "$ordered_rate") of the ordered drain; stats showed $blocked_keys blocked keys, $behind waiting) | ≥ 80% |
| one hot key, $HOT_EVENTS events enqueued, then delivered one at a time | $hot_rate events/s | reported |
| one hot key at 100 events/s, commit to receipt, p50 / p99 / max | $p50 / $p99 / $pmax ms | reported |
RESULTS
echo "== written to bench/RESULTS-ordering.md"
cat bench/RESULTS-ordering.md
