"""What the Pusher tests share: the demo tenants' Pusher credentials (tests/processes.py demo_network)
and how an app's server authorizes a socket for a channel (as the `pusher` server libraries do)."""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import time
from pathlib import Path

from tests.sioclients import NodeDriver

ANZ_KEY, ANZ_SECRET, ANZ_APP_ID = "anz-pusher-key", "anz-pusher-secret", "343"
BNZ_KEY, BNZ_SECRET = "bnz-pusher-key", "bnz-pusher-secret"
PATH = "/app/{key}?protocol=7&client=js&version=8.4.0&flash=false"


def channel_auth(socket_id: str, channel: str, channel_data: dict | None = None, *, key: str = ANZ_KEY,
                 secret: str = ANZ_SECRET) -> dict:
    """The body of an app server's answer to pusher-js's authorization request."""
    data = json.dumps(channel_data) if channel_data is not None else None
    text = f"{socket_id}:{channel}" + (f":{data}" if data is not None else "")
    out = {"auth": f"{key}:{hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()}"}
    if data is not None:
        out["channel_data"] = data
    return out


def signed_query(method: str, path: str, params: dict | None = None, body: bytes = b"", *, key: str = ANZ_KEY,
                 secret: str = ANZ_SECRET, timestamp: float | None = None) -> str:
    """The query string the `pusher` server libraries sign a request with (their http.Request)."""
    query = dict(params or {})
    query.update({"auth_key": key, "auth_timestamp": "%.0f" % (time.time() if timestamp is None else timestamp),
                  "auth_version": "1.0", "body_md5": hashlib.md5(body).hexdigest()})
    text = "\n".join([method, path, "&".join(f"{k}={v}" for k, v in sorted(query.items()))])
    query["auth_signature"] = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
    return "&".join(f"{k}={v}" for k, v in sorted(query.items()))


class PusherJs(NodeDriver):
    """A real pusher-js client (or Laravel Echo on one) and the official `pusher` server library in a
    Node process (tests/node/pusher_driver.mjs), commanded line by line."""

    DRIVER = Path(__file__).resolve().parent / "node" / "pusher_driver.mjs"

    def __init__(self, host: str, port: int, *, user: dict | None = None, echo: bool = False, key: str = ANZ_KEY,
                 secret: str = ANZ_SECRET, app_id: str = ANZ_APP_ID, signin_as: dict | None = None) -> None:
        super().__init__(self.DRIVER)
        self.command(op="connect", host=host, port=port, key=key, secret=secret, appId=app_id, user=user, echo=echo,
                     signinAs=signin_as)

    def next(self, event: str, timeout: float = 15, **fields) -> dict:
        return self.wait(lambda e: e.get("event") == event and all(e.get(k) == v for k, v in fields.items()), timeout)

    def connected(self, timeout: float = 15) -> str:
        return self.next("connected", timeout)["socket_id"]

    def subscribe(self, channel: str) -> dict:
        self.command(op="subscribe", channel=channel)
        return self.wait(lambda e: e.get("event") in ("subscribed", "subscription_error") and e["channel"] == channel)

    def api(self, call: str, *args, timeout: float = 15) -> dict:
        self.calls += 1
        n = self.calls
        self.command(op="api", n=n, call=call, args=list(args))
        return self.wait(lambda e: e.get("api") == n, timeout)

    def quiet(self, seconds: float = 1.0) -> list[dict]:
        got = list(self.seen)
        self.seen.clear()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(self.lines.get(timeout=left))
            except queue.Empty:
                break
        return got


def user_auth(socket_id: str, user_data: dict, *, key: str = ANZ_KEY, secret: str = ANZ_SECRET) -> dict:
    """The body of an app server's answer to pusher-js's user authentication request (pusher:signin)."""
    data = json.dumps(user_data)
    signature = hmac.new(secret.encode(), f"{socket_id}::user::{data}".encode(), hashlib.sha256).hexdigest()
    return {"auth": f"{key}:{signature}", "user_data": data}
