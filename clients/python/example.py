"""Test program for outbox_worker (the CLI every language's client shares).

    python3 example.py enqueue-and-rollback TOPIC
    python3 example.py work

`work` is configured by the environment: DATABASE_URL, OUTBOX_ENDPOINT, OUTBOX_CONSUMER
(optional), WORKER_NAME, HANDLERS, LEASE, POLL_MS, GRACE_MS, BEHAVIOUR (apply | fail | none:
the benchmark's handler, which does nothing) and HANDLE_MS. It prints one line per event on stdout: ready, handled/duplicate/nacked/lost
<event_id> <attempt>, stopping, stopped.
"""

import logging
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outbox_worker import Job, Worker  # noqa: E402


def enqueue_and_rollback(url: str, topic: str) -> None:
    conn = psycopg.connect(url)  # not autocommit: the enqueue is in an open transaction
    try:
        conn.execute("SELECT outbox_enqueue(%s, %s::jsonb)", (topic, '{"rolled_back": true}'))
        conn.rollback()
    finally:
        conn.close()


def work(url: str) -> None:
    env = os.environ
    name = env.get("WORKER_NAME") or f"py-{os.getpid()}"
    behaviour = env.get("BEHAVIOUR") or "apply"
    handle_s = int(env.get("HANDLE_MS") or 0) / 1000
    if behaviour not in ("apply", "fail", "none"):
        sys.exit(f"BEHAVIOUR must be apply, fail or none, not {behaviour!r}")

    def handler(conn: psycopg.Connection, job: Job) -> None:
        if behaviour == "fail":
            raise RuntimeError("always fails")
        if behaviour == "none":
            return
        time.sleep(handle_s)
        conn.execute("INSERT INTO client_effects (event_id, worker) VALUES (%s, %s)", (job.event_id, name))

    def on_event(kind: str, job: "Job | None") -> None:
        line = kind if job is None else f"{kind} {job.event_id} {job.attempt}"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"{name} %(levelname)s %(message)s")
    Worker(
        url,
        env["OUTBOX_ENDPOINT"],
        handler,
        handlers=int(env.get("HANDLERS") or 4),
        consumer=env.get("OUTBOX_CONSUMER") or None,
        lease=env.get("LEASE") or "30 seconds",
        poll=int(env.get("POLL_MS") or 1000) / 1000,
        grace=int(env.get("GRACE_MS") or 10000) / 1000,
        on_event=on_event,
        schema=env.get("OUTBOX_SCHEMA") or "public",
    ).run()


def main() -> None:
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:15329/postgres")
    if sys.argv[1:2] == ["enqueue-and-rollback"] and len(sys.argv) == 3:
        enqueue_and_rollback(url, sys.argv[2])
    elif sys.argv[1:] == ["work"]:
        work(url)
    else:
        sys.exit("usage: example.py enqueue-and-rollback TOPIC | example.py work")
    sys.exit(0)


if __name__ == "__main__":
    main()
