#!/usr/bin/env bash
# The framework examples (examples/), each run against a real cluster used as a managed server is (no
# library loaded, the outbox installed by `outbox migrate`, `outbox relay` beside it) and its outcome
# checked in the database: enqueues that commit and roll back, two webhook receivers behind the
# relay, a job handler on a pull endpoint. All on 127.0.0.1. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
cargo build --release -q -p outbox
OUTBOX=target/release/outbox

DIR=$(mktemp -d /tmp/outbox-examples.XXXXXX)
chmod 755 "$DIR"
PORT=15356
declare -A ports=([flask]=15357 [express]=15358) secrets=()
URL="postgresql://postgres@127.0.0.1:$PORT"
# Debian's Spring 4.3 (its jars keep the name spring3-*) and PostgreSQL's JDBC driver.
JAVA_CP=$(printf '/usr/share/java/%s.jar:' spring3-core spring3-beans spring3-transaction spring3-jdbc commons-logging postgresql)

pids=()
cleanup() {
  local status=$? pid log
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for log in "$DIR"/*.log; do
      [ -f "$log" ] && { echo "--- the end of $(basename "$log")"; tail -n 25 "$log"; }
    done >&2
  fi
  stop_cluster
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "examples: $*" >&2; exit 1; }
# q DB SQL: the result of one statement, unaligned, without headers.
q() { psql_cluster -d "$1" -tAq -c "$2"; }
# expect WHAT DB SQL EXPECTED
expect() {
  local actual
  actual=$(q "$2" "$3")
  [ "$actual" = "$4" ] || fail "$1: expected '$4', got '$actual'"
  echo "ok: $1"
}
# eventually WHAT DB SQL: waits until SQL returns true, 20 s at most.
eventually() {
  local deadline=$((SECONDS + 20))
  until [ "$(q "$2" "$3")" = t ]; do
    [ $SECONDS -lt $deadline ] || fail "$1: still not so after 20 s"
    sleep 0.1
  done
  echo "ok: $1"
}
# expect_line WHAT OUTPUT LINE: OUTPUT has LINE.
expect_line() { grep -qxF "$3" <<<"$2" || fail "$1: no line '$3' in: $2"; echo "ok: $1"; }
wait_for_port() {
  local deadline=$((SECONDS + 20))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "nothing listens on 127.0.0.1:$1"
    sleep 0.1
  done
}

start_cluster "$DIR/pg" "$PORT" "shared_preload_libraries = ''"
q postgres "CREATE DATABASE shop"
"$OUTBOX" migrate --database-url "$URL/shop" --schema outbox >"$DIR/migrate.log" 2>&1
q shop "CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, total numeric(10,2) NOT NULL,
                             created_at timestamptz NOT NULL DEFAULT now());
        CREATE TABLE receipts (id bigserial PRIMARY KEY, order_id bigint NOT NULL, total numeric(10,2) NOT NULL);
        CREATE TABLE receipt_lines (id bigserial PRIMARY KEY, receipt_id bigint NOT NULL REFERENCES receipts,
                                    description text NOT NULL, amount numeric(10,2) NOT NULL CHECK (amount > 0));"

echo "== enqueue in the business transaction: Django, SQLAlchemy, Knex, Spring"
# check_enqueue NAME OUTPUT: the committed order and its event (by the id the example got back) are
# there; the rolled-back order and event are not.
committed_orders=()
check_enqueue() {
  local name=$1 output=$2 order event
  [[ $output =~ committed\ order_id=([0-9]+)\ event_id=([0-9]+) ]] || fail "$name committed no order: $output"
  order=${BASH_REMATCH[1]} event=${BASH_REMATCH[2]}
  expect "$name: the committed order is saved" shop "SELECT count(*) FROM orders WHERE id = $order" 1
  expect "$name: its event has the id outbox_enqueue returned" shop \
    "SELECT topic || ' ' || (payload->>'order_id') FROM outbox.outbox WHERE id = $event" "order.placed $order"
  committed_orders+=("$order")
  [[ $output =~ rolled\ back\ order_id=([0-9]+)\ event_id=([0-9]+) ]] || fail "$name rolled back no order: $output"
  order=${BASH_REMATCH[1]} event=${BASH_REMATCH[2]}
  expect "$name: the rolled-back order is not saved" shop "SELECT count(*) FROM orders WHERE id = $order" 0
  expect "$name: nor its event" shop "SELECT count(*) FROM outbox.outbox WHERE id = $event" 0
}
output=$(DATABASE_URL="$URL/shop" python3 examples/python/django_enqueue.py)
check_enqueue Django "$output"
output=$(DATABASE_URL="$URL/shop" python3 examples/python/sqlalchemy_enqueue.py)
check_enqueue SQLAlchemy "$output"
output=$(DATABASE_URL="$URL/shop" node examples/node/knex_enqueue.js)
check_enqueue Knex "$output"
# -path: commons-logging's manifest names optional jars that Debian does not install; -serial: no
# exception here is ever serialized.
javac -Xlint:all,-path,-serial -Werror -d "$DIR/java" -cp "$JAVA_CP" examples/java/SpringEnqueue.java
output=$(JDBC_URL="jdbc:postgresql://127.0.0.1:$PORT/shop?user=postgres" java -cp "$DIR/java:$JAVA_CP" SpringEnqueue)
check_enqueue Spring "$output"

echo "== webhook receivers behind outbox relay: Flask, Express"
# start_receiver NAME PORT COMMAND...: the receiver's own database billing_NAME (its tables, and the
# outbox's SQL install for processed_events), its endpoint billing-NAME in shop with a secret that
# the database generates and returns once, and the receiver, given that secret in its environment.
start_receiver() {
  local name=$1 port=$2
  shift 2
  q postgres "CREATE DATABASE billing_$name"
  "$OUTBOX" migrate --database-url "$URL/billing_$name" --schema outbox >>"$DIR/migrate.log" 2>&1
  q "billing_$name" "CREATE TABLE balances (customer text PRIMARY KEY, total numeric(12,2) NOT NULL);
                     CREATE TABLE rejected_events (event_id bigint PRIMARY KEY, reason text NOT NULL,
                                                   received_at timestamptz NOT NULL DEFAULT now());"
  q shop "SELECT outbox.outbox_endpoint_set('billing-$name', 'http://127.0.0.1:$port/webhooks/outbox', '{order.*}')" >/dev/null
  secrets[$name]=$(q shop "SELECT outbox.outbox_endpoint_rotate_secret('billing-$name')")
  (export DATABASE_URL="$URL/billing_$name" WEBHOOK_SECRET="${secrets[$name]}" PORT="$port"; exec "$@") \
    >"$DIR/receiver-$name.log" 2>&1 &
  pids+=($!)
  wait_for_port "$port"
}
start_receiver flask "${ports[flask]}" python3 examples/python/receiver_flask.py
start_receiver express "${ports[express]}" node examples/node/receiver_express.js
"$OUTBOX" relay --database-url "$URL/shop" --listen-url "$URL/shop" --allowed-destinations 127.0.0.1/32 >"$DIR/relay.log" 2>&1 &
pids+=($!)

since=$(q shop "SELECT clock_timestamp()")
enqueue_order() {
  q shop "SELECT outbox.outbox_enqueue('order.placed', jsonb_build_object('order_id', $1, 'customer', '$2', 'total', '$3'))"
}
events="$(enqueue_order 1001 alice 10.00),$(enqueue_order 1002 alice 5.50)"
bob_event=$(enqueue_order 1003 bob 7.25)
poison=$(enqueue_order 1004 mallory lots) # a total no receiver will ever accept
events="$events,$bob_event,$poison"

# post_webhook PORT ID AGE BODY SECRET...: sends BODY as the relay would, for a timestamp AGE seconds
# ago, with one signature per SECRET; prints the answer's status.
post_webhook() {
  python3 - "$@" <<'PY'
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

from standardwebhooks.webhooks import Webhook

port, event_id, age, body, *secrets = sys.argv[1:]
timestamp = datetime.now(timezone.utc) - timedelta(seconds=int(age))
request = urllib.request.Request(
    f"http://127.0.0.1:{port}/webhooks/outbox", data=body.encode(), method="POST",
    headers={"content-type": "application/json", "webhook-id": event_id, "webhook-timestamp": str(int(timestamp.timestamp())),
             "webhook-signature": " ".join(Webhook(secret).sign(event_id, timestamp, body) for secret in secrets)})
try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as response:
        print(response.status)
except urllib.error.HTTPError as error:
    print(error.code)
PY
}
expect_status() {
  local status
  status=$(post_webhook "${@:3}")
  [ "$status" = "$2" ] || fail "$1: expected HTTP $2, got $status"
  echo "ok: $1"
}
other_secret="whsec_$(head -c 32 /dev/urandom | base64)" # not the endpoint's: signs the forged requests
direct_body='{"type": "order.placed", "timestamp": "2025-01-01T00:00:00Z", "data": {"order_id": 2001, "customer": "carol", "total": "1.00"}}'

for name in flask express; do
  db=billing_$name endpoint=billing-$name port=${ports[$name]}
  eventually "$name: every event delivered" shop \
    "SELECT count(*) = 4 FROM outbox.outbox_deliveries WHERE endpoint = '$endpoint' AND event_id IN ($events) AND sent_at IS NOT NULL"
  expect "$name: each event applied once" "$db" "SELECT string_agg(customer || '=' || total, ' ' ORDER BY customer) FROM balances" \
    "alice=15.50 bob=7.25"
  expect "$name: each recorded by its event id" "$db" \
    "SELECT count(*) FROM outbox.processed_events WHERE consumer = 'billing' AND event_id IN ($events)" 4
  expect "$name: the poison event recorded as rejected" "$db" "SELECT string_agg(event_id::text, ',') FROM rejected_events" "$poison"
  # xmin is the transaction that wrote a row's current version.
  expect "$name: each effect committed by the transaction that marked its event" "$db" \
    "SELECT count(*) FROM outbox.processed_events AS p
       JOIN (SELECT $bob_event AS event_id, xmin FROM balances WHERE customer = 'bob'
             UNION ALL SELECT event_id, xmin FROM rejected_events) AS effect USING (event_id)
      WHERE p.consumer = 'billing' AND p.xmin = effect.xmin" 2
  expect "$name: every answer a 2xx, the poison event's too (no failed attempt)" shop \
    "SELECT count(*) FROM outbox.outbox_attempts WHERE endpoint = '$endpoint'" 0

  replayed_at=$(q shop "SELECT clock_timestamp()")
  expect "$name: the events replayed" shop "SELECT outbox.outbox_replay('$endpoint', '$since')" 4
  eventually "$name: the re-deliveries answered with a 2xx" shop \
    "SELECT count(*) = 4 FROM outbox.outbox_deliveries WHERE endpoint = '$endpoint' AND sent_at >= '$replayed_at'"
  expect "$name: and not applied again" "$db" "SELECT string_agg(customer || '=' || total, ' ' ORDER BY customer) FROM balances" \
    "alice=15.50 bob=7.25"
  expect "$name: nor rejected again" "$db" "SELECT count(*) FROM rejected_events" 1
  expect "$name: no failed attempt after the replay either" shop "SELECT count(*) FROM outbox.outbox_attempts WHERE endpoint = '$endpoint'" 0

  expect_status "$name: a forged signature gets 401" 401 "$port" 900001 0 "$direct_body" "$other_secret"
  expect_status "$name: a stale timestamp gets 401" 401 "$port" 900002 600 "$direct_body" "${secrets[$name]}"
  expect "$name: and neither changes anything" "$db" \
    "SELECT (SELECT count(*) FROM outbox.processed_events WHERE event_id >= 900000) + (SELECT count(*) FROM balances WHERE customer = 'carol')" 0
  expect_status "$name: one valid signature among several gets 204" 204 "$port" 900003 0 "$direct_body" "$other_secret" "${secrets[$name]}"
  expect_status "$name: the same request again gets 204" 204 "$port" 900003 0 "$direct_body" "${secrets[$name]}"
  expect "$name: and was applied once" "$db" "SELECT total FROM balances WHERE customer = 'carol'" 1.00
done

echo "== a job handler on a pull endpoint: SQLAlchemy"
q shop "SELECT outbox.outbox_endpoint_set('receipts', NULL, '{receipt.requested}', kind => 'pull', max_attempts => 2)" >/dev/null
since=$(q shop "SELECT clock_timestamp()")
enqueue_job() { q shop "SELECT outbox.outbox_enqueue('receipt.requested', '$1')"; }
book_job=$(enqueue_job "{\"order_id\": ${committed_orders[0]}, \"lines\": [{\"description\": \"book\", \"amount\": \"12.50\"}, {\"description\": \"shipping\", \"amount\": \"4.90\"}]}")
lamp_job=$(enqueue_job "{\"order_id\": ${committed_orders[1]}, \"lines\": [{\"description\": \"lamp\", \"amount\": \"30.00\"}]}")
# A line the receipts table refuses (amount > 0), written after the receipt's own row.
refund_job=$(enqueue_job "{\"order_id\": ${committed_orders[2]}, \"lines\": [{\"description\": \"refund\", \"amount\": \"-5.00\"}]}")
receipts_are="${committed_orders[0]}=17.40 ${committed_orders[1]}=30.00"
run_jobs() { DATABASE_URL="$URL/shop" python3 examples/python/job_handler_sqlalchemy.py 2>>"$DIR/jobs.log"; }
# The deliveries acknowledged are exactly the events recorded as processed: ack and mark committed together.
acked_is_processed="SELECT (SELECT array_agg(event_id ORDER BY event_id) FROM outbox.outbox_deliveries
                             WHERE endpoint = 'receipts' AND sent_at IS NOT NULL)
                        IS NOT DISTINCT FROM
                           (SELECT array_agg(event_id ORDER BY event_id) FROM outbox.processed_events WHERE consumer = 'receipts')"

output=$(run_jobs)
expect_line "jobs: the book's receipt issued" "$output" "receipted $book_job"
expect_line "jobs: the lamp's receipt issued" "$output" "receipted $lamp_job"
expect_line "jobs: the refund's failed and nacked" "$output" "nacked $refund_job"
expect "jobs: one receipt per good job, none for the failed one" shop \
  "SELECT string_agg(order_id || '=' || total, ' ' ORDER BY order_id) FROM receipts" "$receipts_are"
expect "jobs: the failed job left no line either" shop "SELECT count(*) FROM receipt_lines" 3
expect "jobs: the good ones acked, the failed one nacked for a retry" shop \
  "SELECT string_agg(event_id || ':' || (sent_at IS NOT NULL) || ':' || attempts, ' ' ORDER BY event_id)
     FROM outbox.outbox_deliveries WHERE endpoint = 'receipts' AND dead_at IS NULL" "$book_job:true:1 $lamp_job:true:1 $refund_job:false:1"
expect "jobs: the failure recorded on the delivery" shop \
  "SELECT last_error LIKE '%receipt_lines_amount_check%' FROM outbox.outbox_deliveries WHERE endpoint = 'receipts' AND event_id = $refund_job" t
expect "jobs: acked = processed" shop "$acked_is_processed" t
expect "jobs: each receipt, its event's mark and the ack committed by one transaction" shop \
  "SELECT count(*) FROM outbox.outbox_deliveries AS d
     JOIN outbox.processed_events AS p ON p.consumer = 'receipts' AND p.event_id = d.event_id
     JOIN outbox.outbox AS o ON o.id = d.event_id
     JOIN receipts AS r ON r.order_id = (o.payload->>'order_id')::bigint
    WHERE d.endpoint = 'receipts' AND d.sent_at IS NOT NULL AND r.xmin = p.xmin AND d.xmin = p.xmin" 2

eventually "jobs: the failed job due again after its backoff" shop \
  "SELECT available_at <= now() FROM outbox.outbox_deliveries WHERE endpoint = 'receipts' AND event_id = $refund_job"
output=$(run_jobs)
expect_line "jobs: the retry failed too" "$output" "nacked $refund_job"
expect "jobs: dead at the endpoint's 2 attempts" shop \
  "SELECT attempts || ':' || (dead_at IS NOT NULL) FROM outbox.outbox_deliveries WHERE endpoint = 'receipts' AND event_id = $refund_job" "2:true"

replayed_at=$(q shop "SELECT clock_timestamp()")
expect "jobs: the jobs replayed" shop "SELECT outbox.outbox_replay('receipts', '$since')" 3
output=$(run_jobs)
expect_line "jobs: the book's job a duplicate" "$output" "duplicate $book_job"
expect_line "jobs: the lamp's job a duplicate" "$output" "duplicate $lamp_job"
expect "jobs: duplicates acked" shop \
  "SELECT count(*) FROM outbox.outbox_deliveries WHERE endpoint = 'receipts' AND event_id IN ($book_job, $lamp_job) AND sent_at >= '$replayed_at'" 2
expect "jobs: and not applied again" shop "SELECT string_agg(order_id || '=' || total, ' ' ORDER BY order_id) FROM receipts" "$receipts_are"
expect "jobs: acked = processed, after the replay too" shop "$acked_is_processed" t

echo "== examples: every check passed"
