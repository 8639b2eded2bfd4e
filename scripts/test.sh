#!/usr/bin/env bash
# Every test: unit tests of the pure parts, and end-to-end tests against a real cluster with
# the extension preloaded, real relay workers and a real receiver on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
# The parts below choose their major themselves (15 first).
unset OUTBOX_PG_MAJOR

# Released scripts are frozen: sql/released.sha256 holds the digest of each install and update
# script of a released version (a release adds their lines; from 0.3.0 on also
# sql/sql_install--X.Y.Z.sql, what that version's `outbox migrate` ran), every install script
# in sql/ must be listed, and none may change. (scripts/package.sh checks that the version being built,
# if released, still builds its frozen install script.)
for script in sql/outbox_ext--*.sql sql/sql_install--*.sql; do
  case "$script" in *--*--*) continue ;; esac
  grep -q " $script\$" sql/released.sha256 ||
    { echo "test: $script is not in sql/released.sha256: add its digest when releasing it" >&2; exit 1; }
done
sha256sum --quiet -c sql/released.sha256 ||
  { echo "test: a released script was edited; ship the change in a new version's update script instead" >&2; exit 1; }

# Each part says when it starts, minutes into the run: the whole stays under an hour on 2 cores.
phase() { echo "== test: $* ($((SECONDS / 60)) min in)"; }

phase "setup"
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
phase "the extension's tests on PostgreSQL 15"
RUST_TEST_THREADS=1 cargo pgrx test pg15 "${runas[@]}" --pgdata "$PGDATA_DIR" "$@"

# The fault-injection suite: crashes, restarts, shutdowns and receiver failures under load, with
# the relay workers and with `outbox relay` processes.
phase "the fault suite on PostgreSQL 15"
faults/run.sh

# The outbox binary against a real cluster: migrate as a role with only CREATE, doctor, and the
# relay on the SQL install.
phase "the outbox binary on PostgreSQL 15"
cli/test.sh

# The pull-consumer clients in Python, Node and Java, through the same scenarios.
phase "the clients on PostgreSQL 15"
clients/test.sh

# The framework examples (Django, SQLAlchemy, Flask, Knex, Express, Spring) against the SQL install.
phase "the framework examples on PostgreSQL 15"
examples/test.sh

# Alert rules under promtool, and the real Prometheus exporter scraped over 127.0.0.1.
phase "monitoring"
monitoring/test.sh

# The Debian package: built, installed on this machine, and the demo run against what it
# installed (not against a build of this checkout).
phase "the packages"
scripts/package.sh
deb=$(ls dist/postgresql-15-outbox-ext_*.deb)
as_root dpkg -i "$deb" >/dev/null
dpkg -S "$("$PG_BIN/pg_config" --pkglibdir)/outbox_ext.so" | grep -q '^postgresql-15-outbox-ext:' ||
  { echo "test: the installed library is not the package's" >&2; exit 1; }
OUTBOX_USE_INSTALLED=1 scripts/demo.sh

# The outbox binary's package: installed, its user made, its unit valid and hardened, and the
# installed binary the one built from this checkout.
deb=$(ls dist/outbox_*.deb)
as_root dpkg -i "$deb" >/dev/null
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

# Every other supported major (scripts/servers.sh pins each). 18, for which the extension
# builds: the whole suite again, ending with its package installed into 18's directories and the
# demo run against what it installed. 16 and 17, for which the extension is not built
# (docs/installation.md, "PostgreSQL majors"): the SQL install's suite (cli/tests without the
# tests that need the extension, the fault scenarios that kill a relay, stop the server and
# take the receiver away, the clients and the framework examples).
export OUTBOX_PG_MAJOR=18
. scripts/cluster.sh
phase "PostgreSQL 18: the whole suite"
install_released_scripts
mkdir -p "$PGDATA_DIR-18"
chown postgres "$PGDATA_DIR-18" 2>/dev/null || true
RUST_TEST_THREADS=1 cargo pgrx test pg18 "${runas[@]}" --pgdata "$PGDATA_DIR-18" "$@"
phase "PostgreSQL 18: the fault suite"
faults/run.sh
phase "PostgreSQL 18: the outbox binary, the clients, the framework examples"
cli/test.sh
clients/test.sh
examples/test.sh
phase "PostgreSQL 18: the extension's package"
tarball=$(ls dist/outbox_ext-*-pg18-*.tar.gz)
unpacked=$(mktemp -d /tmp/outbox-pg18.XXXXXX)
tar -xzf "$tarball" -C "$unpacked"
pg18_config=$(server_dir 18)/bin/pg_config
as_root install -m 755 "$unpacked"/outbox_ext-*/outbox_ext.so "$("$pg18_config" --pkglibdir)/"
as_root install -m 644 "$unpacked"/outbox_ext-*/extension/* "$("$pg18_config" --sharedir)/extension/"
cmp -s "$unpacked"/outbox_ext-*/outbox_ext.so "$("$pg18_config" --pkglibdir)/outbox_ext.so" ||
  { echo "test: the library in PostgreSQL 18's directory is not the package's" >&2; exit 1; }
rm -rf "$unpacked"
OUTBOX_USE_INSTALLED=1 scripts/demo.sh

for major in 16 17; do
  export OUTBOX_PG_MAJOR=$major
  phase "PostgreSQL $major: the SQL install's suite"
  cli/test.sh
  FAULT_MODE=relays FAULT_ONLY=kill_a_worker,immediate_stop,receiver_outage faults/run.sh
  clients/test.sh
  examples/test.sh
done
unset OUTBOX_PG_MAJOR

phase "the assembled update scripts"
# The update scripts ship as assembled (cargo pgrx install copies them from sql/): the
# committed ones must be what their sources give, which the tests above just ran.
if ! git diff --quiet -- 'sql/outbox_ext--*--*.sql'; then
  echo "test: sql/outbox_ext--*--*.sql differ from what sql/updates/ assembles to; commit them:" >&2
  git diff --stat -- 'sql/outbox_ext--*--*.sql' >&2
  exit 1
fi
