"""HTTP request bodies capped, timed and gated before they are buffered (installed in daphne's
request class by foundation.patches.daphne).

Twisted reads a request's whole body before daphne hands the request to the application: into
memory when the declared length is under 100 kB, otherwise (or when no length is declared: a
chunked body) into a temporary file of no limit. So any request on any path, authenticated or not,
could grow a web node's temporary directory for as long as its client kept sending (`curl -T
/dev/zero -H 'Transfer-Encoding: chunked' …/healthz`).

**The cap.** Each request gets a cap from its path as soon as its headers are in: HTTP_MAX_BODY_BYTES
(Django's DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB, by default), or a larger one where a path prefix
documents it (HTTP_MAX_BODY_BYTES_BY_PREFIX: the calls between domains, /internal/, carry up to
NETWORK_MAX_BODY_BYTES). A declared length over the cap is answered at once; a chunked body is kept
in memory and answered the moment it passes the cap. The answer is the API's error shape,
`413 {"error": "request_too_large", "detail": …}`, and the connection is closed, so nothing more of
the body is read, and nothing was written to disk. The path is read as daphne will route it
(percent-decoded, leading slashes as one), so `//internal/…` or `/%69nternal/…` is capped and gated
as `/internal/…`.

**The time.** Twisted's own idle timeout (60 s) starts again with every byte, and daphne's
`http_timeout` (off) counts only once the body is in, so a body sent a byte every few seconds held
its connection, and what it had sent, for ever. A body not complete HTTP_BODY_TIMEOUT_SECONDS after
its headers is answered `408 {"error": "request_timeout", …}` and its connection closed.

**The gate.** A path prefix may have a gate (HTTP_HEADER_GATES: prefix -> dotted path of an async
function; the calls between domains have messaging.federation.wire.transport.peer_headers_gate), which
decides from the request's line and headers alone whether its body is worth reading. While it
decides, the request's socket is paused (`transport.pauseProducing()`), so at most what arrived
with the headers (one read, 64 KiB) is held, and the request is not handed to daphne even if that
was the whole body. The gate runs as a task on the event loop the reactor runs on (asyncioreactor),
so a gate that needs Redis or the database awaits them (the database on the web node's pool
threads) instead of blocking the loop: every other socket is served meanwhile. A `Refusal` is
written as it says (JSON) and the connection closed without reading further; an `Admission`
resumes reading, and names whose bodies it is (`key`, a link) and how many bodies of that key over
`large_over` bytes may be in flight on this node at once (`slots`). A body that passes `large_over`
(declared, or once that much of a chunked body is in) when all of its key's places are taken is
answered 503 and its connection closed; a place is given back when its request finishes or its
connection goes. A gate that fails (Redis down) refuses with 503: nothing it could not check is read.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import io
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

from django.conf import settings
from django.utils.module_loading import import_string

from foundation.logs import loggable
from foundation.metrics import CONNECTIONS_CLOSED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestHead:
    """What a gate sees of a request: its line and headers, before any of its body."""

    method: str
    path: str  # as daphne routes it: percent-decoded, without the query
    target: str  # the request target as sent (with its query)
    headers: dict[str, str]  # lower-case names, the first value of each
    length: int | None  # the declared body length; None: chunked


@dataclass(frozen=True)
class Refusal:
    """A gate's answer to a request whose body is not to be read."""

    status: int
    body: dict
    reason: str = "header_check"  # the label of switchboard_connections_closed_by_server_total


@dataclass(frozen=True)
class Admission:
    """A gate lets the request through: of its bodies over `large_over` bytes, `key` may have at most
    `slots` in flight on this node at once."""

    key: str
    large_over: int
    slots: int


Gate = Callable[[RequestHead], Awaitable[Refusal | Admission]]

# Bodies over their admission's `large_over` in flight on this node, by key (the reactor's thread only).
_large_bodies: collections.Counter[str] = collections.Counter()


