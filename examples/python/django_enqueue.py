"""Enqueue from Django: the order and its event are written in one transaction.atomic() block, so
both commit or neither does; outbox_enqueue returns the event id, which receivers get as
webhook-id. The second order's payment is declined after both were written: nothing is left.
Run: DATABASE_URL=postgresql://app@db/shop python3 django_enqueue.py"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import django
from django.conf import settings


def database_settings(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for a postgresql:// URL (what dj-database-url does)."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": parts.port or "",
    }


# A project would have these in settings.py; standalone, they are configured here.
settings.configure(DATABASES={"default": database_settings(os.environ["DATABASE_URL"])}, USE_TZ=True)
django.setup()

from django.db import connection, models, transaction  # noqa: E402  (needs the settings above)


class Order(models.Model):
    id = models.BigAutoField(primary_key=True)
    customer = models.TextField()
    total = models.DecimalField(max_digits=10, decimal_places=2)

    class Meta:
        app_label = "shop"
        db_table = "orders"
        managed = False  # the shop's table (examples/test.sh creates it), not a migration's


class PaymentDeclined(Exception):
    def __init__(self, order_id: int, event_id: int) -> None:
        super().__init__(f"payment declined for order {order_id}")
        self.order_id, self.event_id = order_id, event_id


def enqueue(topic: str, payload: dict[str, Any]) -> int:
    """Writes the event in the current transaction and returns its id (the webhook-id)."""
    # connection.cursor() is the connection that atomic() holds the transaction on.
    with connection.cursor() as cursor:
        cursor.execute("SELECT outbox.outbox_enqueue(%s, %s::jsonb)", [topic, json.dumps(payload)])
        return cursor.fetchone()[0]


def place_order(customer: str, total: Decimal, *, payment_ok: bool = True) -> tuple[int, int]:
    """Saves the order and enqueues order.placed in one transaction; returns (order id, event id)."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=total)
        event_id = enqueue("order.placed", {"order_id": order.id, "customer": customer, "total": str(total)})
        if not payment_ok:
            raise PaymentDeclined(order.id, event_id)  # leaves atomic(): the order and the event roll back
    return order.id, event_id


def main() -> None:
    order_id, event_id = place_order("alice", Decimal("42.50"))
    print(f"committed order_id={order_id} event_id={event_id}")
    try:
        place_order("bob", Decimal("13.00"), payment_ok=False)
    except PaymentDeclined as declined:
        print(f"rolled back order_id={declined.order_id} event_id={declined.event_id}")


if __name__ == "__main__":
    main()
