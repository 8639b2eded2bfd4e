#!/usr/bin/env python3
"""Drives a cluster (set up by monitoring/test.sh) and checks what the exporter shows: events
enqueued and rolled back, delivered to one endpoint, failing to dead at another (503), failing
at a third (down); a worker restarted; an endpoint disabled; a second database (shop),
whose series carry its own database label and counts; and an outbox relay process counted
among shop's relays while it runs. Prints the scraped outbox series."""

import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = os.environ["MONITORING_PGPORT"]
RECEIVER_PORT = int(os.environ["MONITORING_RECEIVER_PORT"])
METRICS_URL = os.environ["MONITORING_METRICS_URL"]
OUTBOX_BINARY = os.environ["MONITORING_OUTBOX_BINARY"]
EVENTS = 20
SHOP_EVENTS = 7


def sql(query, database="postgres"):
    return subprocess.run(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-d", database, "-X", "-tAq",
                           "-v", "ON_ERROR_STOP=1", "-c", query],
                          check=True, capture_output=True, text=True).stdout.strip()


def wait_until(what, condition, deadline=60):
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting until {what}")
        time.sleep(0.1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(204 if self.path == "/ok" else 503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def scrape():
    """The outbox_* samples: {(name, frozenset of labels): value}."""
    with urllib.request.urlopen(METRICS_URL, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line.startswith("outbox_"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").replace('"', "").split(",") if p)
        samples[(name, pairs)] = float(value)
    return samples, text


def value(samples, name, database="postgres", **labels):
    """The sum of the samples of `name` in `database` whose labels include `labels`."""
    wanted = set(labels.items()) | {("database", database)}
    matching = [v for (n, pairs), v in samples.items() if n == name and wanted <= set(pairs)]
    assert matching, f"no series {name} {labels} in the scrape"
    return sum(matching)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", RECEIVER_PORT), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for n in range(EVENTS):
        sql(f"SELECT outbox_enqueue('metrics.test', '{{\"n\": {n}}}')")
    for n in range(5):
        sql(f"BEGIN; SELECT outbox_enqueue('metrics.test', '{{\"rolled_back\": {n}}}'); ROLLBACK;")
    sql(f"SELECT outbox_enqueue('shop.test', '{{}}') FROM generate_series(1, {SHOP_EVENTS})", database="shop")
    wait_until("shop's events are sent", lambda: sql(
        "SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NOT NULL", database="shop") == str(SHOP_EVENTS))
    wait_until("default has them all and failing's are dead", lambda: sql(
        "SELECT count(*) FILTER (WHERE endpoint = 'default' AND sent_at IS NOT NULL) = 20"
        " AND count(*) FILTER (WHERE endpoint = 'failing' AND dead_at IS NOT NULL) = 20 FROM outbox_deliveries") == "t")
    wait_until("down has failed at least once per event",
               lambda: int(sql("SELECT coalesce(sum(attempts), 0) FROM outbox_deliveries WHERE endpoint = 'down'")) >= EVENTS)

    samples, _ = scrape()
    checks = [
        (value(samples, "outbox_events_enqueued_total"), EVENTS, "committed events only"),
        (value(samples, "outbox_deliveries_sent_total"), EVENTS, "default's deliveries"),
        (value(samples, "outbox_workers_running"), 2, "both workers"),
        (value(samples, "outbox_worker_attempts_total", outcome="2xx"), EVENTS, "one 2xx per event"),
        (value(samples, "outbox_worker_attempts_total", outcome="5xx"), 2 * EVENTS, "two 503s per event to failing"),
        (value(samples, "outbox_endpoint_dead", endpoint="failing"), EVENTS, "failing's deliveries dead"),
        (value(samples, "outbox_endpoint_dead", endpoint="default"), 0, "none dead at default"),
        (value(samples, "outbox_endpoint_pending", endpoint="default") + value(samples, "outbox_endpoint_waiting", endpoint="default"), 0, "nothing left at default"),
        (value(samples, "outbox_endpoint_pending", endpoint="down") + value(samples, "outbox_endpoint_waiting", endpoint="down"), EVENTS, "down's deliveries wait"),
        (value(samples, "outbox_endpoint_disabled", endpoint="down"), 0, "down is enabled"),
        (value(samples, "outbox_events_enqueued_total", database="shop"), SHOP_EVENTS, "shop's own events"),
        (value(samples, "outbox_deliveries_sent_total", database="shop"), SHOP_EVENTS, "shop's deliveries"),
        (value(samples, "outbox_workers_running", database="shop"), 2, "shop's two workers"),
        (value(samples, "outbox_worker_attempts_total", database="shop", outcome="2xx"), SHOP_EVENTS, "shop's 2xx"),
    ]
    unreachable = value(samples, "outbox_worker_attempts_total", outcome="unreachable")
    failing_seconds = value(samples, "outbox_endpoint_failing_seconds", endpoint="down")
    healthy_seconds = value(samples, "outbox_endpoint_failing_seconds", endpoint="default")
    for got, expected, what in checks:
        assert got == expected, f"{what}: expected {expected}, scraped {got}"
    assert unreachable >= EVENTS, f"attempts to down count as unreachable: {unreachable}"
    assert failing_seconds > 0 and healthy_seconds == 0, f"down failing for {failing_seconds} s, default {healthy_seconds}"

    # A worker that restarts keeps its counters: they never go backwards while the server runs.
    before = value(samples, "outbox_worker_attempts_total", outcome="2xx")
    pids = sql("SELECT string_agg(pid::text, ' ' ORDER BY worker) FROM outbox_workers()").split()
    sql(f"SELECT pg_terminate_backend({pids[0]})")
    wait_until("the worker is back", lambda: sql("SELECT count(*) FROM outbox_workers()") == "2"
               and pids[0] not in sql("SELECT string_agg(pid::text, ' ') FROM outbox_workers()").split())
    sql("SELECT outbox_endpoint_disable('down')")
    samples, text = scrape()
    after = value(samples, "outbox_worker_attempts_total", outcome="2xx")
    assert after >= before == EVENTS, f"2xx attempts went from {before} to {after} across a worker restart"
    assert value(samples, "outbox_endpoint_disabled", endpoint="down") == 1, "down shows as disabled"

    # An outbox relay process serving shop counts as a relay too, and no longer once it stops.
    relay = subprocess.Popen([OUTBOX_BINARY, "relay", f"--database-url=postgres://postgres@127.0.0.1:{PORT}/shop",
                              f"--webhook-url=http://127.0.0.1:{RECEIVER_PORT}/ok"], stderr=subprocess.DEVNULL)
    try:
        wait_until("shop's relay process is counted",
                   lambda: value(scrape()[0], "outbox_workers_running", database="shop") == 3)
    finally:
        relay.terminate()
        assert relay.wait(30) == 0, "the relay exits 0 on SIGTERM"
    wait_until("the stopped relay is no longer counted",
               lambda: value(scrape()[0], "outbox_workers_running", database="shop") == 2)

    print("== scraped from the exporter (outbox series):")
    print("\n".join(line for line in text.splitlines() if line.startswith("outbox_")))
    print("== monitoring: every series checked")
    server.shutdown()


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED monitoring: {e}", file=sys.stderr)
        sys.exit(1)
