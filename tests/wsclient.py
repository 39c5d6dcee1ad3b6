"""A small synchronous WebSocket client for tests, on the `websockets` library."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

APP_ID = "app-id-343"


class WsClient:
    def __init__(self, url: str, **kwargs: Any):
        self.url = url
        self.ws = connect(url, open_timeout=10, max_size=None, **kwargs)
        self.frames: list[dict] = []  # everything received, in order

    def send(self, frame_type: str, data: Any = None, **extra: Any) -> None:
        self.ws.send(json.dumps({"type": frame_type, "data": data if data is not None else {}, **extra}))

    def send_raw(self, text: str) -> None:
        self.ws.send(text)

    def recv(self, timeout: float = 10) -> dict:
        frame = json.loads(self.ws.recv(timeout=timeout))
        self.frames.append(frame)
        return frame

    def recv_type(self, frame_type: str, timeout: float = 10) -> dict:
        return self.recv_until(lambda f: f["type"] == frame_type, timeout)

    def recv_until(self, predicate: Callable[[dict], bool], timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching frame within {timeout}s; got {self.frames[-5:]}")
            frame = self.recv(timeout=left)
            if predicate(frame):
                return frame

    def recv_all(self, quiet: float = 0.5) -> list[dict]:
        """Everything that arrives until the socket is quiet for `quiet` seconds."""
        got = []
        while True:
            try:
                got.append(self.recv(timeout=quiet))
            except TimeoutError:
                return got

    def auth(self, user_id: str, app_id: str = APP_ID, token: str = "token-12345", **extra: Any) -> dict:
        self.send("AUTH_CLIENT", {"appId": app_id, "userId": user_id, "token": token, **extra})
        return self.recv_type("AUTH_CLIENT_REPLY")

    def message(self, to: str, content: str, **extra: Any) -> None:
        data = {"to": to, "content": content}
        if "clientMessageId" in extra:
            data["clientMessageId"] = extra.pop("clientMessageId")
        self.send("MESSAGE", data, **extra)

    def fetch(self, count: int) -> tuple[list[dict], int]:
        self.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": count})
        messages = []
        while True:
            frame = self.recv()
            if frame["type"] == "FETCH_MISSING_MESSAGES_COMPLETE":
                return messages, frame["data"]["leftMissingCount"]
            if frame["type"] in ("MESSAGE", "MESSAGE_CONFIRMATION"):
                messages.append(frame)

    def collect_messages(self, want: int, timeout: float) -> dict[str, str]:
        """Message id -> content of the MESSAGE frames received until `want` distinct ids arrived
        or `timeout` passed (a redelivery with the same id counts once: the client's view)."""
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < want and time.monotonic() < deadline:
            try:
                frame = self.recv(timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            if frame["type"] == "MESSAGE":
                seen[frame["data"]["id"]] = frame["data"]["content"]
        return seen

    def wait_closed(self, timeout: float = 10) -> int | None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(timeout=deadline - time.monotonic())
        except ConnectionClosed:
            return self.ws.close_code
        except TimeoutError:
            pass
        raise TimeoutError("socket still open")

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> WsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_for(condition: Callable[[], bool], timeout: float = 15, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval)
