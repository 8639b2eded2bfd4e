#!/usr/bin/env bash
# The pull-consumer benchmark: one run, written to bench/RESULTS-pull.md. See bench/README.md.
# A throwaway cluster on 127.0.0.1 with outbox_ext preloaded; pgbench and the three clients
# (clients/) as the consumers; every ratio is to what the machine does in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_SECONDS:-10}
JOBS=${BENCH_JOBS:-20000}

scripts/setup.sh
. scripts/cluster.sh
install_extension
clients/java/build.sh >/dev/null

DIR=$(mktemp -d /tmp/outbox-bench-pull.XXXXXX)
chmod 755 "$DIR"
PORT=15341
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 1" "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
psql_cluster -q >/dev/null <<'SQL'
CREATE EXTENSION outbox_ext;
SELECT outbox_endpoint_drop('default');
SELECT outbox_endpoint_set('jobs', NULL, '{job.*}', kind => 'pull');
CREATE TABLE commits (n integer);
CREATE TABLE client_effects (event_id bigint, worker text, applied_at timestamptz DEFAULT now());
CREATE SEQUENCE bench_job_ids;
SQL
export DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres"

. bench/lib.sh
# Pending jobs, written directly (the enqueue is measured by bench/run.sh).
fill() {
  q "TRUNCATE outbox_attempts, outbox_deliveries, outbox, processed_events, client_effects" >/dev/null
  q "WITH e AS (INSERT INTO outbox (topic, payload) SELECT 'job.x', '{}' FROM generate_series(1, $1) RETURNING id)
     INSERT INTO outbox_deliveries (event_id, endpoint) SELECT id, 'jobs' FROM e" >/dev/null
  q "VACUUM ANALYZE outbox, outbox_deliveries" >/dev/null
}
sent() { q "SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NOT NULL"; }

# The bare ceiling: one statement takes 100 pending deliveries, as a claim does, and marks them
# sent. What PostgreSQL does with no round trip, no lease and no fencing.
cat > "$DIR/bare.sql" <<'SQL'
WITH c AS (SELECT ctid FROM outbox_deliveries
            WHERE endpoint = 'jobs' AND sent_at IS NULL AND dead_at IS NULL AND NOT waiting AND available_at <= now()
            ORDER BY available_at, event_id LIMIT 100 FOR UPDATE SKIP LOCKED)
UPDATE outbox_deliveries SET sent_at = now() WHERE ctid = ANY (ARRAY(SELECT ctid FROM c));
SQL
# A consumer over SQL: claim 100 (autocommit), then ack the 100 it got in one call.
cat > "$DIR/claim_ack.sql" <<'SQL'
SELECT coalesce(array_agg(event_id), '{}') AS ids, coalesce(array_agg(attempt), '{}') AS attempts FROM outbox_claim('jobs', 100) \gset
SELECT count(*) FROM outbox_ack_batch('jobs', ':ids'::bigint[], ':attempts'::integer[]);
SQL
cat > "$DIR/commit.sql" <<'SQL'
INSERT INTO commits (n) VALUES (1);
SQL

echo "== SQL only (4 pgbench clients, batches of 100)"
fill 1000000
t0=$(now); pgbench_tps -c4 -j2 -t500 -f "$DIR/bare.sql" >/dev/null; t1=$(now)
bare=$(rate "$(sent)" "$(elapsed "$t0" "$t1")")
echo "bare claim+mark: $bare jobs/s"
fill 1000000
t0=$(now); pgbench_tps -c4 -j2 -t500 -f "$DIR/claim_ack.sql" >/dev/null; t1=$(now)
claim_ack=$(rate "$(sent)" "$(elapsed "$t0" "$t1")")
echo "outbox_claim 100 + outbox_ack_batch of 100: $claim_ack jobs/s ($(percent "$claim_ack" "$bare") of bare)"

echo "== enqueue of a job, pull endpoint with notify off / on (pgbench, 8 clients, median of 5 x 5 s)"
cat > "$DIR/enqueue.sql" <<'SQL'
SELECT outbox_enqueue('job.x', '{"order_id": 1}');
SQL
declare -A runs=()
for round in 1 2 3 4 5; do
  for notify in false true; do
    q "TRUNCATE outbox_attempts, outbox_deliveries, outbox; SELECT outbox_endpoint_set('jobs', NULL, '{job.*}', kind => 'pull', notify => $notify)" >/dev/null
    runs[$notify]+=" $(pgbench_tps -c8 -j2 -T5 -f "$DIR/enqueue.sql")"
  done
done
median5() { printf '%s\n' "$@" | sort -n | sed -n 3p; }
quiet=$(median5 ${runs[false]}) loud=$(median5 ${runs[true]})
q "SELECT outbox_endpoint_set('jobs', NULL, '{job.*}', kind => 'pull')" >/dev/null
echo "enqueue: notify off${runs[false]}; on${runs[true]}: medians $quiet / $loud events/s ($(percent "$loud" "$quiet"))"

