#!/usr/bin/env python3
"""Fault-injection suite: thousands of events, some rolled back, delivered to a receiver on
127.0.0.1 while a fault hits; then checks that nothing committed was lost and nothing rolled
back was sent. Prints one Markdown table; exits 1 if any scenario breaks a guarantee.

Run through faults/run.sh, which builds, installs and starts the cluster. Size with
FAULT_EVENTS (committed events per scenario; rolled-back ones are a quarter of that again).
With FAULT_RELAYS set to the `outbox` binary, the relays are two `outbox relay` processes this
suite starts (and restarts, as a supervisor would) instead of the extension's workers; the
cluster then runs none (outbox.workers = 0). With FAULT_LOG_MODE set, the database is in log
mode (the cluster has wal_level = logical): the events go through the log's slot, and a
scenario has settled once the slot is confirmed past its last event and the table path (what
failed, and ordered keys) has nothing left to send."""

import base64
import http.client
import json
import os
import pwd
import random
import signal
import subprocess
import sys
import threading
import time

import psycopg
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PG_BIN = os.environ.get("FAULT_PG_BIN", "/usr/lib/postgresql/15/bin")
DATA = os.environ["FAULT_PGDATA"]
PORT = os.environ["FAULT_PGPORT"]
RECEIVER_PORT = int(os.environ.get("FAULT_RECEIVER_PORT", "8797"))
EVENTS = int(os.environ.get("FAULT_EVENTS", "2000"))
DEADLINE = 180  # seconds any scenario may take to recover
BASE_SETTINGS = {"lease": "5s", "http_timeout": "4s", "concurrency": "128"}
RELAY_BINARY = os.environ.get("FAULT_RELAYS")
RELAY_METRICS_PORTS = [19201, 19202]
# Where the outbox's objects are: the extension's schema, or the SQL install's.
SCHEMA = os.environ.get("FAULT_SCHEMA", "public")
# The relays' connection (through PgBouncer in transaction mode, if it runs), and the direct one
# they LISTEN on.
RELAY_URL = os.environ.get("FAULT_RELAY_URL", "")
LISTEN_URL = os.environ.get("FAULT_LISTEN_URL", "")
PGBOUNCER_CONFIG = os.environ.get("FAULT_PGBOUNCER_CONFIG")
LOG_MODE = bool(os.environ.get("FAULT_LOG_MODE"))


# ---------------------------------------------------------------- the database

def sql(query):
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-X", "-tAq",
                          "-v", "ON_ERROR_STOP=1", "-c", query],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def pg_ctl(*args):
    subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_ctl", "-D", DATA, *args],
                   check=True, capture_output=True)


def start_server():
    pg_ctl("-o", f"-p {PORT}", "-l", f"{DATA}/../server.log", "-w", "start")


def configure(**settings):
    """Applies settings and waits until every worker works with them."""
    if RELAY_BINARY:
        RELAYS.configure(settings)
        return
    for name, value in settings.items():
        sql(f"ALTER SYSTEM SET outbox.{name} = '{value}'")
    wait_until("both workers run", lambda: sql("SELECT count(*) FROM outbox_workers()") == "2")
    before = sql("SELECT clock_timestamp()")
    sql("SELECT pg_reload_conf()")
    wait_until("the workers reloaded their settings",
               lambda: sql(f"SELECT bool_and(settings_loaded_at > '{before}') FROM outbox_workers()") == "t")


def worker_pids():
    if RELAY_BINARY:
        return RELAYS.pids()
    pids = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext relay'")
    return [int(p) for p in pids.split()]


def in_flight():
    """Requests the relays have in flight now."""
    if RELAY_BINARY:
        return RELAYS.in_flight()
    return int(sql("SELECT coalesce(sum(in_flight), 0) FROM outbox_workers()"))


class Relays:
    """Two `outbox relay` processes with the settings last configured; a relay that exits or
    is killed is started again by `supervise`, as systemd would."""

    def __init__(self):
        self.settings = {}
        self.processes = [None, None]

    def start(self, index):
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in self.settings.items()]
        log = open(f"{DATA}/../relay-{index}.log", "a")
        self.processes[index] = subprocess.Popen(
            [RELAY_BINARY, "relay", f"--database-url={RELAY_URL}", f"--listen-url={LISTEN_URL}", f"--schema={SCHEMA}",
             f"--metrics=127.0.0.1:{RELAY_METRICS_PORTS[index]}", "--poll-interval=200ms",
             f"--webhook-url=http://127.0.0.1:{RECEIVER_PORT}/events", *flags],
            stdout=log, stderr=log)
        wait_until(f"relay {index} is ready", lambda: self.get(index, "/readyz")[0] == 200, deadline=30)

    def get(self, index, path):
        connection = http.client.HTTPConnection("127.0.0.1", RELAY_METRICS_PORTS[index], timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        except OSError:
            return None, ""
        finally:
            connection.close()

    def stop(self, index, sig=signal.SIGTERM):
        """Signals relay `index` and waits for it to exit; returns how long that took."""
        process = self.processes[index]
        started = time.monotonic()
        process.send_signal(sig)
        process.wait(30)
        return time.monotonic() - started

    def configure(self, settings):
        self.settings = dict(settings)
        for index in range(len(self.processes)):
            if self.processes[index] is not None and self.processes[index].poll() is None:
                self.stop(index)
            self.start(index)

    def supervise(self):
        """Starts again every relay that has exited."""
        for index, process in enumerate(self.processes):
            if process is not None and process.poll() is not None:
                self.start(index)

    def pids(self):
        return [process.pid for process in self.processes]

    def in_flight(self):
        total = 0
        for index in range(len(self.processes)):
            _, text = self.get(index, "/metrics")
            total += sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("outbox_relay_in_flight "))
        return total

    def stop_all(self):
        for index, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                self.stop(index)


RELAYS = Relays()


