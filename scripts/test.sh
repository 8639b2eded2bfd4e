#!/usr/bin/env bash
# Every test: unit tests of the pure parts, and end-to-end tests against a real cluster with
# the extension preloaded, real relay workers and a real receiver on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

# Released scripts are frozen: sql/released.sha256 holds the digest of each install and update
# script of a released version (a release adds their lines), every install script in sql/
# must be listed, and none may change. (scripts/package.sh checks that the version being built,
# if released, still builds its frozen install script.)
for script in sql/outbox_ext--*.sql; do
  case "$script" in *--*--*) continue ;; esac
  grep -q " $script\$" sql/released.sha256 ||
    { echo "test: $script is not in sql/released.sha256: add its digest when releasing it" >&2; exit 1; }
done
sha256sum --quiet -c sql/released.sha256 ||
  { echo "test: a released script was edited; ship the change in a new version's update script instead" >&2; exit 1; }

scripts/setup.sh

# The code's habits: formatted as rustfmt.toml says, and no clippy warning.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The docs: every Markdown link and anchor resolves; the quoted figures are bench/RESULTS.md's.
python3 scripts/check-links.py --self-test
python3 scripts/check-links.py
python3 scripts/readme-figures.py --check

# The relay's core (core/, no pgrx) and the outbox binary (cli/): their unit and property tests
# need no PostgreSQL.
cargo test -p outbox_core
cargo test -p outbox --bins

. scripts/cluster.sh
install_released_scripts
assemble_update_scripts

# PostgreSQL refuses to run as root, so the test cluster runs as the postgres OS user, in a
# directory that user can write. pgrx creates the cluster and removes it afterwards.
PGDATA_DIR=${OUTBOX_TEST_PGDATA:-/tmp/outbox_ext-test-pgdata}
mkdir -p "$PGDATA_DIR"
chown postgres "$PGDATA_DIR" 2>/dev/null || true

runas=()
[ "$(id -un)" = postgres ] || runas=(--runas postgres)
# One test at a time: the end-to-end tests share one cluster, and some of them move the
# extension (DROP / CREATE EXTENSION) while no other test may use it.
RUST_TEST_THREADS=1 cargo pgrx test pg15 "${runas[@]}" --pgdata "$PGDATA_DIR" "$@"

# The fault-injection suite: crashes, restarts, shutdowns and receiver failures under load, with
# the relay workers and with `outbox relay` processes.
faults/run.sh

# The outbox binary against a real cluster: migrate as a role with only CREATE, doctor, and the
# relay on the SQL install.
cli/test.sh

# The pull-consumer clients in Python, Node and Java, through the same scenarios.
clients/test.sh

# The framework examples (Django, SQLAlchemy, Flask, Knex, Express, Spring) against the SQL install.
examples/test.sh

# Alert rules under promtool, and the real Prometheus exporter scraped over 127.0.0.1.
monitoring/test.sh

# The Debian package: built, installed on this machine, and the demo run against what it
# installed (not against a build of this checkout).
scripts/package.sh
deb=$(ls dist/postgresql-15-outbox-ext_*.deb)
if [ "$(id -u)" = 0 ]; then dpkg -i "$deb" >/dev/null; else sudo dpkg -i "$deb" >/dev/null; fi
dpkg -S "$("$PG_BIN/pg_config" --pkglibdir)/outbox_ext.so" | grep -q '^postgresql-15-outbox-ext:' ||
  { echo "test: the installed library is not the package's" >&2; exit 1; }
OUTBOX_USE_INSTALLED=1 scripts/demo.sh

# The outbox binary's package: installed, its user made, its unit valid and hardened, and the
# installed binary the one built from this checkout.
deb=$(ls dist/outbox_*.deb)
if [ "$(id -u)" = 0 ]; then dpkg -i "$deb" >/dev/null; else sudo dpkg -i "$deb" >/dev/null; fi
/usr/bin/outbox version | grep -x >/dev/null "outbox $(awk -F'"' '/^version *=/ { print $2; exit }' cli/Cargo.toml)" ||
  { echo "test: the installed outbox is not this version" >&2; exit 1; }
getent passwd outbox >/dev/null || { echo "test: the package did not make the outbox user" >&2; exit 1; }
[ "$(stat -c '%U:%G %a' /etc/outbox/relay.conf)" = "root:outbox 640" ] ||
  { echo "test: /etc/outbox/relay.conf is not root:outbox 640" >&2; exit 1; }
systemd-analyze verify /lib/systemd/system/outbox-relay.service
for hardening in User=outbox NoNewPrivileges=yes ProtectSystem=strict CapabilityBoundingSet=; do
  grep -qx "$hardening" /lib/systemd/system/outbox-relay.service ||
    { echo "test: outbox-relay.service lacks $hardening" >&2; exit 1; }
done
# And `cargo install` from the checkout, as the README says (the release build above is reused).
install_root=$(mktemp -d /tmp/outbox-install.XXXXXX)
cargo install --quiet --locked --path cli --root "$install_root" --target-dir target
"$install_root/bin/outbox" version | grep "^outbox " >/dev/null || { echo "test: cargo install gave no working outbox" >&2; exit 1; }
rm -rf "$install_root"

# The update scripts ship as assembled (cargo pgrx install copies them from sql/): the
# committed ones must be what their sources give, which the tests above just ran.
if ! git diff --quiet -- 'sql/outbox_ext--*--*.sql'; then
  echo "test: sql/outbox_ext--*--*.sql differ from what sql/updates/ assembles to; commit them:" >&2
  git diff --stat -- 'sql/outbox_ext--*--*.sql' >&2
  exit 1
fi
