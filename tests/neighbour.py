"""A stand-in for a neighbouring domain's HTTP endpoint on 127.0.0.1, answering as a test tells it:
a JSON answer after a delay, or an answer that drips one byte at a time (a neighbour that is slow
rather than down). For tests of the real HTTP wire (messaging.federation.wire.transport.HttpWire)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeNeighbour:
    def __init__(self, *, answer: dict | None = None, status: int = 200, delay: float = 0.0,
                 drip_every: float | None = None):
        self.answer = json.dumps(answer or {}).encode()
        self.status, self.delay, self.drip_every = status, delay, drip_every
        self.requests: list[tuple[str, dict, bytes]] = []
        self.stop = threading.Event()
        neighbour = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                neighbour.requests.append((self.path, dict(self.headers), body))
                if neighbour.stop.wait(neighbour.delay):
                    return
                self.send_response(neighbour.status)
                self.send_header("Content-Type", "application/json")
                if neighbour.drip_every is None:
                    self.send_header("Content-Length", str(len(neighbour.answer)))
                    self.end_headers()
                    self.wfile.write(neighbour.answer)
                    return
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                while not neighbour.stop.is_set():  # one byte at a time, for ever
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return
                    neighbour.stop.wait(neighbour.drip_every)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeNeighbour:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def wait_until(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)
