"""The one door for calls between neighbouring domains, both ways.

Out: `peer_call` POSTs a JSON payload to a neighbour's internal endpoint, signed with the shared
secret of the link between the two domains (foundation.signed_calls), and returns its JSON answer
or raises `PeerError` with a reason an operator can read ("domain-02: connection refused",
"domain-02 answered 403: bad signature").

In, before the body: `peer_headers_gate` runs on the web node as soon as a request's headers under
/internal/ are in, before Twisted reads any of its body (foundation.body_cap, HTTP_HEADER_GATES): the
path must be an internal endpoint, the calling domain an enabled neighbour, the signature header
well formed with a timestamp within FORWARD_MAX_SKEW_SECONDS, and its nonce one this domain has not
seen (looked at, not used: see below). Anything else is answered as `peer_request_check` answers
it, and the connection closed, so an unsigned, stale or replayed call costs the node one read of
its socket, not a 32 MiB body. The design: the check is a coroutine on the event loop Twisted runs
on (asyncioreactor) while the request's socket is paused; Redis is asked with the loop's async
client, and the links come from this module's cache, read on the web node's database threads
(`run_db`) when stale, so nothing blocks the loop. The signature covers the body, so only the body's
reader can verify it; what the headers prove is little (anyone may write a neighbour's name and a
fresh random nonce), so a call let through may also bring a body over NETWORK_LARGE_BODY_BYTES only
while fewer than NETWORK_LARGE_BODIES_PER_LINK such bodies claiming the same neighbour are being
read on the node (503 otherwise), and every body must be complete within HTTP_BODY_TIMEOUT_SECONDS.

A liveness-only link (DomainLink.liveness_only) takes only the calls of the network's liveness
(`LIVENESS_PATHS`; a forwarding call over it only with presence and network), checked before the
body by the path and after it by the payload's keys: a message, a receipt, a publish or a standby
copy never crosses it, whoever signs it.

In, with the body: `peer_request_check` is what every internal endpoint does first: the calling
domain must be a neighbour, the signature must hold with that link's secret (read afresh when the
cached one refuses it), the timestamp must be within FORWARD_MAX_SKEW_SECONDS, the nonce unused
(Redis remembers it for twice that window: used here, with SET NX, once the signature holds, so a
forged call cannot burn a genuine call's nonce) and the link enabled. Anything else is refused
(`PeerRefused`) before the body is parsed; a caller that is not a neighbour is told so without a
domain's name (only a signed caller hears which link is disabled; on a web node the header check
has refused a call over a link disabled here already, as it refuses a stranger's).

The links are cached per process by the domain it plays, all of them at once (`_links`): a call
claiming a domain that is not a neighbour finds nothing and adds nothing, however many names are
made up.

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

from apps_registry.meta import EXPORT_PATH, config_export_gate
from apps_registry.models import DomainLink
from apps_registry.selectors import domain_call_url
from foundation import signed_calls
from foundation.asyncdb import run_db
from foundation.body_cap import Admission, Refusal, RequestHead
from foundation.outbound import CallFailed
from foundation.outgoing import Answer, OutgoingError, outgoing_client, outgoing_post, run_outgoing
from foundation.transport.redis_clients import async_client, sync_client

log = logging.getLogger(__name__)

FORWARD_PATH = "/internal/v1/forward"  # deliveries, confirmations and receipts
PUBLISH_PATH = "/internal/v1/publishes"  # channel publishes (the flood)
PING_PATH = "/internal/v1/ping"  # link probes
STANDBY_PATH = "/internal/v1/standby"  # the live copy of a home's users' mailboxes to their standby
WITNESS_PATH = "/internal/v1/witness"  # "how long have you heard nothing of this domain?" (takeovers)
PEER_PATHS = frozenset({FORWARD_PATH, PUBLISH_PATH, PING_PATH, STANDBY_PATH, WITNESS_PATH})
# What a liveness-only link (DomainLink.liveness_only) carries: probes, the witness's question, and
# forwarding calls that bring only the gossip round's presence and network (clocks, takeovers).
LIVENESS_PATHS = frozenset({FORWARD_PATH, PING_PATH, WITNESS_PATH})
LIVENESS_FORWARD_KEYS = frozenset({"presence", "network"})
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
LINK_MISS_REREAD_SECONDS = 0.1
# This domain's links, by neighbour, as last read (and when): keyed by the domain this process plays
# (one, but for the test network's), each holding the links the database has, so no caller's header
# can add an entry (a call claiming a domain that is not a neighbour finds nothing and adds nothing).
_links: dict[str, tuple[float, dict[str, DomainLink]]] = {}


def links_read(here: str) -> dict[str, DomainLink]:
    """This domain's links, by the neighbour at their other end, as the database has them now."""
    return {(link.n2.name if link.n1.name == here else link.n1.name): link
            for link in DomainLink.objects.select_related("n1", "n2").filter(Q(n1__name=here) | Q(n2__name=here))}


def _neighbour_links(*, fresh: bool = False) -> dict[str, DomainLink]:
    """This domain's links by neighbour, re-read (all at once) at most every LINK_CACHE_SECONDS per
    process (every call out and every call in needs one; `fresh`: now). A change is at most that
    late, as the graph is: a link disabled refuses calls within that time, and a secret changed is
    read afresh by a call in whose signature the cached secrets refuse (the rotation window keeps
    the old secret valid meanwhile, so a call out signed with it still passes)."""
    here = settings.DOMAIN_NAME
    now = time.monotonic()
    cached = _links.get(here)
    if fresh or cached is None or now - cached[0] > LINK_CACHE_SECONDS:
        cached = _links[here] = (now, links_read(here))
    return cached[1]


