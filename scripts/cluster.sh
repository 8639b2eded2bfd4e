# Sourced by the demo and the benchmark: a throwaway PostgreSQL cluster with outbox_ext
# preloaded, owned by the postgres OS user (PostgreSQL refuses to run as root). OUTBOX_PG_MAJOR
# picks the major (15, Debian's, unless set; scripts/servers.sh has the others).
#
#   start_cluster DIR PORT [extra postgresql.conf lines...]   then   stop_cluster
#   psql_cluster ARGS...                                       runs psql against it

. "$(dirname "${BASH_SOURCE[0]}")/servers.sh"
PG_MAJOR=${OUTBOX_PG_MAJOR:-15}
server_version "$PG_MAJOR" >/dev/null || return 1
PG_BIN=$(server_dir "$PG_MAJOR")/bin
[ -x "$PG_BIN/postgres" ] || { echo "cluster: PostgreSQL $PG_MAJOR is not installed in $PG_BIN: run scripts/setup.sh" >&2; return 1; }
# Debian's client tools (15) speak to every newer server; a server that has its own uses them.
PSQL=$PG_BIN/psql
[ -x "$PSQL" ] || PSQL=/usr/lib/postgresql/15/bin/psql

# The server of this major that offers TLS: this one, or (18) a build of it with OpenSSL.
TLS_PG_BIN=$(server_dir "$(with_openssl "$PG_MAJOR")")/bin

# Whether the extension builds for this major: only where the server's headers can be had.
extension_builds() { [ -x "$PG_BIN/pg_config" ]; }

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres "$@"; fi
}

install_extension() {
  extension_builds || { echo "cluster: the extension does not build for PostgreSQL $PG_MAJOR (no headers)" >&2; return 1; }
  echo "== building and installing outbox_ext for PostgreSQL $PG_MAJOR (release)"
  local sudo_flag=()
  [ "$(id -u)" = 0 ] || sudo_flag=(--sudo)
  assemble_update_scripts
  cargo pgrx install --release "${sudo_flag[@]}" --pg-config "$PG_BIN/pg_config" >/dev/null
  install_released_scripts
}

# cargo pgrx installs the current version's script and the update scripts; the install
# scripts of released versions (sql/outbox_ext--X.Y.Z.sql, frozen) are copied here, so that
# CREATE EXTENSION outbox_ext VERSION 'X.Y.Z' works and the update chain can be tested.
install_released_scripts() {
  local dir
  dir="$("$PG_BIN/pg_config" --sharedir)/extension"
  for script in sql/outbox_ext--*.sql; do
    case "$script" in *--*--*) continue ;; esac
    as_root install -m 644 "$script" "$dir/"
  done
}

# The update scripts are assembled from sql/updates/A--B.sql: each line "--@include FILE"
# becomes the text of sql/FILE, so an update creates its new objects from the very text a
# fresh install runs. The result, sql/outbox_ext--A--B.sql, is committed (cargo pgrx install
# copies it from there); scripts/test.sh checks that it is up to date. Once released (listed in
# sql/released.sha256) an update script is frozen as committed: the sql/ files it included
# go on changing for the next version.
assemble_update_scripts() {
  local source target
  for source in sql/updates/*--*.sql; do
    target="sql/outbox_ext--$(basename "$source")"
    grep -q " $target\$" sql/released.sha256 && continue
    awk '/^--@include / { file = "sql/" $2; while ((getline line < file) > 0) print line; close(file); next } { print }' \
      "$source" >"$target"
  done
}

start_cluster() {
  CLUSTER_DIR=$1 CLUSTER_PORT=$2
  shift 2
  rm -rf "$CLUSTER_DIR"
  mkdir -p "$CLUSTER_DIR"
  chown postgres "$CLUSTER_DIR" 2>/dev/null || true
  as_postgres "$PG_BIN/initdb" -D "$CLUSTER_DIR/data" -U postgres --auth=trust >/dev/null
  {
    # Where the extension does not build, only the SQL install can be tested.
    if extension_builds; then echo "shared_preload_libraries = 'outbox_ext'"; fi
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$CLUSTER_DIR'"
    printf '%s\n' "$@"
  } | as_postgres tee -a "$CLUSTER_DIR/data/postgresql.conf" >/dev/null
  # The scripts' fixed ports (153xx) lie below Linux's ephemeral range (32768-60999), so no
  # outgoing connection takes one as its local port, as one did in a CI run when they were 543xx.
  # A port can still be held for a moment by a cluster an earlier step is stopping: then wait for
  # it to be free and try again, a few times.
  local attempt
  for attempt in 1 2 3 4 5; do
    if as_postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR/data" -o "-p $CLUSTER_PORT" -l "$CLUSTER_DIR/server.log" -w start >/dev/null; then
      return 0
    fi
    grep -q "Address already in use" "$CLUSTER_DIR/server.log" && [ "$attempt" -lt 5 ] || break
    echo "start_cluster: port $CLUSTER_PORT is in use; waiting for it to be free" >&2
    local deadline=$((SECONDS + 60))
    while ss -tan | awk '{ print $4 }' | grep -q ":$CLUSTER_PORT\$" && [ $SECONDS -lt $deadline ]; do sleep 1; done
    sleep "$attempt"
  done
  echo "start_cluster: PostgreSQL did not start on port $CLUSTER_PORT; the end of its log:" >&2
  tail -n 20 "$CLUSTER_DIR/server.log" >&2
  return 1
}

stop_cluster() {
  [ -n "${CLUSTER_DIR:-}" ] && [ -f "$CLUSTER_DIR/data/postmaster.pid" ] &&
    as_postgres "$PG_BIN/pg_ctl" -D "$CLUSTER_DIR/data" -m fast -w stop >/dev/null 2>&1
  return 0
}

psql_cluster() {
  # The server's own psql, not Debian's wrapper (a Perl script, and a noticeable load when a
  # benchmark polls 20 times a second).
  "$PSQL" -h 127.0.0.1 -p "$CLUSTER_PORT" -U postgres -X -v ON_ERROR_STOP=1 "$@"
}

# start_pgbouncer DIR PORT USER...: Debian's PgBouncer in transaction pooling mode on
# 127.0.0.1:PORT in front of the cluster (every database), letting in the USERs (trust, as the
# cluster does); run as the postgres OS user, which it must be (it refuses root), with its
# configuration, log and pid file in DIR. Returns once it listens. stop_pgbouncer DIR stops it.
start_pgbouncer() {
  local dir=$1 port=$2 user
  shift 2
  mkdir -p "$dir"
  : >"$dir/users.txt"
  for user in "$@"; do printf '"%s" ""\n' "$user" >>"$dir/users.txt"; done
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$CLUSTER_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
# pgjdbc sets it at connection start; PgBouncer refuses a parameter it does not track.
ignore_startup_parameters = extra_float_digits
default_pool_size = 20
max_client_conn = 200
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
  chown -R postgres "$dir" 2>/dev/null || true
  as_postgres pgbouncer -d "$dir/pgbouncer.ini"
  local deadline=$((SECONDS + 10))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "start_pgbouncer: PgBouncer does not listen on $port; its log:" >&2; tail -n 5 "$dir/pgbouncer.log" >&2; return 1; }
    sleep 0.1
  done
}

stop_pgbouncer() {
  [ ! -f "$1/pgbouncer.pid" ] || as_postgres kill -INT "$(cat "$1/pgbouncer.pid")" 2>/dev/null || true
}
