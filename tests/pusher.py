"""What the Pusher tests share: the demo tenants' Pusher credentials (tests/processes.py demo_network)
and how an app's server authorizes a socket for a channel (as the `pusher` server libraries do)."""

from __future__ import annotations

import hashlib
import hmac
import json

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
    import time

    query = dict(params or {})
    query.update({"auth_key": key, "auth_timestamp": "%.0f" % (time.time() if timestamp is None else timestamp),
                  "auth_version": "1.0", "body_md5": hashlib.md5(body).hexdigest()})
    text = "\n".join([method, path, "&".join(f"{k}={v}" for k, v in sorted(query.items()))])
    query["auth_signature"] = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
    return "&".join(f"{k}={v}" for k, v in sorted(query.items()))
