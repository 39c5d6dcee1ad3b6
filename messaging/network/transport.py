"""The one door for calls between neighbouring domains, both ways.

Out: `peer_call` POSTs a JSON payload to a neighbour's internal endpoint, signed with the shared
secret of the link between the two domains (foundation.signed_calls), and returns its JSON answer
or raises `PeerError` with a reason an operator can read ("domain-02: connection refused",
"domain-02 answered 403: bad signature").

In: `peer_request_check` is what every internal endpoint does first: the calling domain must be a
neighbour, the signature must hold with that link's secret (read afresh when the cached one
refuses it), the timestamp must be within
FORWARD_MAX_SKEW_SECONDS, the nonce unused (Redis remembers it for twice that window) and the link
enabled. Anything else is refused (`PeerRefused`) before the body is parsed; a caller that is not a
neighbour is told so without a domain's name (only a signed caller hears which link is disabled).

Payloads name apps by app name, never by primary key: each domain has its own database.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.db.models import Q

from apps_registry.models import DomainLink
from apps_registry.selectors import domain_call_url
from foundation import signed_calls
from foundation.outbound import CallFailed
from foundation.outgoing import Answer, OutgoingError, outgoing_client, outgoing_post, run_outgoing
from foundation.transport.redis_clients import sync_client

log = logging.getLogger(__name__)

FORWARD_PATH = "/internal/v1/forward"  # deliveries, confirmations and receipts
PUBLISH_PATH = "/internal/v1/publishes"  # channel publishes (the flood)
PING_PATH = "/internal/v1/ping"  # link probes
STANDBY_PATH = "/internal/v1/standby"  # the live copy of a home's users' mailboxes to their standby
WITNESS_PATH = "/internal/v1/witness"  # "how long have you heard nothing of this domain?" (takeovers)
MAX_BODY_BYTES = settings.NETWORK_MAX_BODY_BYTES
# The refusal of a call from a domain not linked to this one (or from anyone else): it names nobody.
NOT_A_NEIGHBOUR = "not a signed call from a neighbour over an enabled link"
# The most of a neighbour's answer that is read (a flood answer names at most 1,000 refusals of 500
# characters); a longer answer is a failed call.
MAX_ANSWER_BYTES = 1024 * 1024


class PeerError(CallFailed):
    """A call to a neighbour that did not succeed; `reason` names the neighbour and what happened."""


@dataclass
class PeerRefused(Exception):
    """A call from a neighbour refused before its body is read."""

    status: int
    reason: str


LINK_CACHE_SECONDS = 1.0
_links: dict[tuple[str, str], tuple[float, DomainLink | None]] = {}


def link_between(a: str, b: str) -> DomainLink | None:
    """The link between two domains (either way round), as the database has it now."""
    return (DomainLink.objects.select_related("n1", "n2")
            .filter(Q(n1__name=a, n2__name=b) | Q(n1__name=b, n2__name=a)).first())


def _link_to(peer: str, *, fresh: bool = False) -> DomainLink | None:
    """The link between this domain and `peer`, re-read at most every LINK_CACHE_SECONDS per
    process (every call out and every call in needs it; `fresh`: now). A change is at most that
    late, as the graph is: a link disabled refuses calls within that time, and a secret changed is
    read afresh by a call in whose signature the cached secrets refuse (the rotation window keeps
    the old secret valid meanwhile, so a call out signed with it still passes)."""
    here = settings.DOMAIN_NAME
    now = time.monotonic()
    cached = _links.get((here, peer))
    if fresh or cached is None or now - cached[0] > LINK_CACHE_SECONDS:
        cached = _links[here, peer] = (now, link_between(here, peer))
    return cached[1]


def link_cache_clear() -> None:
    _links.clear()


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
    link = _link_to(peer)
    if link is None:
        raise PeerError(f"{peer}: no link between {here} and {peer}")
    if not link.enabled:
        raise PeerError(f"{peer}: the link {here} - {peer} is disabled")
    domain = link.n2 if link.n1.name == here else link.n1
    base = domain_call_url(domain.urls)
    if base is None:
        raise PeerError(f"{peer}: the domain lists no http:// or ws:// URL")
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = signed_calls.signed_headers(secret=link.secrets_valid(), sender=here, method="POST", path=path, body=body)
    headers["Content-Type"] = "application/json"
    return PeerCall(peer=peer, url=base + path, body=body, headers=headers)


class Wire(Protocol):
    """How a prepared call reaches its neighbour: over HTTP in production (`HttpWire`); a test
    network in one database hands it to the neighbour's view in-process (tests/network.py)."""

    def post(self, call: PeerCall, *, deadline: float) -> Answer: ...

    def post_all(self, calls: list[PeerCall], *, deadline: float) -> list[Answer | OutgoingError]:
        """Several calls at once (each within `deadline`), their answers in order."""