def wait_until(what, condition, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while True:
        try:
            if condition():
                return
        except subprocess.CalledProcessError:
            pass  # the server is restarting or recovering; ask again
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting until {what}")
        time.sleep(0.05)


def enqueue_mixed(events):
    """Enqueues `events` committed events, and one rolled-back event after every fourth, each in
    its own transaction; the rolled-back ones carry "rolled_back": true."""
    lines = []
    for n in range(events):
        lines.append(f"BEGIN; SELECT outbox_enqueue('fault.test', '{{\"n\": {n}}}'); COMMIT;")
        if n % 4 == 3:
            lines.append(f"BEGIN; SELECT outbox_enqueue('fault.test', '{{\"n\": {n}, \"rolled_back\": true}}'); ROLLBACK;")
    subprocess.run(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-X", "-q",
                    "-o", "/dev/null", "-v", "ON_ERROR_STOP=1"],
                   input="\n".join(lines), check=True, text=True)
    return events // 4


def enqueue_keyed(events, keys=40):
    """Enqueues `events` committed events over `keys` keys, one to three of a key per
    transaction (so that events of one transaction share a key too), each transaction committed
    before the next begins; and a rolled-back transaction after every fourth. Returns the
    number rolled back."""
    lines, n, rolled_back, transactions = [], 0, 0, 0
    while n < events:
        key = f"k{(n * 7919) % keys}"
        size = min(1 + transactions % 3, events - n)
        enqueues = " ".join(f"SELECT outbox_enqueue('fault.test', '{{\"n\": {n + i}, \"key\": \"{key}\"}}', '{key}');"
                            for i in range(size))
        lines.append(f"BEGIN; {enqueues} COMMIT;")
        n += size
        transactions += 1
        if transactions % 4 == 0:
            lines.append(f"BEGIN; SELECT outbox_enqueue('fault.test', '{{\"n\": {n}, \"key\": \"{key}\", "
                         f"\"rolled_back\": true}}', '{key}'); ROLLBACK;")
            rolled_back += 1
    subprocess.run(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-X", "-q",
                    "-o", "/dev/null", "-v", "ON_ERROR_STOP=1"],
                   input="\n".join(lines), check=True, text=True)
    return rolled_back


# ---------------------------------------------------------------- the receiver

