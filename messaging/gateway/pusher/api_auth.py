"""The Pusher HTTP API's signed queries (pusher.com/docs/channels/library_auth_reference/rest-api):
every request carries `auth_key`, `auth_timestamp`, `auth_version` (1.0), `auth_signature` and,
with a body, `body_md5`; the signature is the hex HMAC-SHA256, with the app's secret, of

    METHOD \\n PATH \\n key=value&… (every query parameter but auth_signature, sorted by key, not escaped)

Checked here, in constant time, before the body is looked at; pure (tests/messaging/gateway/pusher/)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

from apps_registry.selectors import AppSnapshot

REQUIRED = ("auth_key", "auth_timestamp", "auth_version", "auth_signature")


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


def string_to_sign(method: str, path: str, params: Mapping[str, str]) -> str:
    query = "&".join(f"{k}={v}" for k, v in sorted((k, v) for k, v in params.items() if k != "auth_signature"))
    return f"{method}\n{path}\n{query}"


def api_request_check(*, app: AppSnapshot | None, method: str, path: str, params: Mapping[str, str], body: bytes,
                      grace_seconds: int, now: float | None = None) -> Refusal | None:
    """None when the request is the app's, signed and fresh; else how the API refuses it."""
    if app is None:
        return Refusal(404, "Unknown app_id")
    missing = [name for name in REQUIRED if not params.get(name)]
    if missing:
        return Refusal(401, f"Missing {', '.join(missing)}")
    if not hmac.compare_digest(params["auth_key"].encode(), app.pusher_key.encode()):
        return Refusal(401, "Invalid auth_key")
    if params["auth_version"] != "1.0":
        return Refusal(401, "Unsupported auth_version: 1.0 is expected")
    now = time.time() if now is None else now
    try:
        stamp = int(params["auth_timestamp"])
    except ValueError:
        return Refusal(401, "auth_timestamp must be a whole number of seconds")
    if abs(now - stamp) > grace_seconds:
        return Refusal(401, f"Timestamp expired: Given timestamp ({stamp}) not within {grace_seconds}s of server "
                            f"time ({int(now)})")
    if body or "body_md5" in params:
        if not hmac.compare_digest(params.get("body_md5", "").encode(), hashlib.md5(body).hexdigest().encode()):
            return Refusal(401, "body_md5 does not match the body")
    expected = hmac.new(app.pusher_secret.encode(), string_to_sign(method, path, params).encode(),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(params["auth_signature"].encode(), expected.encode()):
        return Refusal(401, "Invalid signature: you should have sent HmacSHA256Hex(string_to_sign, secret), "
                            "string_to_sign being METHOD, path and the sorted query, joined by newlines")
    if not app.pusher_enabled:
        return Refusal(403, "App is disabled")
    return None
