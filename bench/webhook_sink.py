"""A webhook receiver for the benchmarks: a plain-HTTP server on 127.0.0.1, in a thread of the harness,
that answers every call 204 at once and counts the calls by event (the `Switchboard-Event` header).

It stands for a tenant's endpoint that keeps up: what a benchmark measures with it is what recording
and making the calls costs the platform, not a slow receiver (the outbound worker waits on those, on
a queue of its own). Its CPU is the harness's, not the servers'.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookSink:
    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the worker's client reuses its connections

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink._lock:
                    sink.received[self.headers.get("Switchboard-Event", "")] += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-sink", daemon=True)

    def __enter__(self) -> WebhookSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.received)

    def wait_for(self, total: int, timeout: float) -> dict[str, int]:
        """The counts once `total` calls have come (or `timeout` seconds passed)."""
        deadline = time.monotonic() + timeout
        while sum(self.counts().values()) < total and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.counts()

    def wait_for_each(self, expected: dict[str, int], timeout: float) -> dict[str, int]:
        """The counts once every event has come as often as `expected` says (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            counts = self.counts()
            if all(counts.get(event, 0) >= n for event, n in expected.items()):
                return counts
            time.sleep(0.1)
        return self.counts()