class Receiver:
    """Records every request; answers 204 after `delay` seconds; can be taken down."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ids = []
        self.seen = set()
        self.active_ids = set()
        self.overlaps = 0
        self.rolled_back = 0
        self.active = 0
        self.delay = 0.0
        self.down = False
        self.first_attempt = None  # None, "hang" or "cut": what the first attempt of each event gets
        self.fail_rate = 0.0  # share of requests answered 503
        self.first_by_key = {}  # key: event ids in the order of their first delivery
        self.keys_active = set()
        self.key_overlaps = 0  # requests of one key in flight at the same time
        self.server = None

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if receiver.down:  # an outage: drop the connection without an answer
                    self.close_connection = True
                    return
                event_id = int(self.headers["webhook-id"])
                data = json.loads(body)["data"]
                key = data.get("key")
                with receiver.lock:
                    receiver.active += 1
                    if event_id in receiver.active_ids:
                        receiver.overlaps += 1  # the same row delivered twice at the same time
                    receiver.active_ids.add(event_id)
                    first = event_id not in receiver.seen
                    receiver.seen.add(event_id)
                    receiver.ids.append(event_id)
                    if data.get("rolled_back"):
                        receiver.rolled_back += 1
                    if key is not None:
                        if key in receiver.keys_active:
                            receiver.key_overlaps += 1
                        receiver.keys_active.add(key)
                        if first:
                            receiver.first_by_key.setdefault(key, []).append(event_id)
                released = []

                def release_key():
                    """Before answering: the relay may send the key's next event as soon as
                    it has the answer."""
                    if key is not None and not released:
                        released.append(True)
                        with receiver.lock:
                            receiver.keys_active.discard(key)

                try:
                    if key is not None and random.random() < receiver.fail_rate:
                        release_key()
                        self.send_response(503)
                        self.send_header("content-length", "0")
                        self.end_headers()
                        return
                    if first and receiver.first_attempt == "cut":
                        # status line and half the headers, then the connection closes
                        self.wfile.write(b"HTTP/1.1 204 No Content\r\ncontent-le")
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    if first and receiver.first_attempt == "hang":
                        time.sleep(5)  # longer than outbox.http_timeout (4 s)
                    time.sleep(receiver.delay)
                    release_key()
                    self.send_response(204)
                    self.send_header("content-length", "0")
                    self.end_headers()
                finally:
                    release_key()
                    with receiver.lock:
                        receiver.active -= 1
                        receiver.active_ids.discard(event_id)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024  # hundreds of connections open at once

            def handle_error(self, request, client_address):
                pass  # clients that give up (timeouts, shutdowns) are part of the test

        self.down = False
        self.server = Server(("127.0.0.1", RECEIVER_PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        """Connection refused for new connections, open ones dropped at their next request."""
        self.down = True
        self.server.shutdown()
        self.server.server_close()

    def reset(self, delay=0.0, first_attempt=None, fail_rate=0.0):
        with self.lock:
            self.ids, self.seen, self.rolled_back, self.overlaps = [], set(), 0, 0
            self.delay, self.first_attempt, self.fail_rate = delay, first_attempt, fail_rate
            self.first_by_key, self.keys_active, self.key_overlaps = {}, set(), 0

    def out_of_order(self):
        """First deliveries of a key that came after a later event of the same key."""
        with self.lock:
            return sum(1 for ids in self.first_by_key.values() for a, b in zip(ids, ids[1:]) if b < a)

    def received(self):
        with self.lock:
            return len(self.ids)


def wait_for_requests_in_flight(receiver, share, when):
    """Deliveries are under way and a request is open right now: the fault must meet one."""
    wait_until(f"deliveries are under way and requests are in flight when {when}",
               lambda: receiver.received() >= share and receiver.active > 0)


# ---------------------------------------------------------------- scenarios

def kill_a_worker(receiver):
    receiver.reset(delay=0.05)
    rolled_back = enqueue_mixed(EVENTS)
    wait_for_requests_in_flight(receiver, EVENTS // 5, "the fault hits")
    os.kill(worker_pids()[0], signal.SIGKILL)  # the postmaster reinitializes every backend
    if RELAY_BINARY:
        RELAYS.processes[0].wait()
        RELAYS.supervise()
        return rolled_back, "kill -9 of an outbox relay process, started again", None
    return rolled_back, "kill -9 of a relay worker", None


def immediate_stop(receiver):
    receiver.reset(delay=0.05)
    rolled_back = enqueue_mixed(EVENTS)
    wait_for_requests_in_flight(receiver, EVENTS // 5, "the fault hits")
    pg_ctl("-m", "immediate", "stop")
    start_server()
    return rolled_back, "pg_ctl stop -m immediate, start", None


def fast_shutdown(receiver):
    receiver.reset(delay=3.5)  # slower than the workers' 3 s shutdown grace: requests are abandoned
    rolled_back = enqueue_mixed(EVENTS)
    # In log mode one relay reads the log and sends, up to the endpoint's concurrency (128).
    wait_until("a hundred requests or more are in flight", lambda: receiver.active >= (100 if LOG_MODE else 200), deadline=30)
    in_flight = receiver.active
    if RELAY_BINARY:
        stopped_in = max(RELAYS.stop(0), RELAYS.stop(1))  # SIGTERM to each relay, as a deploy does
        assert stopped_in < 5, f"a relay took {stopped_in:.1f}s to stop"
        assert all(p.returncode == 0 for p in RELAYS.processes), "the relays exit with status 0"
        receiver.delay = 0.0
        RELAYS.supervise()
        expect = "bool_and(attempts = 1 OR last_error IS NOT NULL) FROM outbox_deliveries"
        return rolled_back, f"SIGTERM to both relays with {in_flight} in flight; stopped in {stopped_in:.1f} s", expect
    stopping = time.monotonic()
    pg_ctl("-m", "fast", "stop")  # SIGTERM to every worker, as a deploy does
    stopped_in = time.monotonic() - stopping
    assert stopped_in < 5, f"the server took {stopped_in:.1f}s to stop"
    receiver.delay = 0.0
    start_server()
    # The workers took back the attempts they abandoned: a row counts a second attempt only
    # after a recorded failure (a request that timed out while hundreds were held), never
    # because of the shutdown.
    expect = "bool_and(attempts = 1 OR last_error IS NOT NULL) FROM outbox_deliveries"
    return rolled_back, f"SIGTERM (fast shutdown) with {in_flight} in flight; server stopped in {stopped_in:.1f} s", expect


def receiver_outage(receiver):
    receiver.reset(delay=0.0)
    receiver.stop()
    rolled_back = enqueue_mixed(EVENTS)
    wait_until("attempts are failing", lambda: sql("SELECT count(*) FROM outbox_deliveries WHERE last_error IS NOT NULL") != "0")
    time.sleep(5)  # the outage itself: five seconds of refused connections
    receiver.start()
    return rolled_back, "receiver refused connections for 5 s", None


def hanging_receiver(receiver):
    events = max(EVENTS // 8, 100)  # each first attempt costs 4 s; fewer events suffice
    receiver.reset(first_attempt="hang")
    rolled_back = enqueue_mixed(events)
    expect = "bool_and(attempts >= 2 AND last_error = 'timeout') FROM outbox_deliveries"
    return rolled_back, f"first attempts hang past the 4 s timeout ({events} events)", expect


def cut_mid_response(receiver):
    events = max(EVENTS // 8, 100)
    receiver.reset(first_attempt="cut")
    rolled_back = enqueue_mixed(events)
    expect = "bool_and(attempts >= 2 AND last_error LIKE 'unreachable:%') FROM outbox_deliveries"
    return rolled_back, f"first attempts cut mid-response ({events} events)", expect


def lease_shorter_than_request(receiver):
    """outbox.lease is set below the time a request may take: a claim's lease is the longer of
    the setting and the request timeout plus 5 s, so no delivery is claimed again (and sent a
    second time at once) while its request runs."""
    events = max(EVENTS // 8, 100)
    configure(lease="1s", concurrency="1000")  # free request slots: an expired lease would be claimed again
    receiver.reset(delay=3.0)  # every request outlives the 1 s setting
    rolled_back = enqueue_mixed(events)
    expect = "bool_and(attempts = 1) FROM outbox_deliveries"  # never claimed again while it ran
    return rolled_back, f"1 s lease setting, 3 s receiver ({events} events)", expect


CLAIM = open(os.path.join(os.path.dirname(__file__), "..", "sql", "claim_batch.sql")).read()


def claim_sql(limit, lease_ms):
    """The workers' claim for the endpoint default, with the default 10 attempts and budgets:
    (endpoint, event id, attempts, body, last error, fence) rows; a null body (and the error)
    for one made dead; a row of nulls when the bytes budget left some out."""
    return "".join(l for l in CLAIM.splitlines(True) if not l.startswith("--")) \
        .replace("$1", "'{default}'").replace("$2", f"'{{{limit}}}'").replace("$3", f"'{{{lease_ms}}}'") \
        .replace("$4", "'{10}'").replace("$5", "67108864").replace("$6", "pg_backend_pid()") \
        .replace("@extschema@", SCHEMA)


MARK_SENT = open(os.path.join(os.path.dirname(__file__), "..", "sql", "mark_sent.sql")).read()


def mark_sent(claims):
    """The workers' mark-sent statement for these deliveries to the endpoint default: (event id,
    fencing token of the claim) pairs."""
    sql("".join(l for l in MARK_SENT.splitlines(True) if not l.startswith("--"))
        .replace("@extschema@", SCHEMA)
        .replace("$1", "'{" + ",".join("default" for _ in claims) + "}'::text[]")
        .replace("$2", "'{" + ",".join(event_id for event_id, _ in claims) + "}'::bigint[]")
        .replace("$3", "'{" + ",".join(fence for _, fence in claims) + "}'::integer[]")
        .replace("$4", f"'{SCHEMA}.outbox_deliveries'::regclass::oid"))


def run_sql_claimer(claim, record, enqueued, pause=0.0):
    """A claimer beside the workers: runs `claim()` (psql output of the workers' claim: endpoint,
    event id, attempts, body, last error, fence), POSTs each body to the receiver, passes the
    (id, fence) of those answered 2xx to `record`, until `enqueued` is set and nothing is left
    unsent. Returns how many it delivered."""
    connection = http.client.HTTPConnection("127.0.0.1", RECEIVER_PORT, timeout=10)
    delivered = 0
    while True:
        # A claimed row has a body (which may hold "|") before an empty last error and its
        # fence; one made dead has an empty body; the budgets' row has no endpoint.
        rows = []
        for line in claim().splitlines():
            parts = line.split("|", 3)
            fields = parts[3].rsplit("|", 2) if len(parts) == 4 else []
            if len(fields) == 3 and parts[0] and fields[0]:
                rows.append((parts[1], fields[2], fields[0]))
        if not rows:
            if enqueued.is_set() and sql("SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NULL") == "0":
                return delivered
            time.sleep(pause)
            continue
        sent = []
        for event_id, fence, body in rows:
            connection.request("POST", "/events", body=body,
                               headers={"webhook-id": event_id, "content-type": "application/json"})
            response = connection.getresponse()
            response.read()
            if 200 <= response.status < 300:
                sent.append((event_id, fence))
        if sent:
            record(sent)
        delivered += len(sent)


def two_replicas(receiver):
    """Two SQL clients run their own claim loop with the workers' claim and mark-sent
    statements, delivering what they claimed over HTTP, beside the two workers."""
    configure(concurrency="8")  # a backlog forms, as it does under load, so every claimer finds rows
    receiver.reset(delay=0.05)
    enqueued = threading.Event()
    delivered_by = [0, 0]

    def replica(index):
        delivered_by[index] = run_sql_claimer(lambda: sql(claim_sql(20, 5000)), mark_sent, enqueued)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    rolled_back = enqueue_mixed(EVENTS)
    enqueued.set()
    for thread in threads:
        thread.join(DEADLINE)
    relays = "claimed_by < 0" if RELAY_BINARY else "claimed_by IN (SELECT pid FROM outbox_workers())"
    workers = sql(f"SELECT count(*) FROM outbox_deliveries WHERE {relays}")
    assert receiver.overlaps == 0, f"{receiver.overlaps} rows were delivered twice at the same time"
    assert min(delivered_by) > 0 and int(workers) > 0, f"replicas {delivered_by}, workers {workers}: all take part"
    relayed_by = "outbox relay processes" if RELAY_BINARY else "workers"
    return rolled_back, (f"2 SQL claimers beside the {relayed_by} (replicas delivered {delivered_by[0]} and "
                         f"{delivered_by[1]}, {relayed_by} {workers}; 0 concurrent deliveries of one row)"), None


def long_transaction(receiver):
    """A REPEATABLE READ transaction stays open while ten times the events flow, so vacuum can
    remove none of the dead row versions they leave."""
    receiver.reset()

    def empty_claim_ms():
        plan = sql(f"BEGIN; EXPLAIN ANALYZE {claim_sql(100, 30000)}; ROLLBACK")
        return float(plan.split("Execution Time: ")[1].split()[0])

    before = empty_claim_ms()
    holder = subprocess.Popen(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-X", "-q"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    holder.stdin.write("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox;\n")
    holder.stdin.flush()
    wait_until("the transaction holds its snapshot",
               lambda: sql("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'") == "1")
    opened = time.monotonic()
    rolled_back = enqueue_mixed(EVENTS * 10)
    wait_until("everything is delivered with the transaction still open",
               lambda: sql("SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NULL") == "0")
    after = empty_claim_ms()
    held = time.monotonic() - opened
    holder.stdin.write("COMMIT;\n")
    holder.stdin.close()
    holder.wait()
    return rolled_back, (f"transaction open {held:.0f} s across {EVENTS * 10} events; "
                         f"claim on an empty queue {before:.2f} ms before, {after:.2f} ms after"), None


# ---------------------------------------------------------------- ordered scenarios
# The endpoint default is ordered for these; events carry keys (enqueue_keyed), and besides
# nothing lost and nothing rolled back delivered, each key's first deliveries must come in
# event-id order with never two requests of one key in flight at once.

def ordered_503s(receiver):
    receiver.reset(delay=0.005, fail_rate=0.2)
    rolled_back = enqueue_keyed(EVENTS // 4)  # each 503 holds its key back a second or more
    return rolled_back, f"503 for 20% of requests, retried with backoff ({EVENTS // 4} events, 40 keys)", None


def ordered_kill_a_worker(receiver):
    receiver.reset(delay=0.02)
    rolled_back = enqueue_keyed(EVENTS)
    wait_until("deliveries are under way", lambda: receiver.received() >= EVENTS // 5)
    os.kill(worker_pids()[0], signal.SIGKILL)
    if RELAY_BINARY:
        RELAYS.processes[0].wait()
        RELAYS.supervise()
    return rolled_back, "kill -9 of a relay (40 keys)", None


def ordered_immediate_stop(receiver):
    receiver.reset(delay=0.02)
    rolled_back = enqueue_keyed(EVENTS)
    wait_until("deliveries are under way", lambda: receiver.received() >= EVENTS // 5)
    pg_ctl("-m", "immediate", "stop")
    start_server()
    return rolled_back, "pg_ctl stop -m immediate, start (40 keys)", None


def ordered_sql_claimer(receiver):
    """A SQL client sequences, claims and marks sent with the workers' own statements, beside
    the two workers, on the same ordered endpoint. Two requests each: a backlog forms, so
    the claimer, a psql per statement, finds rows beside workers a commit wakes at once."""
    configure(concurrency="2")
    receiver.reset(delay=0.01)
    enqueued = threading.Event()
    delivered = [0]

    def claim():
        sql("SELECT outbox_sequence('default')")
        return sql(claim_sql(20, 10000))

    def claimer():
        delivered[0] = run_sql_claimer(claim, mark_sent, enqueued, pause=0.01)

    thread = threading.Thread(target=claimer)
    thread.start()
    rolled_back = enqueue_keyed(EVENTS)
    enqueued.set()
    thread.join(DEADLINE)
    assert delivered[0] > 0, "the SQL claimer took part"
    return rolled_back, f"a SQL claimer beside the 2 workers (it delivered {delivered[0]})", None


# ---------------------------------------------------------------- outbox relay processes only
# What a relay outside the server meets that a worker does not.

def connection_cut(receiver):
    """The relays' connections are terminated again and again while requests are in flight, so
    acknowledgements arrive with no connection to record them on."""
    receiver.reset(delay=0.5)
    rolled_back = enqueue_mixed(EVENTS)
    rounds, cut = 0, 0
    while rounds < 5:
        wait_for_requests_in_flight(receiver, EVENTS // 10, "the connections are cut")
        cut += int(sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE application_name = 'outbox relay'") or 0)
        rounds += 1
        time.sleep(0.3)
    assert cut > 0, "connections were cut"
    return rolled_back, f"{cut} relay connections terminated in {rounds} rounds during requests", None


def database_unreachable(receiver):
    """The server stops for a minute (FAULT_OUTAGE seconds) while requests are in flight."""
    outage = float(os.environ.get("FAULT_OUTAGE", "60"))
    receiver.reset(delay=0.1)
    rolled_back = enqueue_mixed(EVENTS)
    wait_for_requests_in_flight(receiver, EVENTS // 5, "the database goes away")
    pg_ctl("-m", "fast", "stop")
    time.sleep(outage)  # the outage itself
    assert all(p.poll() is None for p in RELAYS.processes), "the relays wait for the database"
    start_server()
    return rolled_back, f"database stopped for {outage:.0f} s with requests in flight", None


def pgbouncer_restarted(receiver):
    """PgBouncer, which the relays connect through, stops and starts again while requests are in
    flight."""
    receiver.reset(delay=0.2)
    rolled_back = enqueue_mixed(EVENTS)
    wait_for_requests_in_flight(receiver, EVENTS // 5, "PgBouncer stops")
    pid_file = next(line.split("=", 1)[1].strip() for line in open(PGBOUNCER_CONFIG) if line.startswith("pidfile"))
    pid = int(open(pid_file).read())
    subprocess.run(["sudo", "-u", "postgres", "kill", "-INT", str(pid)], check=True)
    wait_until("PgBouncer stopped", lambda: not os.path.exists(f"/proc/{pid}"), deadline=30)
    time.sleep(2)  # two seconds with no pooler
    subprocess.run(["sudo", "-u", "postgres", "pgbouncer", "-d", PGBOUNCER_CONFIG], check=True, capture_output=True)
    return rolled_back, "PgBouncer stopped for 2 s and started again with requests in flight", None


RELAY_SCENARIOS = [connection_cut, database_unreachable] + ([pgbouncer_restarted] if PGBOUNCER_CONFIG else [])

ORDERED_SCENARIOS = [ordered_503s, ordered_kill_a_worker, ordered_immediate_stop, ordered_sql_claimer]

SCENARIOS = [kill_a_worker, immediate_stop, fast_shutdown, receiver_outage, hanging_receiver, cut_mid_response,
             lease_shorter_than_request, two_replicas, long_transaction]

# ---------------------------------------------------------------- log mode only

def failover_to_a_standby(receiver):
    """The primary dies with requests in flight, and a streaming standby is promoted. From
    PostgreSQL 17 on, the log's slot is a failover slot and the standby synchronises it
    (docs/log-mode.md, "Failovers"): the promoted server's relay reads on from that copy, made
    by no one after the promotion. Before 17 no slot reaches a standby: the promoted server's
    relay finds the log's slot missing, makes it again and recovers every event the old one had
    not confirmed. The standby is the cluster from here on (its server log too), so this runs
    last."""
    global DATA, PORT
    standby = os.path.normpath(f"{DATA}/../../pg-standby")
    standby_port = str(int(PORT) + 1)
    synchronised = int(sql("SHOW server_version_num")) >= 170000
    os.makedirs(standby, exist_ok=True)
    os.chown(standby, *pg_owner())
    backup, options = [], f"-p {standby_port}"
    if synchronised:
        sql("SELECT pg_create_physical_replication_slot('standby1')")
        # -R with a dbname writes it into primary_conninfo, which synchronising slots needs.
        backup = ["-S", "standby1"]
        options += " -c sync_replication_slots=on -c hot_standby_feedback=on"
    subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_basebackup", "-d",
                    f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres",
                    "-D", f"{standby}/data", "-R", "-X", "stream", *backup], check=True, capture_output=True)
    if synchronised:
        # After the backup: a promoted standby that kept it would wait for a standby it has not.
        sql("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
        sql("SELECT pg_reload_conf()")
    subprocess.run(["sudo", "-u", "postgres", f"{PG_BIN}/pg_ctl", "-D", f"{standby}/data", "-o", options,
                    "-l", f"{standby}/server.log", "-w", "start"], check=True, capture_output=True)
    on_standby = lambda query: subprocess.run(["psql", "-h", "127.0.0.1", "-p", standby_port, "-U", "postgres", "-X", "-tAq",
                                               "-c", query], check=True, capture_output=True, text=True).stdout.strip()
    log_slot = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = (SELECT slot FROM outbox_log_state)"
    receiver.reset(delay=0.2)
    rolled_back = enqueue_mixed(EVENTS)
    wait_for_requests_in_flight(receiver, EVENTS // 5, "the primary goes away")
    # Every commit reached the standby: what asynchronous replication may lose is not at stake here.
    written = sql("SELECT pg_current_wal_insert_lsn()")
    wait_until("the standby replayed every commit", lambda: on_standby(f"SELECT pg_last_wal_replay_lsn() >= '{written}'") == "t")
    if synchronised:
        # A synchronised slot is temporary until it has caught up with the primary's; only a
        # persistent one outlives the promotion.
        wait_until("the standby synchronised the log's slot",
                   lambda: on_standby(f"{log_slot} AND synced AND NOT temporary") == "1")
    else:
        assert on_standby("SELECT count(*) FROM pg_replication_slots") == "0", "the standby has no slot"
    pg_ctl("-m", "immediate", "stop")
    DATA, PORT = f"{standby}/data", standby_port
    pg_ctl("-w", "promote")
    if synchronised:
        # Read from the synchronised slot: one made again after the promotion is not synced.
        expect = "count(*) = 1 FROM pg_replication_slots AS r JOIN outbox_log_state AS s ON r.slot_name = s.slot WHERE r.synced"
        return rolled_back, "primary stopped (immediate), a standby with the log's slot synchronised promoted", expect
    return rolled_back, "primary stopped (immediate), a standby with no slot promoted", None


def pg_owner():
    """The postgres OS user's uid and gid."""
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


