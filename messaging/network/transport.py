"""The one door for calls between neighbouring domains, both ways.

Out: `peer_call` POSTs a JSON payload to a neighbour's internal endpoint, signed with the shared
secret of the link between the two domains (foundation.signed_calls), and returns its JSON answer
or raises `PeerError` with a reason an operator can read ("domain-02: connection refused",
"domain-02 answered 403: bad signature").

In: `peer_request_check` is what every internal endpoint does first: the calling domain must be a
neighbour over an enabled link, the signature must hold with that link's secret, the timestamp must
be within FORWARD_MAX_SKEW_SECONDS and the nonce unused (Redis remembers it for twice that window).
Anything else is refused (`PeerRefused`) before the body is looked at.

Payloads name apps by app name, never by primary key: each domain has its own database.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db.models import Q

from apps_registry.models import Domain, DomainLink
from foundation import signed_calls
from foundation.transport.redis_clients import sync_client

FORWARD_PATH = "/internal/v1/forward"  # deliveries, confirmations and receipts
PUBLISH_PATH = "/internal/v1/publishes"  # channel publishes (the flood)
PING_PATH = "/internal/v1/ping"  # link probes
MAX_BODY_BYTES = 32 * 1024 * 1024


class PeerError(Exception):
    """A call to a neighbour that did not succeed; `reason` names the neighbour and what happened."""

    def __init__(self, reason: str, status: int | None = None):
        super().__init__(reason)
        self.reason = reason[:500]
        self.status = status


@dataclass
class PeerRefused(Exception):
    """A call from a neighbour refused before its body is read."""

    status: int
    reason: str


def peer_base_url(domain: Domain) -> str | None:
    """Where a domain's internal endpoints are: its first http(s) URL, else its first ws(s) URL's
    origin (ws://host:8002/ws -> http://host:8002)."""
    urls = [str(u) for u in (domain.urls or [])]
    for url in urls:
        if url.startswith(("http://", "https://")):
            return url.rstrip("/")
    for url in urls:
        if url.startswith(("ws://", "wss://")):
            scheme, rest = url.split("://", 1)
            return f"{'https' if scheme == 'wss' else 'http'}://{rest.split('/', 1)[0]}"
    return None


def link_between(a: str, b: str) -> DomainLink | None:
    return (DomainLink.objects.select_related("n1", "n2")
            .filter(Q(n1__name=a, n2__name=b) | Q(n1__name=b, n2__name=a)).first())


_local = threading.local()


def _client() -> httpx.Client:
    # One keep-alive pool per thread (a worker's threads each call their own neighbours).
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client(timeout=settings.FORWARD_TIMEOUT_SECONDS, trust_env=False)
    return client


@dataclass(frozen=True)
class PeerCall:
    """A signed call to a neighbour, ready to send: made where the database is at hand, sent from
    any thread (the probes send theirs in parallel, without a database connection per thread)."""

    peer: str
    url: str
    body: bytes
    headers: dict[str, str]


def peer_call_prepare(*, peer: str, path: str, payload: dict) -> PeerCall:
    """The signed call of `payload` to `peer`'s internal `path`; PeerError when there is no way to it."""
    here = settings.DOMAIN_NAME
    link = link_between(here, peer)
    if link is None:
        raise PeerError(f"{peer}: no link between {here} and {peer}")
    if not link.enabled:
        raise PeerError(f"{peer}: the link {here} - {peer} is disabled")
    domain = link.n2 if link.n1.name == here else link.n1
    base = peer_base_url(domain)
    if base is None:
        raise PeerError(f"{peer}: the domain lists no http:// or ws:// URL")
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = signed_calls.signed_headers(secret=link.shared_secret, sender=here, method="POST", path=path, body=body)
    headers["Content-Type"] = "application/json"
    return PeerCall(peer=peer, url=base + path, body=body, headers=headers)


def peer_call_send(call: PeerCall, *, timeout: float | None = None) -> dict:
    """Send a prepared call (no database access): the neighbour's JSON answer, or PeerError."""
    peer = call.peer
    timeout = settings.FORWARD_TIMEOUT_SECONDS if timeout is None else timeout
    try:
        answer = _client().post(call.url, content=call.body, headers=call.headers, timeout=timeout)
    except httpx.TimeoutException:
        raise PeerError(f"{peer}: no answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise PeerError(f"{peer}: {_network_reason(exc)}") from None
    if answer.status_code // 100 != 2:
        try:
            detail = answer.json().get("error", "")
        except (ValueError, AttributeError):
            detail = answer.text[:200]
        raise PeerError(f"{peer} answered {answer.status_code}: {detail}", status=answer.status_code)
    try:
        return answer.json()
    except ValueError:
        raise PeerError(f"{peer} answered {answer.status_code} with a body that is not JSON") from None


def peer_call(*, peer: str, path: str, payload: dict) -> dict:
    """POST `payload` to `peer`'s internal `path`, signed; its JSON answer, or PeerError."""
    return peer_call_send(peer_call_prepare(peer=peer, path=path, payload=payload))


def _network_reason(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text[:300]


def peer_request_check(request) -> tuple[str, dict]:
    """(calling domain, JSON payload) of a genuine call from a neighbour; PeerRefused otherwise."""
    sender = request.headers.get(signed_calls.DOMAIN_HEADER, "")
    if not sender or len(sender) > 64 or not sender.isascii():
        raise PeerRefused(403, f"missing or malformed {signed_calls.DOMAIN_HEADER} header")
    here = settings.DOMAIN_NAME
    link = link_between(here, sender)
    if link is None:
        raise PeerRefused(403, f"{sender} is not linked to {here}")
    if not link.enabled:
        raise PeerRefused(403, f"the link {here} - {sender} is disabled")
    body = request.body
    if len(body) > MAX_BODY_BYTES:
        raise PeerRefused(413, f"body over {MAX_BODY_BYTES} bytes")
    refusal, signature = signed_calls.signature_refusal(
        secret=link.shared_secret, header=request.headers.get(signed_calls.SIGNATURE_HEADER),
        method=request.method, path=request.get_full_path(), body=body, max_skew=settings.FORWARD_MAX_SKEW_SECONDS)
    if refusal is not None:
        raise PeerRefused(403, refusal)
    if not signed_calls.nonce_first_use(redis=sync_client(), sender=sender, nonce=signature.nonce,
                                        ttl=2 * settings.FORWARD_MAX_SKEW_SECONDS):
        raise PeerRefused(409, "replayed call (nonce already used)")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise PeerRefused(400, "body is not JSON") from None
    if not isinstance(payload, dict):
        raise PeerRefused(400, "body must be a JSON object")
    return sender, payload