def route_path(target: bytes) -> str:
    """The path daphne and the ASGI router will see for a request target: without its query,
    percent-decoded, its leading slashes one (the router strips them all)."""
    return "/" + unquote(target.split(b"?", 1)[0].decode("latin-1")).lstrip("/")


def cap_for(path: str) -> int:
    """The largest body a request to `path` (a route path) may carry."""
    for prefix, cap in getattr(settings, "HTTP_MAX_BODY_BYTES_BY_PREFIX", {}).items():
        if path.startswith(prefix):
            return int(cap)
    return int(getattr(settings, "HTTP_MAX_BODY_BYTES", settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


def gate_for(path: str) -> Gate | None:
    for prefix, dotted in getattr(settings, "HTTP_HEADER_GATES", {}).items():
        if path.startswith(prefix):
            return import_string(dotted)
    return None


def answer(status: int, body: dict) -> bytes:
    """A whole HTTP answer that closes its connection: `body` as JSON."""
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n".encode()
            + b"content-length: " + str(len(data)).encode() + b"\r\nconnection: close\r\n\r\n" + data)


def _refuse(request, status: int, body: dict, reason: str) -> None:
    """Answer `request` with `body` and close its connection: nothing more of it is read."""
    if getattr(request, "_switchboard_refused", False):
        return
    request._switchboard_refused = True
    _deadline_cancel(request)
    request.content = io.BytesIO()  # what was kept is dropped
    channel = getattr(request, "channel", None)
    transport = getattr(channel, "transport", None)
    log.info("refused a request and closed its connection (%s): %s %s", reason, status, loggable(body.get("error")))
    CONNECTIONS_CLOSED.labels(reason).inc()
    _slot_release(request)
    if transport is not None:
        transport.write(answer(status, body))
        transport.loseConnection()


def _refuse_too_large(request, cap: int) -> None:
    _refuse(request, 413, {"error": "request_too_large", "detail": f"request bodies are limited to {cap} bytes"},
            "body_too_large")


# --- the body's deadline ---------------------------------------------------------------------------


def _deadline_start(request) -> None:
    seconds = float(getattr(settings, "HTTP_BODY_TIMEOUT_SECONDS", 0) or 0)
    if seconds <= 0:
        return
    from twisted.internet import reactor  # daphne's (asyncioreactor), installed before any request

    request._switchboard_deadline = reactor.callLater(seconds, _body_late, request, seconds)
    request.notifyFinish().addBoth(lambda _: _deadline_cancel(request))


def _deadline_cancel(request) -> None:
    call = getattr(request, "_switchboard_deadline", None)
    request._switchboard_deadline = None
    if call is not None and call.active():
        call.cancel()


def _body_late(request, seconds: float) -> None:
    request._switchboard_deadline = None
    if getattr(request, "_disconnected", False) or getattr(request, "_switchboard_body_done", False):
        return
    _refuse(request, 408, {"error": "request_timeout",
                           "detail": f"the request body did not arrive within {seconds:g} s of its headers"},
            "body_timeout")


# --- large bodies in flight, per key -----------------------------------------------------------------


def _slot_needed(request) -> bool:
    """Take one of its key's places for a request whose body has turned out large (declared, or read
    so far) for its gate's admission. True: it may be read on (not large, placed already, or placed
    now); False: no place was free, and it has been refused."""
    admission: Admission | None = getattr(request, "_switchboard_admission", None)
    if admission is None or getattr(request, "_switchboard_slot", None) is not None:
        return True
    size = max(getattr(request, "_switchboard_length", None) or 0, getattr(request, "_switchboard_read", 0))
    if size <= admission.large_over:
        return True
    if _large_bodies[admission.key] >= admission.slots:
        _refuse(request, 503, {"error": f"{admission.slots} calls over {admission.large_over} bytes from "
                                        f"{admission.key} are being read here already; retry"}, "large_bodies_busy")
        return False
    _large_bodies[admission.key] += 1
    request._switchboard_slot = admission.key
    request.notifyFinish().addBoth(lambda _: _slot_release(request))
    return True


def _slot_release(request) -> None:
    key = getattr(request, "_switchboard_slot", None)
    if key is None:
        return
    request._switchboard_slot = None
    _large_bodies[key] -= 1
    if _large_bodies[key] <= 0:
        del _large_bodies[key]


# --- the request's methods ---------------------------------------------------------------------------


def _head(request, path: str, length: int | None) -> RequestHead:
    headers: dict[str, str] = {}
    for name, values in request.requestHeaders.getAllRawHeaders():
        if values:
            headers.setdefault(name.decode("latin-1").lower(), values[0].decode("latin-1"))
    channel = request.channel
    return RequestHead(method=(getattr(channel, "_command", b"") or b"").decode("latin-1"), path=path,
                       target=(getattr(channel, "_path", b"") or b"").decode("latin-1"), headers=headers,
                       length=length)


def request_methods(request_class) -> tuple[Callable, Callable, Callable]:
    """`gotLength`, `handleContentChunk` and `process` for daphne's request class (a
    twisted.web.http.Request), around its own: its body is capped, timed and gated."""
    original_got_length = request_class.gotLength
    original_chunk = request_class.handleContentChunk
    original_process = request_class.process

    def got_length(self, length):
        path = route_path(getattr(self.channel, "_path", b"") or b"")
        cap = cap_for(path)
        self._switchboard_cap, self._switchboard_read, self._switchboard_length = cap, 0, length
        if length is not None and length > cap:
            self.content = io.BytesIO()
            _refuse_too_large(self, cap)
            return
        if length is None:
            self.content = io.BytesIO()  # chunked: in memory, and never past the cap
        else:
            original_got_length(self, length)
        if length != 0:
            _deadline_start(self)
        gate = gate_for(path)
        if gate is not None:
            gate_start(self, gate, _head(self, path, length))

    def gate_start(self, gate: Gate, head: RequestHead) -> None:
        self._switchboard_gate = "deciding"
        transport = getattr(self.channel, "transport", None)
        if transport is not None:
            transport.pauseProducing()  # what comes next waits in the socket until the gate has decided
        task = self._switchboard_gate_task = asyncio.ensure_future(gate(head))  # (held: the loop keeps no reference)
        task.add_done_callback(functools.partial(gate_decided, self))

    def gate_decided(self, task: asyncio.Future) -> None:
        if getattr(self, "_disconnected", False) or getattr(self, "_switchboard_refused", False):
            if not task.cancelled():
                task.exception()  # (retrieved: nobody waits for it)
            return
        try:
            verdict = task.result()
        except Exception:
            log.exception("the header check of %s failed", getattr(self.channel, "_path", b"?"))
            verdict = Refusal(503, {"error": f"{settings.DOMAIN_NAME} could not check the call now; retry"},
                              "header_check_failed")
        if isinstance(verdict, Refusal):
            _refuse(self, verdict.status, verdict.body, verdict.reason)
            return
        self._switchboard_admission, self._switchboard_gate = verdict, "passed"
        if not _slot_needed(self):
            return
        transport = getattr(self.channel, "transport", None)
        if transport is not None:
            transport.resumeProducing()
        if getattr(self, "_switchboard_waiting", False):
            self._switchboard_waiting = False
            original_process(self)

    def handle_content_chunk(self, data):
        if getattr(self, "_switchboard_refused", False):
            return
        cap = getattr(self, "_switchboard_cap", None)
        if cap is not None:
            self._switchboard_read += len(data)
            if self._switchboard_read > cap:
                _refuse_too_large(self, cap)
                return
            if not _slot_needed(self):
                return
        original_chunk(self, data)

    def process(self):
        if getattr(self, "_switchboard_refused", False):
            return None  # answered already; the connection is closing
        self._switchboard_body_done = True
        _deadline_cancel(self)
        if getattr(self, "_switchboard_gate", None) == "deciding":
            self._switchboard_waiting = True  # handed to daphne once the gate lets it through
            return None
        return original_process(self)

    return got_length, handle_content_chunk, process