# Log mode has no claims of its own to race or hold: the scenarios about claims stay out. The
# failover leaves the promoted standby as the cluster: last.
LOG_SCENARIOS = [kill_a_worker, immediate_stop, fast_shutdown, receiver_outage, cut_mid_response,
                 ordered_503s, ordered_kill_a_worker, ordered_immediate_stop, ordered_sql_claimer,
                 failover_to_a_standby]


def settled(log_end, since):
    """Nothing committed is left to send: in log mode, the slot is also confirmed up to
    `log_end`, a WAL position past the last event (every delivery read from it acknowledged,
    or copied into the table path), by a relay after `since`, the server's time then. One
    snapshot: a slot made again shows, past log_end, before its events are recovered, and a
    confirmation seen comes after the recovery that preceded it."""
    pending = "NOT EXISTS (SELECT FROM outbox_deliveries WHERE sent_at IS NULL AND dead_at IS NULL)"
    if not LOG_MODE:
        return sql(f"SELECT {pending}") == "t"
    return sql(f"SELECT {pending} AND EXISTS (SELECT FROM pg_replication_slots AS r JOIN outbox_log_state AS s "
               f"ON r.slot_name = s.slot WHERE r.confirmed_flush_lsn >= '{log_end}' AND s.confirmed_at > '{since}' "
               "AND NOT s.recovering)") == "t"


