#!/usr/bin/env bash
# Log mode's enqueue: what it costs the producer's transaction, against a plain INSERT of the
# event row and table mode's outbox_enqueue, beside the design not chosen (a logical message),
# and how fast a logical slot hands the log back. Written to bench/RESULTS-log-mode.md. See
# bench/README.md. One cluster on 127.0.0.1 with wal_level = logical and the library loaded with
# no workers: the SQL install by `outbox migrate` into two databases and the extension into two
# more, one of each in log mode; pgbench, 8 clients, one event per transaction, five
# interleaved rounds of 5 s per design and commit setting, each figure the median of its five.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${BENCH_SECONDS:-5}
DECODED=${BENCH_DECODED_MESSAGES:-200000}
scripts/setup.sh
. scripts/cluster.sh
. bench/lib.sh
install_extension
cargo build --release -q -p outbox

DIR=$(mktemp -d /tmp/outbox-bench-log.XXXXXX)
chmod 755 "$DIR"
PORT=15344
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 0" "wal_level = logical" "max_wal_size = '4GB'"
DATABASES=(postgres logmode ext ext_log)
for database in "${DATABASES[@]:1}"; do q "CREATE DATABASE $database" >/dev/null; done
for database in postgres logmode; do
  target/release/outbox migrate --database-url "postgres://postgres@127.0.0.1:$PORT/$database" 2>/dev/null
done
# The extension in the same schema as the SQL install's, so that the same statements run.
for database in ext ext_log; do
  psql_cluster -d "$database" -tAq -c "CREATE SCHEMA outbox; CREATE EXTENSION outbox_ext SCHEMA outbox" >/dev/null
done
for database in "${DATABASES[@]}"; do
  psql_cluster -d "$database" -tAq -c "SELECT outbox.outbox_endpoint_set('default', 'http://127.0.0.1:9/', '{*}')" >/dev/null
done
# Log mode (no relay reads it here): each enqueue writes one row into outbox_log.
for database in logmode ext_log; do psql_cluster -d "$database" -tAq -c "SELECT outbox.outbox_set_mode('log')" >/dev/null; done

PAYLOAD='{"order_id": 1, "total": 42.5}'
cat > "$DIR/insert.sql" <<SQL
INSERT INTO outbox.outbox (topic, payload) VALUES ('order.placed', '$PAYLOAD');
SQL
cat > "$DIR/enqueue.sql" <<SQL
SELECT outbox.outbox_enqueue('order.placed', '$PAYLOAD');
SQL
# The append-only row alone, as log mode writes it: hourly partitions, no index, no update. This
# and the two functions below run in the SQL install's log-mode database, where outbox_log has
# its hourly partitions made (in table mode every row would go to its default partition).
cat > "$DIR/partition.sql" <<SQL
INSERT INTO outbox.outbox_log (id, topic, payload) VALUES (nextval('outbox.outbox_id_seq'), 'order.placed', '$PAYLOAD');
SQL
# That INSERT alone in a PL/pgSQL function, its plan kept: no checks, no mode, no defaults.
psql_cluster -d logmode -tAq -c "CREATE FUNCTION public.insert_logged(topic text, payload jsonb) RETURNS bigint LANGUAGE plpgsql AS \$\$
  DECLARE id bigint;
  BEGIN
    INSERT INTO outbox.outbox_log (id, topic, payload) VALUES (nextval('outbox.outbox_id_seq'), topic, payload) RETURNING outbox_log.id INTO id;
    RETURN id;
  END \$\$" >/dev/null
cat > "$DIR/function.sql" <<SQL
SELECT public.insert_logged('order.placed', '$PAYLOAD');
SQL
# The same with outbox_enqueue's signature (a call that leaves key and deliver_at out has their
# defaults read from the catalog when it is parsed) and the mode read in the INSERT, as
# outbox_enqueue must (a switch back to table mode relies on it): the ceiling of an enqueue
# with the contract's signature that chooses its mode in SQL. In a log-mode database.
psql_cluster -d logmode -tAq -c "CREATE FUNCTION public.insert_logged_in_mode(topic text, payload jsonb, key text DEFAULT NULL, deliver_at timestamptz DEFAULT NULL)
  RETURNS bigint LANGUAGE plpgsql AS \$\$
  DECLARE id bigint;
  BEGIN
    INSERT INTO outbox.outbox_log (id, topic, payload, key)
    SELECT nextval('outbox.outbox_id_seq'), topic, payload, key FROM outbox.outbox_log_state AS s WHERE s.enabled AND deliver_at IS NULL
    RETURNING outbox_log.id INTO id;
    RETURN id;
  END \$\$" >/dev/null
cat > "$DIR/function_mode.sql" <<SQL
SELECT public.insert_logged_in_mode('order.placed', '$PAYLOAD');
SQL
for design in enqueue_log ext_enqueue ext_enqueue_log; do cp "$DIR/enqueue.sql" "$DIR/$design.sql"; done
# A logical message carries the event whole; transactional, so a rollback writes nothing a
# decoder ever returns. With its id from the outbox's sequence, and without (the message's LSN
# would be the id).
cat > "$DIR/message.sql" <<SQL
SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', nextval('outbox.outbox_id_seq'), 'topic', 'order.placed', 'payload', '$PAYLOAD'::jsonb)::text);
SQL
cat > "$DIR/message_lsn.sql" <<SQL
SELECT pg_logical_emit_message(true, 'outbox', json_build_object('topic', 'order.placed', 'payload', '$PAYLOAD'::jsonb)::text);
SQL
DESIGNS=(insert enqueue enqueue_log ext_enqueue ext_enqueue_log partition function function_mode message message_lsn)

