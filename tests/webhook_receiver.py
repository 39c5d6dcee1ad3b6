"""A real webhook receiver for tests: a plain-HTTP server on 127.0.0.1, in a thread, that records
every call and answers with a status the test chooses (optionally after a delay, with a body of the
test's choosing), or, with `drip`, answers its headers one byte every `drip` seconds and never
finishes: the hostile receiver whose every read arrives in time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from messaging.webhooks.signing import signature_verify


@dataclass(frozen=True)
class ReceivedCall:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def event(self) -> str:
        return self.headers.get("switchboard-event", "")

    def signed_with(self, secret: str) -> bool:
        return signature_verify(secret=secret, header=self.headers.get("switchboard-signature", ""), body=self.body)


class WebhookReceiver:
    def __init__(self, status: int = 200, delay: float = 0.0, answer: bytes | None = None, drip: float = 0.0):
        self.status = status
        self.delay = delay
        self.answer = answer
        self.drip = drip
        self._closing = threading.Event()
        self.calls: list[ReceivedCall] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.calls.append(ReceivedCall(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                       body, time.time()))
                if receiver.drip:
                    self._drip()
                    return
                if receiver.delay:
                    time.sleep(receiver.delay)
                answer = receiver.answer if receiver.answer is not None else \
                    b'{"received": true}' if 200 <= receiver.status < 300 else b"receiver is failing on purpose"
                try:
                    self.send_response(receiver.status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the caller gave up (its timeout)

            def _drip(self) -> None:
                self.close_connection = True
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                    while not receiver._closing.wait(receiver.drip):
                        self.wfile.write(b"a")
                        self.wfile.flush()
                except OSError:
                    pass  # the caller gave up: its deadline

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def matching(self, predicate: Callable[[ReceivedCall], bool]) -> list[ReceivedCall]:
        with self._lock:
            return [c for c in self.calls if predicate(c)]

    def wait_for(self, predicate: Callable[[ReceivedCall], bool], count: int = 1,
                 timeout: float = 20) -> list[ReceivedCall]:
        """The calls matching `predicate`, once there are at least `count` of them."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.matching(predicate)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {count} matching webhook calls within {timeout}s; "
                                   f"got {[c.body[:200] for c in self.calls[-5:]]}")
            time.sleep(0.05)

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def event_for(event: str, **data: Any) -> Callable[[ReceivedCall], bool]:
    """A predicate: a call of `event` whose body's data includes `data`."""
    def predicate(call: ReceivedCall) -> bool:
        if call.event != event:
            return False
        body = call.json.get("data", {})
        return all(body.get(k) == v for k, v in data.items())

    return predicate
