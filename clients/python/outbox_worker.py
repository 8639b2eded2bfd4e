"""Pull-endpoint worker for outbox_ext: claim, handle, ack in one transaction, nack on failure.

Public API (copy this file or import it; the only dependency is psycopg 3.2+):

    Job(event_id, topic, payload, key, attempt, created_at)       # a claimed delivery (frozen)
    Worker(conninfo, endpoint, handler, handlers=4, consumer=None,
           lease='30 seconds', poll=1.0, grace=10.0, on_event=None, schema='public')
    Worker.run()    # blocks; returns after stop() / SIGTERM / SIGINT, once in-flight jobs end
    Worker.stop()   # from any thread or a signal handler: stop claiming, then shut down

handler(conn, job) runs inside the job's transaction on that handler's own connection: do the
job's database work with conn, do not commit or roll back, raise to fail the attempt. Its work,
the outbox_mark_processed mark and the outbox_ack commit together or not at all, so an effect
is applied at most once per consumer even when a lease runs out and the job runs elsewhere.
A job that raises is rolled back and nacked (the extension's backoff; dead at max_attempts).

on_event(kind, job) is called, one call at a time, with kind one of: 'ready' (the first claim
was attempted, LISTEN is in place; job None), 'handled', 'duplicate' (already processed by this
consumer: handler skipped, delivery acked), 'nacked', 'lost' (ack or nack returned false: the
lease ran out and another claim owns the delivery; nothing was committed), 'stopping',
'stopped' (job None). The default logs them. Errors are logged to the 'outbox_worker' logger.

schema (default 'public') is the schema outbox_ext was installed in: every function is called by
that name, so that no other schema's function of the same name can be called instead.

poll and grace are seconds; lease is PostgreSQL interval text. SIGTERM and SIGINT call stop()
when run() is called from the main thread.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional

import psycopg
from psycopg import sql

__all__ = ["Job", "Worker"]

log = logging.getLogger("outbox_worker")

# Every wait is cut into slices this long so that stop() (which may run in a signal handler,
# where taking a lock could deadlock) is noticed by polling a plain flag.
_SLICE = 0.1
_BACKOFF_FIRST, _BACKOFF_MAX = 0.1, 5.0


@dataclass(frozen=True, slots=True)
class Job:
    event_id: int
    topic: str
    payload: Any  # the jsonb payload, decoded (usually a dict)
    key: Optional[str]
    attempt: int  # the fencing token: ack/nack name it
    created_at: datetime


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class Worker:
    def __init__(
        self,
        conninfo: str,
        endpoint: str,
        handler: Callable[[psycopg.Connection, Job], None],
        handlers: int = 4,
        consumer: Optional[str] = None,
        lease: str = "30 seconds",
        poll: float = 1.0,
        grace: float = 10.0,
        on_event: Optional[Callable[[str, Optional[Job]], None]] = None,
        schema: str = "public",
    ) -> None:
        if handlers < 1:
            raise ValueError("handlers must be at least 1")
        self.conninfo, self.endpoint, self.handler = conninfo, endpoint, handler
        self.handlers, self.consumer = handlers, consumer or endpoint
        self.lease, self.poll, self.grace = lease, poll, grace
        self.on_event = on_event or (lambda kind, job: log.info("%s %s", kind, job or ""))
        # Each call names the extension's schema and casts its arguments to the declared types
        # (psycopg sends str untyped and int as the smallest int): so neither a function of the
        # same name elsewhere on the search_path nor a looser overload can be called instead.
        self._claim_sql = sql.SQL(
            "SELECT event_id, topic, payload, key, attempt, created_at FROM {}(%s::text, %s::integer, %s::interval)"
        ).format(sql.Identifier(schema, "outbox_claim"))
        self._mark_sql = sql.SQL("SELECT {}(%s::bigint, %s::text)").format(sql.Identifier(schema, "outbox_mark_processed"))
        self._ack_sql = sql.SQL("SELECT {}(%s::text, %s::bigint, %s::integer)").format(sql.Identifier(schema, "outbox_ack"))
        self._nack_sql = sql.SQL("SELECT {}(%s::text, %s::bigint, %s::integer, %s::text)").format(
            sql.Identifier(schema, "outbox_nack")
        )
        self._stopping = False  # plain bool: safe to set from a signal handler
        self._stopped = False
        self._jobs: queue.Queue[Optional[Job]] = queue.Queue()
        self._idle = 0  # handler threads that are connected and waiting for a job
        self._idle_changed = threading.Condition()
        self._report_lock = threading.Lock()
        self._conns: dict[int, psycopg.Connection] = {}  # handler index -> its connection

    # -- public -------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        restore = self._install_signals()
        threads = [
            threading.Thread(target=self._handler_loop, args=(i,), name=f"outbox-handler-{i}", daemon=True)
            for i in range(self.handlers)
        ]
        for t in threads:
            t.start()
        try:
            self._claim_loop()
        finally:
            self._stopping = True
            self._report("stopping")
            self._shut_down(threads)
            self._report("stopped")
            restore()

    # -- claiming (the thread that called run) --------------------------------------------------

    def _claim_loop(self) -> None:
        conn: Optional[psycopg.Connection] = None
        ready_reported = False
        backoff = _BACKOFF_FIRST
        while not self._stopping:
            if conn is None:
                conn = self._connect(listen=True)
                if conn is None:  # stopped while reconnecting
                    break
            free = self._wait_for_idle_handler()
            if free == 0:
                break
            try:
                # Notifications that arrived before this claim are answered by it: drop them, so
                # that a backlog gathered while every handler was busy does not cause empty claims.
                for _ in conn.notifies(timeout=0):
                    pass
                rows = conn.execute(self._claim_sql, (self.endpoint, min(free, 1000), self.lease)).fetchall()
                backoff = _BACKOFF_FIRST
            except psycopg.Error as e:
                rows = None
                log.error("claim on %s failed: %s", self.endpoint, _one_line(e))
                if conn.closed:
                    conn = None  # reconnect (with backoff) on the next turn
                else:
                    self._sleep(backoff)  # e.g. the endpoint does not exist: do not spin
                    backoff = min(backoff * 2, _BACKOFF_MAX)
            if not ready_reported:
                ready_reported = True
                self._report("ready")
            if rows is None:
                continue
            with self._idle_changed:
                self._idle -= len(rows)  # only this thread decrements, so it cannot go negative
            for row in rows:
                self._jobs.put(Job(*row))
            if not rows and not self._wait_for_notification(conn):
                conn = None
        if conn is not None:
            conn.close()

    def _wait_for_idle_handler(self) -> int:
        """How many handlers are idle, once one is (0 if stopping): claim only what can start now."""
        with self._idle_changed:
            while self._idle == 0 and not self._stopping:
                self._idle_changed.wait(_SLICE)
            return 0 if self._stopping else self._idle

    def _wait_for_notification(self, conn: psycopg.Connection) -> bool:
        """Until a NOTIFY on the endpoint's channel, the poll interval or stop(); False if the
        connection was lost."""
        deadline = time.monotonic() + self.poll
        try:
            while not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                for _ in conn.notifies(timeout=min(left, _SLICE), stop_after=1):
                    return True
            return True
        except psycopg.Error as e:
            log.error("waiting for notifications on %s failed: %s", self.endpoint, _one_line(e))
            conn.close()
            return False

    # -- handling (one thread and one connection per handler) ---------------------------------

    def _handler_loop(self, index: int) -> None:
        conn: Optional[psycopg.Connection] = None
        while True:
            if conn is None or conn.closed:
                # Connect before offering to take a job, so no job is claimed for a handler
                # that could not run it.
                conn = self._connect(listen=False)
                if conn is None:
                    return
                self._conns[index] = conn
            with self._idle_changed:
                self._idle += 1
                self._idle_changed.notify()
            job = self._jobs.get()
            if job is None:  # shutting down
                conn.close()
                return
            try:
                if self._handle(conn, job):
                    # The connection died while idle (e.g. a server restart): nothing was done
                    # and the claim is still ours, so run the job once more on a new one
                    # rather than leave it to its lease.
                    conn = self._connect(listen=False)
                    if conn is None:
                        return
                    self._conns[index] = conn
                    self._handle(conn, job, retry=False)
            except Exception:  # a bug here must not kill the thread and its slot
                log.exception("handling event %s failed unexpectedly", job.event_id)
                conn.close()

    def _handle(self, conn: psycopg.Connection, job: Job, retry: bool = True) -> bool:
        """Runs one job; True if the connection was found dead before the job began (when retry)."""
        began = False
        try:
            first = conn.execute(self._mark_sql, (job.event_id, self.consumer)).fetchone()[0]
            began = True
            if first:
                self.handler(conn, job)
            # The ack is in the same transaction as the effect: if another consumer claimed the
            # delivery since (our lease ran out), ack is false and the effect is rolled back.
            acked = conn.execute(self._ack_sql, (self.endpoint, job.event_id, job.attempt)).fetchone()[0]
            if acked:
                conn.commit()
                self._report("handled" if first else "duplicate", job)
            else:
                conn.rollback()
                log.warning("event %s attempt %s: lease lost to another claim, rolled back", job.event_id, job.attempt)
                self._report("lost", job)
            return False
        except Exception as e:
            if conn.closed:
                if retry and not began:
                    log.warning("connection found lost before event %s began: %s", job.event_id, _one_line(e))
                    return True
                self._connection_lost(job, e)
                return False
            error = e
        try:
            conn.rollback()
            nacked = conn.execute(
                self._nack_sql, (self.endpoint, job.event_id, job.attempt, _one_line(error))
            ).fetchone()[0]
            conn.commit()
        except psycopg.Error as e:
            if conn.closed:
                self._connection_lost(job, e)
            else:
                conn.rollback()
                log.error("nack of event %s failed: %s; it returns when its lease ends", job.event_id, _one_line(e))
            return False
        log.warning("event %s attempt %s failed: %s", job.event_id, job.attempt, _one_line(error))
        self._report("nacked" if nacked else "lost", job)
        return False

    def _connection_lost(self, job: Job, error: BaseException) -> None:
        # Whatever the transaction did was rolled back by the server (or committed whole if the
        # connection died during COMMIT, which mark_processed makes harmless); either way the
        # delivery comes back when its lease ends.
        log.error("connection lost while handling event %s: %s", job.event_id, _one_line(error))

    # -- shutdown -----------------------------------------------------------------------------

    def _shut_down(self, threads: list[threading.Thread]) -> None:
        for _ in threads:
            self._jobs.put(None)  # after any job already queued: those still run
        deadline = time.monotonic() + self.grace
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for index, t in enumerate(threads):
            if t.is_alive() and index in self._conns:
                log.warning("%s still busy after the grace period: abandoning its job to its lease", t.name)
                self._abort(self._conns[index])

    @staticmethod
    def _abort(conn: psycopg.Connection) -> None:
        """Close a connection that another thread is using, without racing it inside libpq:
        shut its socket down (that thread's next call fails; the server rolls back) and cancel
        any query the server is still running for it."""
        try:
            with socket.socket(fileno=os.dup(conn.fileno())) as s:
                s.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.Error):
            pass
        try:
            conn.cancel_safe(timeout=2.0)
        except (OSError, psycopg.Error):
            pass

    # -- helpers ------------------------------------------------------------------------------

    def _connect(self, listen: bool) -> Optional[psycopg.Connection]:
        """A new connection, retried with exponential backoff; None once stop() was called."""
        delay = _BACKOFF_FIRST
        while not self._stopping:
            conn = None
            try:
                # The claiming connection is in autocommit: each claim is its own transaction
                # (its lease starts then) and notifications arrive between statements.
                # Unnamed statements only (prepare_threshold=None): a pooler in transaction mode
                # may run each on another server, where a named one is unknown.
                conn = psycopg.connect(self.conninfo, autocommit=listen, prepare_threshold=None)
                if listen:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier("outbox." + self.endpoint)))
                return conn
            except psycopg.Error as e:
                if conn is not None:
                    conn.close()
                log.error("cannot connect (retrying in %.1f s): %s", delay, _one_line(e))
                self._sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
        return None

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _SLICE))

    def _report(self, kind: str, job: Optional[Job] = None) -> None:
        with self._report_lock:
            if self._stopped:
                return  # an abandoned handler finishing late: 'stopped' stays the last word
            self._stopped = kind == "stopped"
            try:
                self.on_event(kind, job)
            except Exception:
                log.exception("on_event(%r) failed", kind)

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None  # only the main thread may set handlers: the caller uses stop()
        previous = {s: signal.signal(s, lambda *_: self.stop()) for s in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore
