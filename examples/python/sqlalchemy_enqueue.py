"""Enqueue from SQLAlchemy: the ORM insert and outbox_enqueue run in the Session's transaction, so
the order and its event commit or roll back together; outbox_enqueue returns the event id, which
receivers get as webhook-id. The second order's payment is declined after both were written.
Run: DATABASE_URL=postgresql://app@db/shop python3 sqlalchemy_enqueue.py"""

from __future__ import annotations

import json
import os
from decimal import Decimal

from sqlalchemy import BigInteger, Engine, Numeric, create_engine, make_url, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer: Mapped[str]
    total: Mapped[Decimal] = mapped_column(Numeric(10, 2))


class PaymentDeclined(Exception):
    def __init__(self, order_id: int, event_id: int) -> None:
        super().__init__(f"payment declined for order {order_id}")
        self.order_id, self.event_id = order_id, event_id


ENQUEUE = text("SELECT outbox.outbox_enqueue(:topic, CAST(:payload AS jsonb))")


def place_order(engine: Engine, customer: str, total: Decimal, *, payment_ok: bool = True) -> tuple[int, int]:
    """Saves the order and enqueues order.placed in one transaction; returns (order id, event id)."""
    # session.begin() commits when the block ends and rolls back when it raises.
    with Session(engine) as session, session.begin():
        order = Order(customer=customer, total=total)
        session.add(order)
        session.flush()  # the INSERT, now: the payload needs the order's id
        # session.execute runs on the Session's connection, inside its transaction.
        payload = {"order_id": order.id, "customer": customer, "total": str(total)}
        event_id = session.execute(ENQUEUE, {"topic": "order.placed", "payload": json.dumps(payload)}).scalar_one()
        if not payment_ok:
            raise PaymentDeclined(order.id, event_id)  # the order and the event roll back together
        return order.id, event_id


def main() -> None:
    # postgresql:// would pick psycopg2; this uses psycopg 3.
    engine = create_engine(make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql+psycopg"))
    order_id, event_id = place_order(engine, "carol", Decimal("19.90"))
    print(f"committed order_id={order_id} event_id={event_id}")
    try:
        place_order(engine, "dave", Decimal("5.00"), payment_ok=False)
    except PaymentDeclined as declined:
        print(f"rolled back order_id={declined.order_id} event_id={declined.event_id}")
    engine.dispose()


if __name__ == "__main__":
    main()
