#!/usr/bin/env bash
# The outbox binary's end-to-end tests (cli/tests/): a cluster of their own with the extension's
# library installed (some tests compare the SQL install with it, or refuse it) and no relay
# workers; each test makes its own database and roles.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/cluster.sh
install_extension

DIR=$(mktemp -d /tmp/outbox-cli.XXXXXX)
chmod 755 "$DIR"
PORT=15360
cleanup() { stop_cluster; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start_cluster "$DIR/pg" "$PORT" "outbox.workers = 0"
# One at a time: a test's relay must not deliver another test's events.
OUTBOX_TEST_URL="postgres://postgres@127.0.0.1:$PORT/postgres" cargo test -q -p outbox --test '*' -- --test-threads=1 "$@"
