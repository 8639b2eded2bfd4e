#!/usr/bin/env python3
"""The same scenarios against each language's client, through its test program.

    clients/conformance.py NAME PROGRAM [ARGS...]

PROGRAM ARGS is how to start the language's test program (see clients/README.md: it takes
`enqueue-and-rollback TOPIC` or `work`, configured by the environment). DATABASE_URL names a
cluster with outbox_ext installed; the scenarios use endpoints and topics prefixed with NAME,
so several languages can run against one cluster. Each scenario waits for conditions with a
deadline, never for a fixed time, and fails with what it saw.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import psycopg

DATABASE_URL = os.environ["DATABASE_URL"]


class Failed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failed(what)


def wait_until(what, condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.02)


class Worker:
    """A running `work` process; its stdout lines are collected as they come."""

    def __init__(self, program, name, endpoint, **settings):
        env = dict(os.environ, OUTBOX_ENDPOINT=endpoint, WORKER_NAME=name, HANDLERS="4", LEASE="30 seconds",
                   POLL_MS="200", GRACE_MS="10000", BEHAVIOUR="apply", HANDLE_MS="0")
        env.update({key.upper(): str(value) for key, value in settings.items()})
        self.name = name
        self.lines = []
        self.process = subprocess.Popen(program + ["work"], env=env, stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def said(self, word):
        return [line for line in self.lines if line.split(" ")[0] == word]

    def stop(self, timeout=20.0):
        """SIGTERM, then the exit status (killed and failed after timeout)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise Failed(f"{self.name} did not exit within {timeout:.0f} s of SIGTERM")
        self.reader.join(5)
        return status

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Scenarios:
    def __init__(self, name, program):
        self.name, self.program = name, program
        self.db = psycopg.connect(DATABASE_URL, autocommit=True, prepare_threshold=None)
        self.workers = []
        self.db.execute("CREATE TABLE IF NOT EXISTS client_effects (event_id bigint, worker text, applied_at timestamptz DEFAULT now())")

    def value(self, sql, *args):
        return self.db.execute(sql, args).fetchone()[0]

    def endpoint(self, suffix, **options):
        """A fresh pull endpoint NAME_suffix on topics NAME.suffix.*, with no deliveries."""
        name = f"{self.name}_{suffix}"
        if self.value("SELECT count(*) FROM outbox_endpoints WHERE name = %s", name):
            self.db.execute("SELECT outbox_endpoint_drop(%s)", (name,))
        extra = "".join(f", {key} => {value}" for key, value in options.items())
        self.db.execute(f"SELECT outbox_endpoint_set(%s, NULL, %s, kind => 'pull', notify => true{extra})",
                        (name, [f"{self.name}.{suffix}.*"]))
        return name

    def enqueue(self, endpoint, count):
        topic = endpoint.replace("_", ".", 1) + ".job"
        return [row[0] for row in self.db.execute(
            "SELECT outbox_enqueue(%s, jsonb_build_object('n', n)) FROM generate_series(1, %s) AS n", (topic, count))]

    def worker(self, name, endpoint, **settings):
        worker = Worker(self.program, f"{self.name}-{name}", endpoint, **settings)
        self.workers.append(worker)
        return worker

    def count(self, endpoint, condition):
        return self.value(f"SELECT count(*) FROM outbox_deliveries WHERE endpoint = %s AND {condition}", endpoint)

    def effects(self, ids):
        rows = self.db.execute("SELECT event_id, worker FROM client_effects WHERE event_id = ANY(%s)", (ids,)).fetchall()
        return rows

    # The scenarios.

    def a_rollback_leaves_no_event_and_no_job(self):
        endpoint = self.endpoint("rollback")
        topic = f"{self.name}.rollback.job"
        subprocess.run(self.program + ["enqueue-and-rollback", topic], check=True, timeout=30)
        check(self.value("SELECT count(*) FROM outbox WHERE topic = %s", topic) == 0, "the rolled-back event is in outbox")
        check(self.count(endpoint, "true") == 0, "the rolled-back job has a delivery")

    def two_workers_handle_200_jobs_each_exactly_once_and_both_take_part(self):
        endpoint = self.endpoint("pair")
        ids = self.enqueue(endpoint, 200)
        first, second = (self.worker(n, endpoint, handle_ms=5) for n in ("a", "b"))
        wait_until("all 200 jobs are acked", lambda: self.count(endpoint, "sent_at IS NOT NULL") == 200, 60)
        check([first.stop(), second.stop()] == [0, 0], "a worker did not exit 0 on SIGTERM")
        effects = self.effects(ids)
        check(len(effects) == 200 and len({e for e, _ in effects}) == 200, f"{len(effects)} effects for 200 jobs")
        takers = {w for _, w in effects}
        check(takers == {first.name, second.name}, f"only {sorted(takers)} took part")
        check(self.count(endpoint, "attempts <> 1") == 0, "a job was attempted more than once")
        self.replayed_jobs_change_nothing(endpoint, ids)

    def replayed_jobs_change_nothing(self, endpoint, ids):
        # A redelivery: the same events delivered again, as after a consumer crashed between
        # its commit and the broker's ack. outbox_mark_processed makes them no-ops.
        replayed = self.value("SELECT outbox_replay(%s, (SELECT min(created_at) FROM outbox WHERE id = ANY(%s)))", endpoint, ids)
        check(replayed == 200, f"replay reset {replayed} deliveries")
        again = self.worker("again", endpoint)
        wait_until("the replayed jobs are acked", lambda: self.count(endpoint, "sent_at IS NOT NULL") == 200, 60)
        check(again.stop() == 0, "the worker did not exit 0")
        check(len(self.effects(ids)) == 200, "a replayed job applied its effect again")
        check(len(again.said("duplicate")) == 200, f"{len(again.said('duplicate'))} of 200 replays were seen as duplicates")

    def a_handler_that_always_fails_makes_the_job_dead_after_3_attempts(self):
        endpoint = self.endpoint("failing", max_attempts=3)
        [job] = self.enqueue(endpoint, 1)
        worker = self.worker("failing", endpoint, behaviour="fail")
        # Backoff after attempts 1 and 2: at most 1 s and 2 s.
        wait_until("the job is dead", lambda: self.count(endpoint, "dead_at IS NOT NULL") == 1, 30)
        check(worker.stop() == 0, "the worker did not exit 0")
        row = self.db.execute("SELECT attempts, last_error FROM outbox_deliveries WHERE endpoint = %s AND event_id = %s",
                              (endpoint, job)).fetchone()
        check(row[0] == 3 and "always fails" in row[1], f"dead after {row[0]} attempts with {row[1]!r}")
        check(len(worker.said("nacked")) == 3, f"{len(worker.said('nacked'))} nacks")
        check(not self.effects([job]), "a failed handler's effect was kept")

    def sigterm_with_jobs_in_flight_finishes_them_and_claims_nothing_more(self):
        endpoint = self.endpoint("sigterm")
        ids = self.enqueue(endpoint, 20)
        worker = self.worker("stopping", endpoint, handle_ms=1500, handlers=4)
        wait_until("four jobs are in flight", lambda: self.count(endpoint, "attempts = 1 AND sent_at IS NULL") == 4)
        check(worker.stop() == 0, "the worker did not exit 0 after a graceful stop")
        check(worker.said("stopping") and worker.said("stopped"), f"it said {worker.lines}")
        check(self.count(endpoint, "sent_at IS NOT NULL") == 4, "the jobs in flight did not all finish")
        check(self.count(endpoint, "attempts = 0") == 16, "a job was claimed after SIGTERM")
        rest = self.worker("rest", endpoint)
        wait_until("the other 16 are acked", lambda: self.count(endpoint, "sent_at IS NOT NULL") == 20)
        check(rest.stop() == 0, "the worker did not exit 0")
        effects = self.effects(ids)
        check(len(effects) == 20 and len({e for e, _ in effects}) == 20, "a job was lost or applied twice")

    def a_handler_stalling_past_its_lease_cannot_ack_after_another_took_over(self):
        endpoint = self.endpoint("fencing")
        [job] = self.enqueue(endpoint, 1)
        stalled = self.worker("stalled", endpoint, lease="1 second", handle_ms=4000, handlers=1)
        wait_until("the stalled worker claimed the job", lambda: self.count(endpoint, "attempts = 1") == 1)
        other = self.worker("other", endpoint, handlers=1)
        wait_until("the stalled worker is told it lost the claim", lambda: stalled.said("lost"), 30)
        wait_until("the other worker acked the job", lambda: self.count(endpoint, "sent_at IS NOT NULL") == 1)
        check([stalled.stop(), other.stop()] == [0, 0], "a worker did not exit 0")
        check(self.effects([job]) == [(job, other.name)], f"effects {self.effects([job])}: the stalled worker's must be rolled back")
        check(self.value("SELECT attempts FROM outbox_deliveries WHERE endpoint = %s AND event_id = %s", endpoint, job) == 2,
              "the job was not acked by its second claim")

    def run(self):
        failed = 0
        for scenario in [
            self.a_rollback_leaves_no_event_and_no_job,
            self.two_workers_handle_200_jobs_each_exactly_once_and_both_take_part,
            self.a_handler_that_always_fails_makes_the_job_dead_after_3_attempts,
            self.sigterm_with_jobs_in_flight_finishes_them_and_claims_nothing_more,
            self.a_handler_stalling_past_its_lease_cannot_ack_after_another_took_over,
        ]:
            started = time.monotonic()
            try:
                scenario()
                print(f"clients {self.name}: {scenario.__name__} ... ok ({time.monotonic() - started:.1f} s)", flush=True)
            except Exception as error:  # noqa: BLE001 - every failure is reported, then the next scenario runs
                failed += 1
                print(f"clients {self.name}: {scenario.__name__} ... FAILED: {error}", flush=True)
                for worker in self.workers:
                    print(f"  {worker.name} said: {' | '.join(worker.lines[-20:])}", flush=True)
            finally:
                for worker in self.workers:
                    worker.kill()
                self.workers.clear()
        return failed


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(1 if Scenarios(sys.argv[1], sys.argv[2:]).run() else 0)
