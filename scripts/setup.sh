#!/usr/bin/env bash
# Installs everything the demo, the tests and the benchmark need on a fresh Debian 12 machine;
# extra Debian packages can be named as arguments. Idempotent: each step checks before it acts,
# so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_MAJOR=15
PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
APT_PACKAGES=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libclang-dev clang pkg-config libssl-dev sudo unzip patchelf
              libpostgresql-jdbc-java openjdk-17-jdk-headless pgbouncer chromium
              libspring-jdbc-java libspring-transaction-java "$@")

. scripts/servers.sh # as_root, and the servers of the other majors

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  echo "setup: installing cargo-pgrx $PGRX_VERSION (a few minutes, once)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# The other supported majors, pinned by exact version (scripts/servers.sh); a server that
# cannot be fetched stops the setup here, with the reason.
for major in "${SERVER_MAJORS[@]}" 18-tls; do
  install_server "$major"
done

# pgrx builds and tests the extension for each major whose server has its headers: 15
# (Debian's) and 18.
PG18_CONFIG=$(server_dir 18)/bin/pg_config
PGRX_HOME=${PGRX_HOME:-$HOME/.pgrx}
if ! grep -qs "^pg$PG_MAJOR = \"$PG_CONFIG\"" "$PGRX_HOME/config.toml" ||
   ! grep -qs "^pg18 = \"$PG18_CONFIG\"" "$PGRX_HOME/config.toml"; then
  echo "setup: pointing pgrx at PostgreSQL $PG_MAJOR (the system's) and 18"
  cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" --pg18 "$PG18_CONFIG"
fi

# The official Standard Webhooks library for Python: the tests verify signatures with it.
if ! python3 -c 'import standardwebhooks' 2>/dev/null; then
  echo "setup: installing the Python package standardwebhooks"
  python3 -m pip install --quiet standardwebhooks
fi

# The console's browser tests drive Debian's Chromium (above) with Playwright; Playwright's own
# browser download is never used.
if ! python3 -c 'import playwright.sync_api' 2>/dev/null; then
  echo "setup: installing the Python package playwright"
  python3 -m pip install --quiet 'playwright>=1.40,<2'
fi

# The pull-consumer clients (clients/): psycopg 3 for Python with its C implementation (the
# binary package: with the pure-Python one, bench/pull.sh's Python worker handles about 30%
# fewer jobs a second), the pg package for Node (the versions clients/node/package-lock.json
# pins), PostgreSQL's JDBC driver for Java (a Debian package, above).
if ! python3 -c 'import psycopg; assert psycopg.pq.__impl__ != "python"' 2>/dev/null; then
  echo "setup: installing the Python package psycopg with its C implementation"
  python3 -m pip install --quiet 'psycopg[binary]>=3.2,<4'
fi
if ! cmp -s clients/node/package-lock.json clients/node/node_modules/.installed-lock.json; then
  echo "setup: installing the Node client's packages"
  (cd clients/node && npm ci --silent --no-audit --no-fund && cp package-lock.json node_modules/.installed-lock.json)
fi

# The framework examples (examples/): Django, SQLAlchemy, and Flask served by waitress for Python;
# Knex, Express and pg for Node (the versions examples/node/package-lock.json pins); Spring's JDBC
# and transactions for Java (Debian packages, above).
if ! python3 -c 'import django, sqlalchemy, flask, waitress' 2>/dev/null; then
  echo "setup: installing the Python packages of the examples"
  python3 -m pip install --quiet 'django>=5.2,<6' 'sqlalchemy>=2.0,<3' 'flask>=3.0,<4' 'waitress>=3.0,<4'
fi
if ! cmp -s examples/node/package-lock.json examples/node/node_modules/.installed-lock.json; then
  echo "setup: installing the Node examples' packages"
  (cd examples/node && npm ci --silent --no-audit --no-fund && cp package-lock.json node_modules/.installed-lock.json)
fi
