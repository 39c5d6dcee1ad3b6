"""The selftest client's side of the wire: a /ws connection that waits for frames with a deadline,
and a local receiver for the test webhook. Only HTTP and WebSocket, as any client of the
deployment; nothing here touches the platform's database or its code paths."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

WAIT_SLICE_SECONDS = 0.5  # the longest a wait for a frame goes without looking at signals (Ctrl-C)

Frame = dict[str, Any]


class CheckFailed(Exception):
    """A check's failure, in words for the operator."""


class CheckSkipped(Exception):
    """A check that cannot be made here (said honestly, never counted as a pass)."""


def ws_url(base: str) -> str:
    scheme, _, rest = base.rstrip("/").partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws"


class Socket:
    """One /ws connection of one user. `expect` waits for a frame matching a predicate; frames that
    do not match are kept, so a later `expect` still finds them (presence notices, say, may come
    before the frame a check waits for). With `auto_ack`, stored messages are acknowledged as they
    are read (an ACK-mode client that is not under test)."""

    def __init__(self, url: str, timeout: float):
        self.timeout = timeout
        self.backlog: list[Frame] = []
        self.auto_ack = False
        try:
            self.ws: ClientConnection = connect(url, open_timeout=timeout, close_timeout=2, max_size=2**21)
        except Exception as exc:
            raise CheckFailed(f"cannot open {url}: {exc}") from None

    def send(self, kind: str, data: dict[str, Any], **extra: Any) -> None:
        self.ws.send(json.dumps({"type": kind, "data": data, **extra}))

    def auth(self, *, app_id: str, user_id: str, token: str, acks: bool = False) -> None:
        data: dict[str, Any] = {"appId": app_id, "userId": user_id, "token": token}
        if acks:
            data["acks"] = True
        self.send("AUTH_CLIENT", data)
        reply = self.expect(lambda f: f.get("type") == "AUTH_CLIENT_REPLY", f"AUTH_CLIENT_REPLY for {user_id}")
        if reply["data"].get("isAuthenticated") is not True:
            reason = self.ws.close_reason or "no reason given"
            raise CheckFailed(f"{user_id} was refused: {reason}")

    def expect(self, predicate: Callable[[Frame], bool], what: str, timeout: float | None = None) -> Frame:
        for i, frame in enumerate(self.backlog):
            if predicate(frame):
                return self.backlog.pop(i)
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckFailed(f"timed out after {limit:g} s waiting for {what}")
            try:
                # In slices: Ctrl-C's SIGINT may land on the connection's reader thread, and the main
                # thread only runs its handler (KeyboardInterrupt) once its own wait ends.
                frame = json.loads(self.ws.recv(timeout=min(left, WAIT_SLICE_SECONDS)))
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                raise CheckFailed(f"the connection closed ({exc.rcvd.code if exc.rcvd else 'no close frame'}"
                                  f"{': ' + exc.rcvd.reason if exc.rcvd and exc.rcvd.reason else ''}) "
                                  f"waiting for {what}") from None
            if self.auto_ack and frame.get("type") in ("MESSAGE", "MESSAGE_CONFIRMATION") and "id" in frame["data"]:
                self.send("ACK", {"ids": [frame["data"]["id"]]})
            if predicate(frame):
                return frame
            self.backlog.append(frame)

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:  # noqa: S110 (closing is best effort: the socket may be gone already)
            pass


def message_with(content: str) -> Callable[[Frame], bool]:
    return lambda f: f.get("type") == "MESSAGE" and f["data"].get("content") == content


@dataclass(frozen=True)
class HookCall:
    headers: dict[str, str]  # names in lower case
    body: bytes


class HookListener:
    """A plain HTTP server on HOST:PORT that records every POST and answers 200: the test webhook
    endpoint. The deployment must be able to reach it (the URL given to the platform)."""

    def __init__(self, host: str, port: int):
        self.calls: list[HookCall] = []
        self.lock = threading.Lock()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with listener.lock:
                    listener.calls.append(HookCall({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def taken(self) -> list[HookCall]:
        with self.lock:
            calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
