#!/bin/sh
# Compiles the Java client and its test program; needs javac 17 and Debian's libpostgresql-jdbc-java.
set -eu
cd "$(dirname "$0")"
JDBC=/usr/share/java/postgresql.jar
rm -rf build
# -XDignore.symbol.file: no warning for sun.misc.Signal (jdk.unsupported), used on purpose for SIGTERM.
javac -XDignore.symbol.file -Xlint:all,-options -d build -cp "$JDBC" src/outbox/*.java
echo "run: java -cp clients/java/build:$JDBC outbox.Example work   (from the repository's root)"
