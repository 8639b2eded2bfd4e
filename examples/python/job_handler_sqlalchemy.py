"""A background job handler on a pull endpoint, with SQLAlchemy: for each claimed job, the ORM writes,
outbox_mark_processed and outbox_ack run in ONE transaction on the Session's connection, so the
effect, its dedupe mark and the ack commit together or not at all. A job that raises is rolled
back whole and nacked: retried with backoff, dead at the endpoint's max_attempts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, Engine, ForeignKey, Numeric, create_engine, make_url, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker

ENDPOINT = "receipts"  # the pull endpoint the jobs are routed to
CONSUMER = "receipts"  # this handler's name in processed_events

log = logging.getLogger("receipts")


class Base(DeclarativeBase):
    pass


class Receipt(Base):
    __tablename__ = "receipts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    order_id: Mapped[int] = mapped_column(BigInteger)
    total: Mapped[Decimal] = mapped_column(Numeric(10, 2))
    lines: Mapped[list[ReceiptLine]] = relationship()


class ReceiptLine(Base):
    __tablename__ = "receipt_lines"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    receipt_id: Mapped[int] = mapped_column(ForeignKey("receipts.id"))
    description: Mapped[str]
    amount: Mapped[Decimal] = mapped_column(Numeric(10, 2))  # the table checks amount > 0


@dataclass(frozen=True)
class Job:
    event_id: int
    topic: str
    payload: Any
    attempt: int  # the claim's fencing token: ack and nack name it


class LeaseLost(Exception):
    """The lease ran out and another claim owns the job: our effect must not commit."""


# The claim is one autocommit statement; the others run in the job's transaction.
CLAIM = text(
    "SELECT event_id, topic, payload, attempt"
    "  FROM outbox.outbox_claim(:endpoint, :max_events, CAST(:lease AS interval))"
)
MARK_PROCESSED = text("SELECT outbox.outbox_mark_processed(:event_id, :consumer)")
ACK = text("SELECT outbox.outbox_ack(:endpoint, :event_id, :attempt)")
NACK = text("SELECT outbox.outbox_nack(:endpoint, :event_id, :attempt, :error)")


def issue_receipt(session: Session, payload: dict[str, Any]) -> None:
    """The job's effect, through the ORM: a receipt and its lines."""
    lines = [ReceiptLine(description=line["description"], amount=Decimal(line["amount"])) for line in payload["lines"]]
    session.add(Receipt(order_id=payload["order_id"], total=sum(line.amount for line in lines), lines=lines))


def handle(sessions: sessionmaker[Session], job: Job) -> str:
    """Runs one job in one transaction; returns 'receipted' or 'duplicate', raises if it failed."""
    if job.topic != "receipt.requested":
        raise ValueError(f"no handler for topic {job.topic!r}")
    # Everything below runs on the connection this transaction holds. ORM writes made through
    # another Session or engine connection would commit on their own, and a failure or a lost
    # lease after them would leave the effect without its mark: applied again on the retry.
    with sessions.begin() as session:
        first = session.execute(MARK_PROCESSED, {"event_id": job.event_id, "consumer": CONSUMER}).scalar_one()
        if first:
            issue_receipt(session, job.payload)
            # Write the ORM's rows now rather than at commit: a row the database refuses fails
            # the job here, and the ack stays the last statement before COMMIT, as it must.
            session.flush()
        if not session.execute(ACK, {"endpoint": ENDPOINT, "event_id": job.event_id, "attempt": job.attempt}).scalar_one():
            raise LeaseLost(f"event {job.event_id} attempt {job.attempt} was claimed again")
    return "receipted" if first else "duplicate"


def nack(engine: Engine, job: Job, error: Exception) -> bool:
    """Records the failure on the delivery; False if the claim is no longer ours."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    with engine.begin() as db:
        return db.execute(
            NACK, {"endpoint": ENDPOINT, "event_id": job.event_id, "attempt": job.attempt, "error": reason}
        ).scalar_one()


def drain(engine: Engine, batch: int = 10, lease: str = "30 seconds") -> None:
    """Handles the due jobs until none is left, then returns: run it from a scheduler. (For a
    long-running worker that waits on LISTEN and stops gracefully, see clients/python.)"""
    sessions = sessionmaker(engine)
    claiming = engine.execution_options(isolation_level="AUTOCOMMIT")
    while True:
        with claiming.connect() as db:
            rows = db.execute(CLAIM, {"endpoint": ENDPOINT, "max_events": batch, "lease": lease}).all()
        if not rows:
            return
        for row in rows:
            job = Job(*row)
            try:
                outcome = handle(sessions, job)
            except LeaseLost as error:
                log.warning("%s: rolled back; the other claim will handle it", error)
                outcome = "lost"
            except Exception as error:  # any failure of the job: rolled back, reported by the nack
                log.warning("event %s attempt %s failed: %s", job.event_id, job.attempt, error)
                outcome = "nacked" if nack(engine, job, error) else "lost"
            print(f"{outcome} {job.event_id}", flush=True)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = create_engine(make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql+psycopg"))
    drain(engine)
    engine.dispose()


if __name__ == "__main__":
    main()
