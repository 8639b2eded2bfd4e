"""A webhook receiver in Flask, served by waitress: verifies the Standard Webhooks signature, applies
each event once by recording its webhook-id with outbox_mark_processed in the transaction that
updates the balance, and answers 2xx for applied, duplicate and rejected events alike.
Run: DATABASE_URL=postgresql://billing@db/billing WEBHOOK_SECRET=whsec_... PORT=8000 python3 receiver_flask.py"""

from __future__ import annotations

import logging
import os
import re
from decimal import Decimal
from typing import Any

from flask import Flask, request
from sqlalchemy import create_engine, make_url, text
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from waitress import serve

# This service's name in processed_events: each consuming service dedupes in its own namespace.
CONSUMER = "billing"
AMOUNT = re.compile(r"\d{1,8}(\.\d{1,2})?")

MARK_PROCESSED = text("SELECT outbox.outbox_mark_processed(:event_id, :consumer)")
ADD_TO_BALANCE = text(
    "INSERT INTO balances (customer, total) VALUES (:customer, :amount)"
    " ON CONFLICT (customer) DO UPDATE SET total = balances.total + excluded.total"
)
RECORD_REJECTED = text("INSERT INTO rejected_events (event_id, reason) VALUES (:event_id, :reason)")

app = Flask(__name__)
engine = create_engine(make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql+psycopg"))
webhook = Webhook(os.environ["WEBHOOK_SECRET"])  # the endpoint's secret, given to this service only


class Rejected(Exception):
    """An event this service will never accept: a retry would fail the same way."""


def parse_order_placed(event: dict[str, Any]) -> tuple[str, Decimal]:
    if event.get("type") != "order.placed":
        raise Rejected(f"unexpected type {event.get('type')!r}")
    data = event.get("data")
    customer = data.get("customer") if isinstance(data, dict) else None
    total = data.get("total") if isinstance(data, dict) else None
    if not isinstance(customer, str) or not customer:
        raise Rejected("no customer")
    if not isinstance(total, str) or not AMOUNT.fullmatch(total):
        raise Rejected(f"total {total!r} is not an amount")
    return customer, Decimal(total)


@app.post("/webhooks/outbox")
def receive_event() -> tuple[str, int]:
    body = request.get_data()  # the raw bytes: the signature covers them exactly
    try:
        event = webhook.verify(body, dict(request.headers))  # also refuses a timestamp 5 minutes off
    except WebhookVerificationError as error:
        app.logger.warning("refused a request: %s", error)
        return "", 401
    # The outbox's event id, the same on every retry and replay: the key to dedupe on, never a
    # business id (one order can have many events).
    event_id = int(request.headers["webhook-id"])
    # One transaction: the mark and the effect commit together, so a crash between them cannot
    # leave an event applied but unmarked (applied again on redelivery) or marked but unapplied.
    with engine.begin() as db:
        if not db.execute(MARK_PROCESSED, {"event_id": event_id, "consumer": CONSUMER}).scalar_one():
            outcome = "duplicate"
        else:
            try:
                customer, amount = parse_order_placed(event)
            except Rejected as error:
                db.execute(RECORD_REJECTED, {"event_id": event_id, "reason": str(error)})
                outcome = f"rejected ({error})"
            else:
                db.execute(ADD_TO_BALANCE, {"customer": customer, "amount": amount})
                outcome = "applied"
    app.logger.info("event %s: %s", event_id, outcome)
    # 2xx in all three cases. The relay retries any other status (4xx included) until the
    # endpoint's attempt cap, then marks the delivery dead: a duplicate was applied already, and a
    # rejected event would fail the same way every time, so it is recorded here for a person to
    # look at rather than burning retries. An unexpected error (the database is down) raises: a
    # 500, retried with backoff, which is what a transient failure wants.
    return "", 204


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app.logger.setLevel(logging.INFO)
    serve(app, host="127.0.0.1", port=int(os.environ["PORT"]))