def run(scenario, receiver):
    if RELAY_BINARY:
        RELAYS.supervise()  # a relay an earlier scenario left stopped
    # Start clean: no request of an earlier scenario may still arrive and be counted here.
    wait_until("no request is in flight", lambda: in_flight() == 0)
    configure(**BASE_SETTINGS)
    ordered = scenario in ORDERED_SCENARIOS
    sql(f"SELECT outbox_endpoint_set('default', NULL, ordered => {str(ordered).lower()})")
    sql("TRUNCATE outbox_attempts, outbox_deliveries, outbox, outbox_keys, outbox_key_arrivals, outbox_log")
    started = time.monotonic()
    rolled_back, fault, expect = scenario(receiver)
    fault_at = time.monotonic()
    log_end, since = None, None
    if LOG_MODE:
        wait_until("the server answers", lambda: sql("SELECT 1") == "1")
        log_end, since = sql("SELECT pg_current_wal_insert_lsn() || ' ' || clock_timestamp()").split(" ", 1)
    wait_until("every committed event is sent or dead", lambda: settled(log_end, since))
    recovery = time.monotonic() - fault_at
    committed = set(int(i) for i in sql("SELECT id FROM outbox UNION SELECT id FROM outbox_log").split())
    dead = int(sql("SELECT count(*) FROM outbox_deliveries WHERE dead_at IS NOT NULL"))
    with receiver.lock:
        received = list(receiver.ids)
        rolled_back_delivered = receiver.rolled_back
    delivered = set(received)
    row = {
        "scenario": scenario.__name__.replace("_", " "),
        "fault": fault,
        "committed": len(committed),
        "rolled back": rolled_back,
        "delivered": len(delivered & committed),
        "lost": len(committed - delivered),
        "rolled back delivered": rolled_back_delivered + len(delivered - committed),
        "dead": dead,
        "duplicates": len(received) - len(delivered),
        "recovery s": f"{recovery:.1f}",
        "total s": f"{time.monotonic() - started:.1f}",
    }
    ok = row["lost"] == 0 and row["rolled back delivered"] == 0 and dead == 0 and len(committed) > 0
    if ordered:
        row["keys"] = len(receiver.first_by_key)
        row["out of order"] = receiver.out_of_order()
        row["one key twice in flight"] = receiver.key_overlaps
        ok = ok and row["out of order"] == 0 and row["one key twice in flight"] == 0
    # In log mode the table path may hold nothing at all, and an aggregate over no row is null.
    if expect and sql(f"SELECT coalesce((SELECT {expect}), {str(LOG_MODE).lower()})") != "t":
        raise AssertionError(f"expected {expect}")
    return row, ok