class HttpWire:
    """POST through foundation.outgoing: the deadline bounds the whole exchange (connect, request,
    a neighbour that answers one byte a second), and at most MAX_ANSWER_BYTES of the answer are
    read. Neighbours are the operator's configuration, so their addresses are not filtered."""

    async def _post(self, call: PeerCall, deadline: float) -> Answer:
        client = outgoing_client("peers", max_connections=50, max_keepalive=20, checked=False)
        return await outgoing_post(client, call.url, content=call.body, headers=call.headers, deadline=deadline,
                                   max_bytes=MAX_ANSWER_BYTES)

    def post(self, call: PeerCall, *, deadline: float) -> Answer:
        return run_outgoing(self._post(call, deadline), deadline)

    def post_all(self, calls: list[PeerCall], *, deadline: float) -> list[Answer | OutgoingError]:
        async def all_of() -> list:
            return await asyncio.gather(*(self._post(c, deadline) for c in calls), return_exceptions=True)

        return [a if isinstance(a, Answer | OutgoingError) else OutgoingError(f"{type(a).__name__}: {a}")
                for a in run_outgoing(all_of(), deadline)]


_wire: Wire = HttpWire()


def wire_use(wire: Wire) -> Wire:
    """Make `wire` carry every call to a neighbour from now on; returns the one it replaces."""
    global _wire
    previous, _wire = _wire, wire
    return previous


def peer_call_send(call: PeerCall, *, timeout: float | None = None) -> dict:
    """Send a prepared call (no database access): the neighbour's JSON answer, or PeerError."""
    deadline = settings.FORWARD_TIMEOUT_SECONDS if timeout is None else timeout
    try:
        answer = _wire.post(call, deadline=deadline)
    except OutgoingError as exc:
        raise PeerError(f"{call.peer}: {_network_reason(exc)}") from None
    return _answer_read(call.peer, answer)


def peer_calls_send(calls: list[PeerCall], *, timeout: float) -> list[dict | PeerError]:
    """Send prepared calls at once, each within `timeout`: each one's JSON answer, or its PeerError."""
    out: list[dict | PeerError] = []
    for call, answer in zip(calls, _wire.post_all(calls, deadline=timeout), strict=True):
        if isinstance(answer, OutgoingError):
            out.append(PeerError(f"{call.peer}: {_network_reason(answer)}"))
            continue
        try:
            out.append(_answer_read(call.peer, answer))
        except PeerError as exc:
            out.append(exc)
    return out


def _answer_read(peer: str, answer: Answer) -> dict:
    if answer.status // 100 != 2:
        try:
            detail = json.loads(answer.body).get("error", "")
        except (ValueError, AttributeError):
            detail = answer.body[:200].decode(errors="replace")
        raise PeerError(f"{peer} answered {answer.status}: {detail}", status=answer.status)
    if not answer.complete:
        raise PeerError(f"{peer} answered {answer.status} with more than {MAX_ANSWER_BYTES} bytes", status=answer.status)
    try:
        return json.loads(answer.body)
    except ValueError:
        raise PeerError(f"{peer} answered {answer.status} with a body that is not JSON", status=answer.status) from None


def peer_call(*, peer: str, path: str, payload: dict) -> dict:
    """POST `payload` to `peer`'s internal `path`, signed; its JSON answer, or PeerError."""
    return peer_call_send(peer_call_prepare(peer=peer, path=path, payload=payload))


def _network_reason(exc: OutgoingError) -> str:
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text[:300]


def peer_body(request) -> bytes:
    """The call's body, up to MAX_BODY_BYTES: what the internal endpoints advertise and the senders'
    FORWARD_BATCH_BYTES stays well under. Read past `request.body`, whose limit is the public API's
    (DATA_UPLOAD_MAX_MEMORY_SIZE) and whose refusal is an HTML page a sender cannot read."""
    length = request.META.get("CONTENT_LENGTH") or ""
    if length.isascii() and length.isdigit() and len(length) < 12 and int(length) > MAX_BODY_BYTES:
        raise PeerRefused(413, f"body over {MAX_BODY_BYTES} bytes")
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise PeerRefused(413, f"body over {MAX_BODY_BYTES} bytes")
    return body


def peer_request_check(request) -> tuple[str, dict]:
    """(calling domain, JSON payload) of a genuine call from a neighbour; PeerRefused otherwise."""
    sender = request.headers.get(signed_calls.DOMAIN_HEADER, "")
    if not sender or len(sender) > 64 or not sender.isascii():
        raise PeerRefused(403, f"missing or malformed {signed_calls.DOMAIN_HEADER} header")
    here = settings.DOMAIN_NAME
    link = _link_to(sender)
    if link is None:
        # Said to a caller whose call proves nothing: no domain is named (the log names them).
        log.warning("internal call refused: %r is not linked to %s", sender, here)
        raise PeerRefused(403, NOT_A_NEIGHBOUR)
    body = peer_body(request)

    def refusal_by(checked: DomainLink):
        return signed_calls.signature_refusal(
            secret=checked.secrets_valid(), header=request.headers.get(signed_calls.SIGNATURE_HEADER),
            method=request.method, path=request.get_full_path(), body=body, max_skew=settings.FORWARD_MAX_SKEW_SECONDS)

    refusal, signature = refusal_by(link)
    if refusal is not None:  # the secret may have changed since the link was cached
        link = _link_to(sender, fresh=True)
        if link is None:
            raise PeerRefused(403, NOT_A_NEIGHBOUR)
        refusal, signature = refusal_by(link)
    if refusal is not None:
        raise PeerRefused(403, refusal)
    if not link.enabled:  # a genuine neighbour's call: it may hear which link is off
        raise PeerRefused(403, f"the link {here} - {sender} is disabled")
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
