"""Socket.IO clients nobody here wrote, for the tests: the real python-socketio client (SioUser) and
the real socket.io-client in a Node process (NodeClient, driving tests/node/driver.mjs)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import socketio

from tests.wsclient import APP_ID

DRIVER = Path(__file__).resolve().parent / "node" / "driver.mjs"


def take(source: queue.Queue, predicate: Callable[[Any], bool], timeout: float, other: Callable[[Any], None]) -> Any:
    """The first item of `source` that `predicate` accepts, within `timeout`; each item before it
    goes to `other`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing matching within {timeout}s")
        try:
            item = source.get(timeout=left)
        except queue.Empty:
            continue
        if predicate(item):
            return item
        other(item)


class SioUser:
    """A python-socketio client (the real one) that keeps what it is sent."""

    def __init__(self, url: str, user_id: str, *, transports: list[str] | None = None, acks: bool = False,
                 app_id: str = APP_ID, **auth: Any):
        self.url, self.user_id = url, user_id
        self.client = socketio.Client(reconnection=False)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.auth = {"appId": app_id, "userId": user_id, "token": "token-12345", **auth}
        if acks:
            self.auth["acks"] = True
        self.transports = transports

        @self.client.on("message")
        def on_message(data):
            self.events.put(("message", data))
            return {}  # in ACK mode the answer to the message's ACK request (python-socketio always answers)

        for name in ("confirmation", "user_connected", "user_disconnected", "online_users", "channel_message",
                     "invalid_message", "connect_error", "resolve", "reject", "request_accepted"):
            self.client.on(name, lambda data, name=name: self.events.put((name, data)))

    def __enter__(self) -> SioUser:
        self.client.connect(self.url, auth=self.auth, transports=self.transports, wait_timeout=10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.disconnect()

    def call(self, event: str, data: Any, timeout: float = 10) -> Any:
        return self.client.call(event, data, timeout=timeout)

    def next(self, name: str, timeout: float = 10) -> Any:
        """The next `name` event's data (the events before it are passed over)."""
        return take(self.events, lambda event: event[0] == name, timeout, lambda event: None)[1]


class NodeDriver:
    """A Node process running one of tests/node's drivers, commanded a JSON line at a time; what it
    reports, a JSON line at a time, is waited for with `wait` (what comes before is kept for later)."""

    def __init__(self, driver: Path) -> None:
        self.proc = subprocess.Popen(["node", str(driver)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait(lambda e: e.get("event") == "ready")
        self.calls = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def command(self, **cmd: Any) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait(self, predicate: Callable[[dict], bool], timeout: float = 15) -> dict:
        for seen in self.seen:
            if predicate(seen):
                self.seen.remove(seen)
                return seen
        return take(self.lines, predicate, timeout, self.seen.append)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.command(op="exit")
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NodeClient(NodeDriver):
    """One socket.io-client in a Node process (tests/node/driver.mjs), commanded line by line."""

    def __init__(self) -> None:
        super().__init__(DRIVER)

    def connect(self, url: str, user_id: str, *, app_id: str = APP_ID, ack_messages: bool = True,
                opts: dict | None = None, **auth: Any) -> dict:
        self.command(op="connect", url=url, auth={"appId": app_id, "userId": user_id, "token": "t-1", **auth},
                     opts=opts or {}, ackMessages=ack_messages)
        return self.wait(lambda e: e.get("event") in ("connect", "connect_error"))

    def call(self, event: str, data: Any) -> Any:
        self.calls += 1
        n = self.calls
        self.command(op="emit", n=n, event=event, data=data)
        return self.wait(lambda e: e.get("ack") == n)["result"]

    def wait_event(self, name: str, timeout: float = 15) -> dict:
        return self.wait(lambda e: e.get("event") == name, timeout)

