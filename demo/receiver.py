#!/usr/bin/env python3
"""A small webhook receiver for the demo, one per endpoint: verifies each Standard Webhooks
signature with nothing but Python's standard library, prints one line per request, and
answers 204 (401 when the signature does not verify). With --fail-for it plays an endpoint
that is down: it answers 503 to every request for that long after its first one.

Usage: receiver.py PORT NAME SECRET_FILE [--fail-for SECONDS]"""

import argparse
import base64
import collections
import hashlib
import hmac
import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, header: str) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(expected).decode()
    # During a secret rotation the relay signs with the old and the new secret: one is enough.
    return any(
        sig.startswith("v1,") and hmac.compare_digest(sig[3:], expected)
        for sig in header.split()
    )


class Arrivals:
    """When the first request came (the failure window starts there, not at start-up, so it
    does not depend on how long the rest of the demo took) and how often each event came."""

    def __init__(self, fail_for: float):
        self.fail_for = fail_for
        self.first = None
        self.counts = collections.Counter()
        self.lock = threading.Lock()  # one thread per connection

    def note(self, msg_id: str) -> tuple[int, bool]:
        """The attempt this request is for the event, and whether to fail it."""
        with self.lock:
            now = time.monotonic()
            if self.first is None:
                self.first = now
            self.counts[msg_id] += 1
            return self.counts[msg_id], now - self.first < self.fail_for


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the relay expects

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        msg_id = self.headers.get("webhook-id", "")
        ok = verify(SECRET, msg_id, self.headers.get("webhook-timestamp", ""), body,
                    self.headers.get("webhook-signature", ""))
        event = json.loads(body)
        attempt, failing = ARRIVALS.note(msg_id)
        status = 503 if failing else 204 if ok else 401
        # The payload only once it is accepted: the failed attempts before carry the same one.
        data = f"  data={json.dumps(event['data'])}" if status == 204 else ""
        at = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        print(f"{at} {NAME:>7}: event {msg_id:>3} {event['type']:<22} attempt {attempt}"
              f"  signature {'valid' if ok else 'INVALID'}  -> {status}{data}", flush=True)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The demo's webhook receiver for one endpoint.")
    parser.add_argument("port", type=int)
    parser.add_argument("name", help="the endpoint's name, printed on each line")
    parser.add_argument("secret_file", help="holds the endpoint's whsec_ secret, as outbox_endpoint_rotate_secret() returned it")
    parser.add_argument("--fail-for", type=float, default=0, metavar="SECONDS",
                        help="answer 503 to every request for this long after the first one")
    args = parser.parse_args()
    NAME, SECRET = args.name, Path(args.secret_file).read_text().strip()
    ARRIVALS = Arrivals(args.fail_for)
    ThreadingHTTPServer(("127.0.0.1", args.port), Receiver).serve_forever()