def session(*statements, user="postgres"):
    """Runs each statement in turn in one psql session; returns psql's result (not checked)."""
    args = ["psql", "-h", "127.0.0.1", "-p", PORT, "-U", user, "-d", "postgres", "-X", "-tAq"]
    for statement in statements:
        args += ["-c", statement]
    return subprocess.run(args, capture_output=True, text=True)


def secrets_stay_out_of_the_log():
    """With every statement logged: 0.1.0's signing secret setting and a webhook URL carrying a
    password and a token are reloaded, secrets are generated and supplied (in statements that
    succeed, fail, pass them as bound parameters, and fail inside a savepoint), URLs with
    passwords are passed; the server log must show every statement, with only the secrets and
    passwords masked. A role with no privileges mentions a secret's prefix and the functions'
    names, and hides a statement in a secret-like literal: its statements are logged whole."""
    tag = f"{os.getpid()}{int(time.time())}"
    secret_key = base64.b64encode(f"secret-{tag}".encode()).decode()
    plain_url = f"http://127.0.0.1:{RECEIVER_PORT}/events"
    sql("ALTER SYSTEM SET log_statement = 'all'")
    sql(f"ALTER SYSTEM SET outbox.signing_secret = 'whsec_{secret_key}'")
    configure(webhook_url=f"http://relay:password-{tag}@127.0.0.1:{RECEIVER_PORT}/events?token=token-{tag}")
    log_path = f"{DATA}/../server.log"
    read_log = lambda: subprocess.run(["cat", log_path], capture_output=True, text=True).stdout
    wait_until("the reload is logged", lambda: 'parameter "outbox.signing_secret" changed (value hidden)' in read_log(), deadline=30)
    generated = sql("SELECT outbox_endpoint_rotate_secret('default')")  # signs what follows
    given = "whsec_" + base64.b64encode(f"given-secret-{tag}-0123456789".encode()).decode()
    sql(f"SELECT outbox_endpoint_rotate_secret('default', '{given}', '0 seconds') AS given_{tag}")
    # Failing statements are logged again as the error's STATEMENT (log_min_error_statement).
    for failing in (f"SELECT outbox_endpoint_rotate_secret('missing', '{given}') AS failing_{tag}",
                    f"SELECT outbox_endpoint_set('x_{tag}', 'https://relay:given-pw-{tag}@127.0.0.1/', '{{}}')"):
        try:
            sql(failing)
            raise AssertionError(f"{failing} should fail")
        except subprocess.CalledProcessError:
            pass
    # Bound parameters (the extended protocol, as drivers send them): the statement is logged
    # with $1, and the parameters in the line's detail.
    with psycopg.connect(f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute("SELECT outbox_endpoint_set('bound', %s)", [f"https://relay:bound-pw-{tag}@127.0.0.1/"])
        conn.execute("SELECT outbox_endpoint_rotate_secret('bound', %s)", [given])
        conn.execute("SELECT outbox_endpoint_drop('bound')")
    # One that fails inside a savepoint rolled back: what follows is logged as ever.
    rolled_back = session("BEGIN", "SAVEPOINT before_the_url",
                          f"SELECT outbox_endpoint_set('x_{tag}', 'https://relay:failing-pw-{tag}@127.0.0.1/', '{{}}') AS in_savepoint",
                          "ROLLBACK TO SAVEPOINT before_the_url",
                          f"SELECT 'after the savepoint {tag}'", "COMMIT")
    assert "at least one pattern" in rolled_back.stderr, rolled_back.stderr
    # A role with no privileges at all: its statements, failing or not, are in the log whole.
    sql(f"DROP ROLE IF EXISTS nobody_{tag}")
    sql(f"CREATE ROLE nobody_{tag} LOGIN")
    sql(f"CREATE TABLE IF NOT EXISTS audited_{tag} ()")
    evasive = (f"DROP TABLE audited_{tag}; /* whsec_ */",
               f"SELECT 'outbox_endpoint_set outbox_endpoint_rotate_secret whsec_' AS evading_{tag}",
               f"DO $$BEGIN PERFORM decode(substr('whsec_RFJPUCBUQUJMRSBhY2NvdW50cw==', 7), 'base64'); END$$ /* {tag} */")
    session(*evasive, user=f"nobody_{tag}")
    signed = sql("SELECT outbox_enqueue('signed', '{}')")
    wait_until("a signed event is delivered", lambda: sql(
        f"SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NOT NULL AND event_id = {signed}") == "1")
    log = read_log()
    sql(f"DROP TABLE audited_{tag}")
    sql(f"DROP ROLE nobody_{tag}")
    sql("ALTER SYSTEM RESET outbox.signing_secret")
    sql("ALTER SYSTEM RESET log_statement")
    configure(webhook_url=plain_url)
    leaked = [what for what in (secret_key, generated[6:], given[6:], f"given-pw-{tag}", f"password-{tag}", f"token-{tag}",
                                f"bound-pw-{tag}", f"failing-pw-{tag}")
              if what in log]
    if leaked:
        raise AssertionError(f"the server log shows {leaked}")
    # PostgreSQL 17 capitalised the detail that lists bound parameters.
    listed = "Parameters" if int(sql("SHOW server_version_num")) >= 170000 else "parameters"
    shown = [
        f"statement: SELECT outbox_endpoint_rotate_secret('default', 'whsec_***', '0 seconds') AS given_{tag}",
        f"STATEMENT:  SELECT outbox_endpoint_rotate_secret('missing', 'whsec_***') AS failing_{tag}",
        f"STATEMENT:  SELECT outbox_endpoint_set('x_{tag}', 'https://***@127.0.0.1/', '{{}}')",
        "execute <unnamed>: SELECT outbox_endpoint_set('bound', $1)",
        f"{listed}: $1 = 'https://***@127.0.0.1/'",
        f"{listed}: $1 = 'whsec_***'",
        f"statement: SELECT outbox_endpoint_set('x_{tag}', 'https://***@127.0.0.1/', '{{}}') AS in_savepoint",
        f"statement: SELECT 'after the savepoint {tag}'",
        f"statement: DROP TABLE audited_{tag}; /* whsec_ */",
        f"STATEMENT:  DROP TABLE audited_{tag}; /* whsec_ */",
        f"statement: SELECT 'outbox_endpoint_set outbox_endpoint_rotate_secret whsec_' AS evading_{tag}",
        "substr('whsec_RFJPUCBUQUJMRSBhY2NvdW50cw==', 7)",
    ]
    missing = [line for line in shown if line not in log]
    if missing:
        raise AssertionError(f"the server log lacks {missing}")
    assert "statement hidden" not in log, "no statement is hidden whole"
    print("== secrets stay out of the log: 0.1.0's signing secret setting and the webhook URL's password and token on "
          "reload, a generated secret, a supplied one and URL passwords in statements that succeeded, failed, bound "
          "them as parameters or failed in a savepoint all absent; every statement logged, with only those masked, "
          "also a role's that mention the secrets' prefix and the functions' names or hide a statement in a "
          "secret-like literal",
          flush=True)


def database_lifecycle():
    """Restarts the server serving a database that does not exist yet: the launcher waits for it
    quietly. Then the database is created and given the extension (events flow), dropped with a
    plain DROP DATABASE, created again (events flow again), and renamed. The server log must show
    one line of waiting each time and no FATAL and no ERROR."""
    name, log_path = "outbox_lifecycle", f"{DATA}/../server.log"

    def log_since(offset):
        return subprocess.run(["cat", log_path], capture_output=True, text=True).stdout[offset:]

    def in_database(query):
        return subprocess.run(["psql", "-h", "127.0.0.1", "-p", PORT, "-U", "postgres", "-d", name, "-X", "-tAq",
                               "-v", "ON_ERROR_STOP=1", "-c", query], check=True, capture_output=True, text=True).stdout.strip()

    def events_flow():
        in_database("CREATE EXTENSION IF NOT EXISTS outbox_ext")
        in_database("SELECT outbox_enqueue('lifecycle', '{}') FROM generate_series(1, 10)")
        wait_until("events flow in the new database",
                   lambda: in_database("SELECT count(*) FROM outbox_deliveries WHERE sent_at IS NOT NULL") == "10", deadline=60)

    sql(f"DROP DATABASE IF EXISTS {name}")
    sql(f"DROP DATABASE IF EXISTS {name}_renamed")
    sql(f"ALTER SYSTEM SET outbox.database = '{name}'")
    start = len(log_since(0))
    pg_ctl("-m", "fast", "restart", "-o", f"-p {PORT}", "-l", log_path, "-w")
    waiting = f'waiting for database "{name}"'
    wait_until("the launcher waits for the database", lambda: waiting in log_since(start), deadline=30)
    sql(f"CREATE DATABASE {name}")
    events_flow()
    sql(f"DROP DATABASE {name}")  # no FORCE: the workers leave by themselves
    wait_until("the launcher waits again", lambda: log_since(start).count(waiting) == 2, deadline=30)
    sql(f"CREATE DATABASE {name}")
    events_flow()
    sql(f"ALTER DATABASE {name} RENAME TO {name}_renamed")
    wait_until("the launcher waits for the renamed-away database", lambda: log_since(start).count(waiting) == 3, deadline=30)
    sql(f"DROP DATABASE {name}_renamed")
    log = log_since(start)
    sql("ALTER SYSTEM RESET outbox.database")
    pg_ctl("-m", "fast", "restart", "-o", f"-p {PORT}", "-l", log_path, "-w")
    problems = [line for line in log.splitlines() if "FATAL" in line or "ERROR" in line]
    if problems:
        raise AssertionError(f"the server log shows {problems[:5]}")
    print(f"== database lifecycle: waited quietly ({log.count(waiting)} lines), dropped and renamed without FORCE, "
          "no FATAL or ERROR", flush=True)


def main():
    receiver = Receiver()
    receiver.start()
    # Scenarios by name, comma-separated (e.g. FAULT_ONLY=two_replicas): only those run.
    only = [name for name in os.environ.get("FAULT_ONLY", "").split(",") if name]
    scenarios = LOG_SCENARIOS if LOG_MODE else SCENARIOS + ORDERED_SCENARIOS + (RELAY_SCENARIOS if RELAY_BINARY else [])
    # A name of another pass is fine (faults/run.sh runs them all); a misspelt one is not.
    known = {s.__name__ for s in SCENARIOS + ORDERED_SCENARIOS + RELAY_SCENARIOS + LOG_SCENARIOS + [pgbouncer_restarted]}
    unknown = [name for name in only if name not in known | {"database_lifecycle", "secrets_stay_out_of_the_log"}]
    if unknown:
        print(f"FAILED FAULT_ONLY names no scenario: {', '.join(unknown)}", file=sys.stderr)
        sys.exit(1)
    try:
        if RELAY_BINARY:
            RELAYS.configure(BASE_SETTINGS)
        elif not LOG_MODE and (not only or "database_lifecycle" in only):
            database_lifecycle()
    except (AssertionError, subprocess.CalledProcessError) as e:
        log = subprocess.run(["tail", "-n", "40", f"{DATA}/../server.log"], capture_output=True, text=True).stdout
        print(f"FAILED database_lifecycle: {e}\nend of the server log:\n{log}", file=sys.stderr)
        sys.exit(1)
    rows, failures = [], []
    try:
        if not RELAY_BINARY and not LOG_MODE and (not only or "secrets_stay_out_of_the_log" in only):
            secrets_stay_out_of_the_log()
    except AssertionError as e:
        failures.append(f"secrets_stay_out_of_the_log: {e}")
    for scenario in [s for s in scenarios if not only or s.__name__ in only]:
        print(f"== {scenario.__name__}", flush=True)
        try:
            row, ok = run(scenario, receiver)
        except AssertionError as e:
            failures.append(f"{scenario.__name__}: {e}")
            continue
        print("   " + ", ".join(f"{k}: {v}" for k, v in row.items()), flush=True)
        rows.append(row)
        if not ok:
            failures.append(f"{scenario.__name__}: {row}")
    for table in ([r for r in rows if "keys" not in r], [r for r in rows if "keys" in r]):
        if table:
            keys = list(table[0])
            print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
            for row in table:
                print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    RELAYS.stop_all()
    if LOG_MODE and not RELAY_BINARY:
        # The workers read the slot hundreds of times in these scenarios; PostgreSQL's lines for
        # each start of decoding stay out of the log (a slot made after a crash says it once).
        with open(f"{DATA}/../server.log") as log:
            said = sum("starting logical decoding" in line for line in log)
        if said > 20:
            failures.append(f"log mode: the server log says 'starting logical decoding' {said} times")
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