echo "== one-row commits (pgbench, 8 clients, ${DURATION}s)"
commit_rate=$(pgbench_tps -c8 -j2 -T"$DURATION" -f "$DIR/commit.sql")
echo "plain one-row commit: $commit_rate/s"

# What the clients' jobs cost the database alone: each pgbench transaction is a client's job
# (the same four statements, the handler doing nothing) over jobs claimed beforehand, in id
# order from a sequence, with no client code and no claim in between.
cat > "$DIR/job.sql" <<'SQL'
BEGIN;
SELECT outbox_mark_processed(nextval('bench_job_ids'), 'jobs');
SELECT outbox_ack('jobs', currval('bench_job_ids'), 1);
COMMIT;
SQL
echo "== a client's job transaction alone (pgbench, 8 clients, ${DURATION}s)"
fill 200000
q "DO \$\$ BEGIN FOR batch IN 1..200 LOOP PERFORM outbox_claim('jobs', 1000, '1 hour'); END LOOP; END \$\$;
   SELECT setval('bench_job_ids', min(event_id), false) FROM outbox_deliveries" >/dev/null
job_rate=$(pgbench_tps -c8 -j2 -T"$DURATION" -M prepared -f "$DIR/job.sql")
[ "$(sent)" -lt 200000 ] || { echo "bench: the job step ran out of claimed jobs; claim more" >&2; exit 1; }
echo "job transaction alone: $job_rate/s ($(percent "$job_rate" "$commit_rate") of one-row commits)"

# A client's worker with 8 handlers whose handler does nothing: each job is its own
# transaction (outbox_mark_processed + outbox_ack), as a real consumer's would be.
drain_client() { # drain_client NAME COMMAND...
  local name=$1 t0 t1 pid deadline
  shift
  fill "$JOBS"
  t0=$(now)
  OUTBOX_ENDPOINT=jobs WORKER_NAME=$name HANDLERS=8 LEASE='30 seconds' POLL_MS=50 GRACE_MS=5000 BEHAVIOUR=none \
    "$@" work >/dev/null &
  pid=$!
  deadline=$((SECONDS + 300))
  until [ "$(sent)" = "$JOBS" ]; do
    [ $SECONDS -lt $deadline ] || { kill $pid; echo "bench: $name did not drain" >&2; exit 1; }
    sleep 0.05
  done
  t1=$(now)
  kill -TERM $pid; wait $pid || true
  client_rate=$(rate "$JOBS" "$(elapsed "$t0" "$t1")")
  echo "$name client, 8 handlers: $client_rate jobs/s ($(percent "$client_rate" "$commit_rate") of one-row commits)"
}
drain_client python python3 clients/python/example.py; python_rate=$client_rate
drain_client node node clients/node/example.js; node_rate=$client_rate
drain_client java java -cp clients/java/build:/usr/share/java/postgresql.jar outbox.Example; java_rate=$client_rate

pg_version=$(q "SHOW server_version" | cut -d' ' -f1)
cat > bench/RESULTS-pull.md <<EOF
# Pull consumer benchmark results

Command: \`bench/pull.sh\` (one run; all on 127.0.0.1). Recorded $(date -u '+%Y-%m-%d %H:%M') UTC.

Machine: $(nproc) cores, PostgreSQL $pg_version, outbox_ext $(q "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'"),
synchronous_commit on. One pull endpoint, \`jobs\`; jobs written directly as pending deliveries.

| measure | result | target |
|---|---|---|
| bare claim + mark sent in one statement (pgbench, 4 clients, 100 per statement) | $bare jobs/s | — |
| \`outbox_claim\` 100, then \`outbox_ack_batch\` of the 100 (pgbench, 4 clients) | $claim_ack jobs/s ($(percent "$claim_ack" "$bare") of bare) | ≥ 20,000; ≥ 50% of bare |
| \`outbox_enqueue\` of a job, endpoint with \`notify\` off / on (pgbench, 8 clients, median of 5 × 5 s) | $quiet / $loud events/s (on = $(percent "$loud" "$quiet") of off) | opt-in if it costs > 10% |
| plain one-row INSERT commits (pgbench, 8 clients) | $commit_rate/s | — |
| a client's job transaction alone: \`outbox_mark_processed\` + \`outbox_ack\` over claimed jobs (pgbench, 8 clients) | $job_rate/s ($(percent "$job_rate" "$commit_rate") of one-row commits) | — |
| Python client (clients/python), 8 handlers, handler does nothing | $python_rate jobs/s ($(percent "$python_rate" "$commit_rate") of one-row commits) | ≥ 50% |
| Node client (clients/node), same | $node_rate jobs/s ($(percent "$node_rate" "$commit_rate") of one-row commits) | reported |
| Java client (clients/java), same | $java_rate jobs/s ($(percent "$java_rate" "$commit_rate") of one-row commits) | reported |

Each client job is one transaction of its own (\`outbox_mark_processed\` and \`outbox_ack\`,
committed together), after claims of up to 8 (the free handlers) at a time: $JOBS jobs drained.
EOF
echo "wrote bench/RESULTS-pull.md"
