#!/usr/bin/env python3
"""A small webhook receiver for the demo: verifies each Standard Webhooks signature with
nothing but Python's standard library, prints the event, and answers 204.

Usage: receiver.py PORT SECRET"""

import base64
import hashlib
import hmac
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, header: str) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(expected).decode()
    return any(
        sig.startswith("v1,") and hmac.compare_digest(sig[3:], expected)
        for sig in header.split()
    )


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the relay expects

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        msg_id = self.headers.get("webhook-id", "")
        ok = verify(SECRET, msg_id, self.headers.get("webhook-timestamp", ""), body,
                    self.headers.get("webhook-signature", ""))
        event = json.loads(body)
        print(f"receiver: event {msg_id:>3} {event['type']:<14} signature {'valid' if ok else 'INVALID'}"
              f"  data={json.dumps(event['data'])}", flush=True)
        self.send_response(204 if ok else 401)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    PORT, SECRET = int(sys.argv[1]), sys.argv[2]
    ThreadingHTTPServer(("127.0.0.1", PORT), Receiver).serve_forever()
