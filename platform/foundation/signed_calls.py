"""Signed internal calls between domains (forwarding, link probes, the meta role's export).

A call carries two headers:

    Switchboard-Domain: <the calling domain's name>
    Switchboard-Signature: t=<unix seconds>,n=<nonce>,v1=<hex HMAC-SHA256>

The HMAC is over `<t>.<n>.<METHOD>.<path with query>.` followed by the raw body, with the secret the
two sides share (a link's secret; the network's META_SECRET for the meta role). Signing the method and
path keeps a signature for one endpoint from being replayed at another; the timestamp bounds how long
a recorded call is worth anything, and the nonce, remembered by the receiver for longer than that
window (`nonce_first_use`), makes a replay inside it fail too. A signed answer (the meta export) uses
the same scheme with method `ANSWER`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

DOMAIN_HEADER = "Switchboard-Domain"
SIGNATURE_HEADER = "Switchboard-Signature"
ANSWER_METHOD = "ANSWER"
SCHEME = "v1"
NONCE_KEY = "sb:nonce:{sender}:{nonce}"


def signature_compute(*, secret: str, timestamp: int, nonce: str, method: str, path: str, body: bytes) -> str:
    head = f"{timestamp}.{nonce}.{method.upper()}.{path}.".encode()
    return hmac.new(secret.encode(), head + body, hashlib.sha256).hexdigest()


def signed_headers(*, secret: str | Sequence[str], sender: str, method: str, path: str, body: bytes,
                   timestamp: int | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that sign a call (or an answer) from `sender`, made now: one `v1` value per
    secret (two while a secret rotates, so the receiver may know either)."""
    t = int(time.time()) if timestamp is None else timestamp
    n = nonce or secrets.token_hex(16)
    sigs = ",".join(f"{SCHEME}={signature_compute(secret=s, timestamp=t, nonce=n, method=method, path=path, body=body)}"
                    for s in ([secret] if isinstance(secret, str) else secret))
    return {DOMAIN_HEADER: sender, SIGNATURE_HEADER: f"t={t},n={n},{sigs}"}


@dataclass(frozen=True)
class Signature:
    timestamp: int
    nonce: str
    values: tuple[str, ...]


def header_parts(header: str | None) -> dict[str, list[str]]:
    """`k=v,k=v` signature header items by key (a key may repeat: two `v1` while a secret rotates).
    Also the webhooks' `Switchboard-Signature` (messaging.webhooks.signing)."""
    parts: dict[str, list[str]] = {}
    for item in (header or "").split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts.setdefault(key, []).append(value)
    return parts


def signature_parse(header: str | None) -> Signature | None:
    parts = header_parts(header)
    try:
        timestamp = int(parts["t"][0]) if parts["t"][0].isascii() else None
        nonce = parts["n"][0]
    except (KeyError, ValueError):
        return None
    if timestamp is None or not (8 <= len(nonce) <= 64) or not nonce.isascii() or not nonce.isalnum():
        return None
    return Signature(timestamp=timestamp, nonce=nonce, values=tuple(parts.get(SCHEME, [])))


def header_refusal(*, header: str | None, max_skew: int, now: float | None = None) -> tuple[str | None, Signature | None]:
    """What the signature header alone refuses (None: well formed and fresh), and the parsed
    signature: the part of `signature_refusal` that needs no body, so a receiver can refuse a call
    before reading it (messaging.federation.wire.transport's header check)."""
    signature = signature_parse(header)
    if signature is None:
        return "missing or malformed signature", None
    if abs((time.time() if now is None else now) - signature.timestamp) > max_skew:
        return f"timestamp outside the allowed {max_skew} s window", signature
    return None, signature


def signature_refusal(*, secret: str | Sequence[str], header: str | None, method: str, path: str, body: bytes,
                      max_skew: int, now: float | None = None) -> tuple[str | None, Signature | None]:
    """Why a signed call must be refused (None: the signature holds with `secret`, or one of them),
    and the parsed signature.

    Replays are the caller's second step (`nonce_first_use`), once the signature is known to be
    genuine: a forged call must not be able to burn a nonce.
    """
    reason, signature = header_refusal(header=header, max_skew=max_skew, now=now)
    if reason is not None or signature is None:
        return reason, signature
    for key in [secret] if isinstance(secret, str) else secret:
        expected = signature_compute(secret=key, timestamp=signature.timestamp, nonce=signature.nonce,
                                     method=method, path=path, body=body)
        if any(hmac.compare_digest(expected, value) for value in signature.values if value.isascii()):
            return None, signature
    return "bad signature", signature


def nonce_first_use(*, redis, sender: str, nonce: str, ttl: int) -> bool:
    """True the first time `sender` uses `nonce` within `ttl` seconds (SET NX): a replayed call is False."""
    # SET NX as a dedupe mark, not a lock (those are foundation.locks'): nothing is held or released,
    # the key only remembers a nonce for as long as a replay of it could pass the clock check.
    return bool(redis.set(NONCE_KEY.format(sender=sender, nonce=nonce), b"1", nx=True, ex=max(1, ttl)))