def _link_to(peer: str, *, fresh: bool = False) -> DomainLink | None:
    """The link between this domain and `peer` (None: they are not neighbours)."""
    return _neighbour_links(fresh=fresh).get(peer)


def liveness_peers() -> list[str]:
    """The domains linked to this one over enabled links of either kind (messaging.core.next_hop's
    `neighbours` are those that carry messages): the gossip round, the link probes and the takeover
    witness's question go to each."""
    return sorted(peer for peer, link in _neighbour_links().items() if link.enabled)


def liveness_only_refusal(link: DomainLink, path: str, payload: dict | None = None) -> str | None:
    """Why a call over `link` to `path` (with `payload`, once read) is not one a liveness-only link
    carries; None when it is (or the link carries everything)."""
    if not link.liveness_only:
        return None
    ends = f"{link.n1.name} - {link.n2.name}"
    if path not in LIVENESS_PATHS:
        return f"the link {ends} carries the network's liveness only, not {path}"
    if path == FORWARD_PATH and payload is not None and set(payload) - LIVENESS_FORWARD_KEYS:
        return (f"the link {ends} carries the network's liveness only: a forwarding call over it may bring "
                f"{' and '.join(sorted(LIVENESS_FORWARD_KEYS))}, not {', '.join(sorted(set(payload) - LIVENESS_FORWARD_KEYS))}")
    return None


def link_cache_clear() -> None:
    _links.clear()


def link_cache_size() -> int:
    """How many links the cache holds, for every domain this process plays."""
    return sum(len(links) for _, links in _links.values())


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
    if (refusal := liveness_only_refusal(link, request.path, payload)) is not None:
        raise PeerRefused(403, refusal)
    return sender, payload


# --- before the body: the header check (foundation.body_cap's gate for /internal/) -------------------


async def _link_now(peer: str) -> DomainLink | None:
    """The link to `peer`, from the event loop: the cache when it is fresh, else read on the web
    node's database threads (never on the loop). A link the cache lacks, or has disabled, is read
    again when the cache is older than LINK_MISS_REREAD_SECONDS, as a call whose signature the cached
    secrets refuse is (a link just made or enabled is heard at once); a flood of calls claiming
    strangers' names costs at most one read of the links that often."""
    cached = _links.get(settings.DOMAIN_NAME)
    age = time.monotonic() - cached[0] if cached is not None else float("inf")
    if age > LINK_CACHE_SECONDS:
        return (await run_db(_neighbour_links, fresh=True)).get(peer)
    link = cached[1].get(peer)
    if (link is None or not link.enabled) and age > LINK_MISS_REREAD_SECONDS:
        link = (await run_db(_neighbour_links, fresh=True)).get(peer)
    return link


async def peer_headers_gate(head: RequestHead) -> Refusal | Admission:
    """What a web node knows of a call between domains from its headers alone, before it reads the
    body (foundation.body_cap, HTTP_HEADER_GATES): the path is an internal endpoint, the calling
    domain a neighbour over an enabled link, the signature header well formed with a timestamp
    within FORWARD_MAX_SKEW_SECONDS and a nonce this domain has not seen (only looked at: the nonce
    is used by `peer_request_check`, once the signature over the body holds, so a forged call cannot
    burn it). Anything else is refused as `peer_request_check` would refuse it, with the same
    words, and nothing of its body is read. The signature itself covers the body: it is checked
    after the body is read, by `peer_request_check`, as before. A call let through may bring a body
    over NETWORK_LARGE_BODY_BYTES only while fewer than NETWORK_LARGE_BODIES_PER_LINK such bodies
    claiming the same neighbour are being read on this node.

    A link disabled here is refused as a stranger's call is (403 NOT_A_NEIGHBOUR): the call is not
    yet known to be genuine, so it is not told which link is off."""
    if head.path == EXPORT_PATH:  # the meta role's export: signed with META_SECRET, by any domain of the network
        return await config_export_gate(head)
    if head.path not in PEER_PATHS:
        return Refusal(404, {"error": f"{head.path} is not an internal endpoint of {settings.DOMAIN_NAME}"})
    sender = head.headers.get(signed_calls.DOMAIN_HEADER.lower(), "")
    if not sender or len(sender) > 64 or not sender.isascii():
        return Refusal(403, {"error": f"missing or malformed {signed_calls.DOMAIN_HEADER} header"})
    link = await _link_now(sender)
    if link is None or not link.enabled:
        log.warning("internal call refused before its body: %r is not a neighbour of %s over an enabled link",
                    sender, settings.DOMAIN_NAME)
        return Refusal(403, {"error": NOT_A_NEIGHBOUR})
    if (refusal := liveness_only_refusal(link, head.path)) is not None:
        return Refusal(403, {"error": refusal})
    reason, signature = signed_calls.header_refusal(header=head.headers.get(signed_calls.SIGNATURE_HEADER.lower()),
                                                    max_skew=settings.FORWARD_MAX_SKEW_SECONDS)
    if reason is not None or signature is None:
        return Refusal(403, {"error": reason})
    if await async_client().exists(signed_calls.NONCE_KEY.format(sender=sender, nonce=signature.nonce)):
        return Refusal(409, {"error": "replayed call (nonce already used)"})
    return Admission(key=sender, large_over=settings.NETWORK_LARGE_BODY_BYTES,
                     slots=settings.NETWORK_LARGE_BODIES_PER_LINK)
