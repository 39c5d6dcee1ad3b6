"""The signature of a webhook call (docs/webhooks.md):

    Switchboard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the endpoint's secret>

The timestamp is signed with the body, so a receiver that refuses old timestamps also refuses a
recorded call replayed later. `signature_verify` is what a receiver does (docs/webhooks.md shows
the same steps as a standalone snippet).
"""

from __future__ import annotations

import hashlib
import hmac
import time

from foundation.signed_calls import header_parts

SIGNATURE_HEADER = "Switchboard-Signature"
EVENT_HEADER = "Switchboard-Event"
DELIVERY_HEADER = "Switchboard-Delivery"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


def signature_compute(*, secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(*, secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The Switchboard-Signature value for `body`, signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},{SCHEME}={signature_compute(secret=secret, timestamp=t, body=body)}"


def signature_verify(*, secret: str, header: str, body: bytes, tolerance: int = DEFAULT_TOLERANCE_SECONDS,
                     now: float | None = None) -> bool:
    """True when `header` signs `body` with `secret` and its timestamp is within `tolerance` seconds."""
    parts = header_parts(header)
    try:
        timestamp = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = signature_compute(secret=secret, timestamp=timestamp, body=body)
    # Any matching v1 value is enough (the Stripe convention), so a call may one day carry two
    # signatures while a secret is rotated without receivers changing.
    return any(hmac.compare_digest(expected, candidate) for candidate in parts.get(SCHEME, []))