empty_tables() {
  # Its own variable: measure's is the database it is about to run in.
  local database
  for database in "${DATABASES[@]}"; do
    psql_cluster -d "$database" -tAq -c "TRUNCATE outbox.outbox, outbox.outbox_deliveries, outbox.outbox_attempts, outbox.outbox_log" >/dev/null
  done
  q "CHECKPOINT" >/dev/null
}
declare -A runs=()
measure() { # measure DESIGN SYNCHRONOUS_COMMIT
  local database=postgres
  case $1 in enqueue_log | partition | function | function_mode) database=logmode ;; ext_enqueue) database=ext ;; ext_enqueue_log) database=ext_log ;; esac
  empty_tables
  runs[$1-$2]+=" $(PGOPTIONS="-c synchronous_commit=$2" PGHOST=127.0.0.1 PGPORT=$CLUSTER_PORT PGUSER=postgres \
    pgbench -n -c8 -j2 -T"$SECONDS_PER_RUN" -f "$DIR/$1.sql" "$database" 2>&1 | awk '/^tps = / { printf "%.0f", $3 }')"
}
median5() { printf '%s\n' "$@" | sort -n | sed -n 3p; }

pgbench_tps -c8 -j2 -T5 -f "$DIR/insert.sql" >/dev/null # warm-up: the new cluster's first WAL segments
for round in 1 2 3 4 5; do
  echo "bench: round $round of 5"
  for commit in off on; do
    for design in "${DESIGNS[@]}"; do measure "$design" "$commit"; done
  done
done

echo "bench: $DECODED messages for a logical slot to read back"
empty_tables
q "CREATE PUBLICATION outbox_bench_messages" >/dev/null
q "SELECT pg_create_logical_replication_slot('outbox_bench', 'pgoutput')" >/dev/null
PGOPTIONS="-c synchronous_commit=off" pgbench_tps -c8 -j2 -t$((DECODED / 8)) -f "$DIR/message.sql" >/dev/null
t0=$(now)
decoded=$(q "SELECT count(*) FROM pg_logical_slot_get_binary_changes('outbox_bench', NULL, NULL,
               'proto_version', '1', 'publication_names', 'outbox_bench_messages', 'messages', 'true')
             WHERE substr(data, 1, 1) = 'M'")
t1=$(now)
decode_rate=$(rate "$decoded" "$(elapsed "$t0" "$t1")")
q "SELECT pg_drop_replication_slot('outbox_bench')" >/dev/null

out=bench/RESULTS-log-mode.md
row() { # row LABEL DESIGN
  local off on
  off=$(median5 ${runs[$2-off]}) on=$(median5 ${runs[$2-on]})
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$off" "$(percent "$off" "$insert_off")" "$on" "$(percent "$on" "$insert_on")"
}
insert_off=$(median5 ${runs[insert-off]}) insert_on=$(median5 ${runs[insert-on]})
{
  echo "# Log mode: what an enqueue costs"
  echo
  echo "\`bench/log-enqueue.sh\`, $(date -u +%Y-%m-%d), on $(nproc) cores, PostgreSQL $(q "SHOW server_version" | cut -d' ' -f1) with"
  echo "\`wal_level = logical\`: pgbench, 8 clients, one event per transaction, no relay (the library"
  echo "loaded with no workers). Five interleaved rounds of ${SECONDS_PER_RUN} s per design and setting; each figure is the"
  echo "median of its five, in events per second, and the ratio is to the plain INSERT at the same"
  echo "\`synchronous_commit\`."
  echo
  echo "| design | commit off (CPU-bound) | of INSERT | commit on | of INSERT |"
  echo "|---|---|---|---|---|"
  row "plain INSERT of the event row into \`outbox\` (the baseline)" insert
  row "\`outbox_enqueue\`, table mode, one endpoint (SQL install)" enqueue
  row "\`outbox_enqueue\`, log mode (SQL install)" enqueue_log
  row "\`outbox_enqueue\`, table mode, one endpoint (extension)" ext_enqueue
  row "\`outbox_enqueue\`, log mode (extension)" ext_enqueue_log
  row "the append-only row alone: INSERT into \`outbox_log\`, id from the sequence" partition
  row "that INSERT alone in a PL/pgSQL function (no checks, no mode)" function
  row "that function with \`outbox_enqueue\`'s signature and the mode read in its INSERT (no checks)" function_mode
  row "logical message with the event, id from the sequence" message
  row "logical message with the event, its LSN as the id" message_lsn
  echo
  echo "A logical slot (pgoutput, messages on) read back $decoded messages at $decode_rate messages/s"
  echo "(\`pg_logical_slot_get_binary_changes\`, one call)."
  echo
  echo "Rounds (events/s):"
  echo
  for commit in off on; do
    for design in "${DESIGNS[@]}"; do echo "- $design, commit $commit:${runs[$design-$commit]}"; done
  done
} > "$out"
python3 scripts/readme-figures.py # the README quotes its enqueue figures
cat "$out"
