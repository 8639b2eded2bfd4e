#!/usr/bin/env bash
# The main job, end to end: a throwaway cluster with outbox_ext preloaded, a receiver that
# checks signatures, orders placed in transactions (one rolled back), and the events arriving.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-demo.XXXXXX)
PORT=54329
RECEIVER_PORT=8787
SECRET="whsec_$(head -c 24 /dev/urandom | base64)"

cleanup() {
  stop_cluster
  [ -n "${RECEIVER_PID:-}" ] && kill "$RECEIVER_PID" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

python3 demo/receiver.py "$RECEIVER_PORT" "$SECRET" &
RECEIVER_PID=$!

echo "== starting PostgreSQL on 127.0.0.1:$PORT with 2 relay workers"
start_cluster "$DIR" "$PORT" \
  "outbox.workers = 2" \
  "outbox.webhook_url = 'http://127.0.0.1:$RECEIVER_PORT/events'" \
  "outbox.signing_secret = '$SECRET'"

psql_cluster -q <<'SQL'
CREATE EXTENSION outbox_ext;
CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text, total numeric);
SQL

echo "== placing orders: each order and its event in one transaction"
for customer in alice bob carol; do
  echo "placing an order for $customer"
  psql_cluster -q -o /dev/null <<SQL
BEGIN;
WITH o AS (INSERT INTO orders (customer, total) VALUES ('$customer', 42.50) RETURNING id, customer, total)
SELECT outbox_enqueue('order.placed', jsonb_build_object('order_id', id, 'customer', customer, 'total', total)) FROM o;
COMMIT;
SQL
done

echo "== an order that fails and rolls back: its event must never arrive"
psql_cluster -q -o /dev/null <<'SQL'
BEGIN;
WITH o AS (INSERT INTO orders (customer, total) VALUES ('mallory', 13.00) RETURNING id, customer)
SELECT outbox_enqueue('order.placed', jsonb_build_object('order_id', id, 'customer', customer)) FROM o;
ROLLBACK;
SQL

psql_cluster -q -c "SELECT outbox_enqueue('order.shipped', '{\"order_id\": 1}')" >/dev/null

deadline=$((SECONDS + 30))
until [ "$(psql_cluster -tA -c 'SELECT sent FROM outbox_stats()')" = 4 ]; do
  if [ $SECONDS -ge $deadline ]; then echo "events did not arrive within 30 s; server log:"; cat "$DIR/server.log"; exit 1; fi
  sleep 0.2
done

echo "== outbox_stats()"
psql_cluster -c "SELECT * FROM outbox_stats()"
echo "== the outbox table"
psql_cluster -c "SELECT id, topic, attempts, sent_at - created_at AS enqueue_to_ack, claimed_by FROM outbox ORDER BY id"
echo "== done: 4 committed events delivered and signed, the rolled-back order sent nothing"
