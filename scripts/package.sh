#!/usr/bin/env bash
# Builds the packages:
# - dist/postgresql-15-outbox-ext_<version>_<arch>.deb from `cargo pgrx package`: the library,
#   the control file, the current install script, the update scripts and the frozen install
#   scripts of released versions (so that an installed older version can be updated). Depends
#   on postgresql-15.
# - dist/outbox_ext-<version>-pg18-<arch>.tar.gz: the same files for PostgreSQL 18, which
#   Debian 12 does not package: outbox_ext.so for `pg_config --pkglibdir`, and extension/ for
#   `pg_config --sharedir`/extension (docs/installation.md).
# - dist/outbox_<version>_<arch>.deb: the outbox binary (migrate, doctor, relay) for servers
#   that load no library, with the hardened systemd unit outbox-relay.service, its
#   configuration /etc/outbox/relay.conf and the system user outbox it runs as.
# Install either with `apt-get install ./dist/<package>.deb`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
. scripts/cluster.sh
assemble_update_scripts

VERSION=$(awk -F'"' '/^version *=/ { print $2; exit }' Cargo.toml)
ARCH=$(dpkg --print-architecture)

# build_extension MAJOR: `cargo pgrx package` for that major's server; BUILT, PKGLIB_DIR and
# EXTENSION_DIR say where its files are.
build_extension() {
  local pg_config
  pg_config=$(server_dir "$1")/bin/pg_config
  echo "== building outbox_ext $VERSION for PostgreSQL $1 (cargo pgrx package, release)"
  cargo pgrx package --pg-config "$pg_config" >/dev/null
  BUILT=target/release/outbox_ext-pg$1
  PKGLIB_DIR=$("$pg_config" --pkglibdir)
  EXTENSION_DIR=$("$pg_config" --sharedir)/extension
  # A released version's install script is frozen in sql/: the build must still give it (apart
  # from pgrx's comments naming Rust source lines), or the change belongs to a new version.
  if [ -f "sql/outbox_ext--$VERSION.sql" ]; then
    if ! diff -q <(grep -v '^-- src/' "$BUILT$EXTENSION_DIR/outbox_ext--$VERSION.sql") \
                 <(grep -v '^-- src/' "sql/outbox_ext--$VERSION.sql") >/dev/null; then
      echo "package: $VERSION is released, and the install script built for PostgreSQL $1 differs from sql/outbox_ext--$VERSION.sql;" >&2
      echo "package: raise the version in Cargo.toml and outbox_ext.control, and add an update script from $VERSION" >&2
      exit 1
    fi
  fi
  # Beside what pgrx built: the released install scripts and the update scripts, so that an
  # installed older version can be updated. Each package takes the extension's files from here.
  install -m 644 sql/outbox_ext--*.sql "$BUILT$EXTENSION_DIR/"
}

build_extension 18
TARBALL=outbox_ext-$VERSION-pg18-$ARCH
ROOT=$(mktemp -d /tmp/outbox-package.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
install -d "$ROOT/$TARBALL/extension"
install -m 755 "$BUILT$PKGLIB_DIR/outbox_ext.so" "$ROOT/$TARBALL/"
install -m 644 "$BUILT$EXTENSION_DIR"/* "$ROOT/$TARBALL/extension/"
install -m 644 LICENSE CHANGELOG.md "$ROOT/$TARBALL/"
mkdir -p dist
rm -f dist/outbox_ext-*-pg18-*.tar.gz
tar -czf "dist/$TARBALL.tar.gz" -C "$ROOT" "$TARBALL"
echo "== dist/$TARBALL.tar.gz"
tar -tzf "dist/$TARBALL.tar.gz" | awk '{ print "   " $0 }' | grep -v '/$'
rm -rf "$ROOT"

NAME=postgresql-15-outbox-ext
build_extension 15
ROOT=$(mktemp -d /tmp/outbox-package.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
cp -a "$BUILT/." "$ROOT/"
install -d "$ROOT/usr/share/doc/$NAME"
install -m 644 LICENSE "$ROOT/usr/share/doc/$NAME/copyright"
install -m 644 CHANGELOG.md README.md "$ROOT/usr/share/doc/$NAME/"
install -d "$ROOT/usr/share/doc/$NAME/docs"
install -m 644 docs/*.md "$ROOT/usr/share/doc/$NAME/docs/" # the pages README.md links to
install -d "$ROOT/usr/share/doc/$NAME/docs/console"
install -m 644 docs/console/*.png "$ROOT/usr/share/doc/$NAME/docs/console/" # the pages' screenshots
install -d "$ROOT/DEBIAN"
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: outbox_ext maintainers <outbox-ext@localhost>
Depends: postgresql-15, libc6, libgcc-s1
Section: database
Priority: optional
Installed-Size: $(du -sk "$ROOT/usr" | cut -f1)
Description: transactional outbox for PostgreSQL 15
 outbox_enqueue(topic, payload) writes an event in the caller's transaction;
 background workers inside PostgreSQL deliver committed events to webhook
 endpoints (Standard Webhooks signatures, retries, dead deliveries), or
 consumers claim them over SQL. Add outbox_ext to shared_preload_libraries,
 restart, then CREATE EXTENSION outbox_ext.
CONTROL
mkdir -p dist
rm -f "dist/${NAME}_"*.deb
DEB=dist/${NAME}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group --build "$ROOT" "$DEB" >/dev/null
echo "== $DEB"
dpkg-deb --contents "$DEB" | awk '{ print "   " $6 }' | grep -v '/$'

echo "== building outbox $VERSION (cargo build --release -p outbox)"
cargo build --release -q -p outbox
ROOT=$(mktemp -d /tmp/outbox-package.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
install -D -m 755 target/release/outbox "$ROOT/usr/bin/outbox"
install -D -m 644 cli/packaging/outbox-relay.service "$ROOT/lib/systemd/system/outbox-relay.service"
install -D -m 640 cli/packaging/relay.conf "$ROOT/etc/outbox/relay.conf"
install -d "$ROOT/usr/share/doc/outbox"
install -m 644 LICENSE "$ROOT/usr/share/doc/outbox/copyright"
install -m 644 CHANGELOG.md docs/managed-postgresql.md "$ROOT/usr/share/doc/outbox/"
install -d "$ROOT/DEBIAN"
install -m 755 cli/packaging/postinst "$ROOT/DEBIAN/postinst"
echo /etc/outbox/relay.conf > "$ROOT/DEBIAN/conffiles"
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: outbox
Version: $VERSION
Architecture: $ARCH
Maintainer: outbox_ext maintainers <outbox-ext@localhost>
Depends: libc6, libgcc-s1, adduser
Section: database
Priority: optional
Installed-Size: $(du -sk "$ROOT/usr" | cut -f1)
Description: transactional outbox for PostgreSQL servers that load no library
 outbox migrate installs outbox_ext's tables and functions as plain SQL (on
 RDS, Cloud SQL, Azure, Neon and the like), outbox doctor checks them, and
 outbox relay delivers committed events to webhook endpoints from outside
 the server, as outbox_ext's workers do; outbox-relay.service runs it.
CONTROL
rm -f dist/outbox_*.deb
DEB=dist/outbox_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group --build "$ROOT" "$DEB" >/dev/null
echo "== $DEB"
dpkg-deb --contents "$DEB" | awk '{ print "   " $6 }' | grep -v '/$'
