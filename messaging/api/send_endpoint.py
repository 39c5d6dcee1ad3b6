"""`POST /api/v1/messages` on the web node's event loop, through the node's intake (the group commit
/ws senders use).

Django's own path for an API request crosses threads several times (the site's middleware chain is
synchronous because of WhiteNoise, the request signals close connections in a thread, the DRF view
runs on the database pool), and stores each send with a transaction of its own. Here a send is
read, authenticated, rate limited, checked and answered on the event loop:

- the key and its app come from the process's caches (messaging.api.authentication,
  apps_registry.selectors); only a key or an app not seen in the last few seconds costs a trip to
  the database pool;
- the app's rate limit is the same Redis token bucket (messaging.intake.throttling), asked with the
  loop's client, once per app for the sends that arrive in one turn of the loop;
- the body is checked by the same serializer and the same rules (messaging.intake.server_sends) as the DRF
  view's; a refusal is rendered by the API's exception handler, so it is the same answer;
- a RELIABLE send goes into the intake with whatever else is waiting (other REST sends, /ws
  senders) and is answered once that batch has committed; its Idempotency-Key is claimed, and its
  answer stored, in the same transaction as the batch's messages (messaging.intake.group_commit.KeyedSend). A
  FAST send is pushed from the loop.

What this path does not handle itself goes to Django unchanged, body and all, and is answered there
exactly as before: another method, a body that is not plain UTF-8 JSON or is larger than the API's
limit, a missing or unknown key, an invalid Idempotency-Key, and a FAST send with an
Idempotency-Key (its answer is stored by the DRF view). Those answers are the documented ones by
construction; the ones given here are built by the same functions, and a system test holds the two
paths' answers equal (tests/system/test_api_async_send.py). `switchboard_api_send_path_total` counts
which path answered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from io import BytesIO
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from prometheus_client import Counter
from redis.exceptions import RedisError
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.utils import json as drf_json

from apps_registry.selectors import AppSnapshot, app_snapshot, app_snapshot_known
from foundation.asyncdb import run_db
from foundation.http_metrics import REQUEST_LATENCY
from foundation.metrics import REGISTRY
from messaging.api import metrics
from messaging.api.authentication import KEY_TEXT, verified_key, verified_key_remembered
from messaging.api.base import declared_too_large, fast_answer, reliable_answer
from messaging.api.errors import api_exception_handler
from messaging.api.serializers import MessageSendSerializer
from messaging.core import metrics as messaging_metrics
from messaging.core.accept import SendRefused
from messaging.core.delivery.fast import message_fast_send_async
from messaging.core.idempotency import HEADER, IdempotencyConflict, idempotency_key_valid, request_fingerprint
from messaging.core.protocol import FEATURE_FAST
from messaging.gateway.runtime import runtime
from messaging.intake.batching import BatcherFull, LoopBatcher
from messaging.intake.group_commit import KeyedSend, Replayed
from messaging.intake.server_sends import server_message_check
from messaging.intake.throttling import Bucket, rate_limit_take_many

log = logging.getLogger(__name__)

SEND_PATH = Counter("switchboard_api_send_path_total", "POST /api/v1/messages by the path that answered it: "
                    "event_loop (through the intake) or django (what that path hands on)", ["path"],
                    registry=REGISTRY)
ROUTE = "api-messages"
ALLOW = b"POST, OPTIONS"  # what DRF's view names in `Allow`

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Request:
    raw_key: str
    idempotency_key: str | None
    data: Any
    path: str


class SendEndpoint:
    """The ASGI app of `^api/v1/messages$` (config.asgi); `django` answers what it hands on."""

    def __init__(self, django: Callable[[Scope, Receive, Send], Awaitable[None]]):
        self.django = django
        self.renderer = JSONRenderer()
        # One serializer reads every send (DRF builds a serializer's fields per instance, which
        # costs more than reading a body); `run_validation` keeps no state between bodies.
        self.reader = MessageSendSerializer()
        # The rate-limit tokens of the sends that arrive in one turn of the loop: one script call
        # per app, in one pipeline.
        self.rate_limits = LoopBatcher("api rate limit", rate_limit_take_many)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.django(scope, receive, send)
            return
        started = time.perf_counter()
        body = await _body(receive)
        if body is None:
            return  # the client went away
        request = _request(scope, body)
        reply = await self._reply(request) if request is not None else None
        if reply is None:
            SEND_PATH.labels("django").inc()
            await self.django(scope, _replaying(body, receive), send)
            return
        SEND_PATH.labels("event_loop").inc()
        content = self.renderer.render(reply.body)
        headers = [(b"content-type", b"application/json"), (b"allow", ALLOW),
                   *((k.lower().encode(), v.encode("latin-1")) for k, v in reply.headers),
                   *_site_headers(scope), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        REQUEST_LATENCY.labels(ROUTE, "POST", f"{reply.status // 100}xx").observe(time.perf_counter() - started)

    async def _reply(self, request: Request) -> Reply | None:
        """The answer, or None: Django answers this one."""
        app = await _caller(request.raw_key)
        if app is None:
            return None
        invalid, data = None, {}
        try:
            data = self.reader.run_validation(request.data)
        except exceptions.ValidationError as exc:
            invalid = exc
        if invalid is None and data["feature"] == FEATURE_FAST and request.idempotency_key is not None:
            return None
        try:
            wait = await self.rate_limits.submit(Bucket(app.pk, app.api_rate_limit_per_second,
                                                        app.api_rate_limit_burst))
        except RedisError:
            log.warning("API rate limit not applied: Redis unavailable", exc_info=True)
            wait = 0.0
        try:
            if wait:
                raise exceptions.Throttled(wait)
            if invalid is not None:
                raise invalid
            reply = await _send(app, request, data)
        except Exception as exc:  # rendered as the DRF view's exception handler renders it
            return _refusal(exc)
        metrics.API_SENDS.labels(data["feature"]).inc()
        return reply


async def _caller(raw_key: str) -> AppSnapshot | None:
    """The key's app (from the caches; the database only for what they do not hold), or None: the
    key is not valid, and Django's authentication says so."""
    key = verified_key_remembered(raw_key) or await run_db(verified_key, raw_key)
    if key is None:
        return None
    known, app = app_snapshot_known(key.app_name)
    if not known:
        app = await run_db(app_snapshot, key.app_name)
    return app if app is not None and app.pk == key.app_pk else None


async def _send(app: AppSnapshot, request: Request, data: dict[str, Any]) -> Reply:
    group, recipients = data["to"]
    checked = server_message_check(app=app, recipients=recipients, content=data["content"], group=group,
                                   feature=data["feature"], sender=data.get("sender"), reference=data["reference"],
                                   confirmation=data["confirmation"])
    message = checked.message
    if checked.feature == FEATURE_FAST:
        connections = await message_fast_send_async(app=app, sender=message.sender, recipients=message.recipients,
                                                    content=message.content, reference=message.reference)
        return Reply(status.HTTP_200_OK, fast_answer(message.sender, message.recipients, connections))
    answer = reliable_answer(message.sender, message.recipients)
    item = message if request.idempotency_key is None else KeyedSend(
        message, request.idempotency_key,
        request_fingerprint(method="POST", path=request.path, body=request.data), answer)
    node = runtime()
    await node.ensure_started()
    try:
        result = await node.intake.submit(item)
    except BatcherFull as exc:
        messaging_metrics.INTAKE_REFUSED.inc()
        return _busy(exc.retry_after)
    if isinstance(result, Replayed):
        return Reply(result.status, result.body, (("Idempotent-Replayed", "true"),))
    return Reply(status.HTTP_201_CREATED, {"id": str(result.message_id), **answer})


def _busy(retry_after: float) -> Reply:
    metrics.API_ERRORS.labels("unavailable").inc()
    return Reply(status.HTTP_503_SERVICE_UNAVAILABLE,
                 {"error": "unavailable", "detail": "the server is busy: the message was not stored; retry later"},
                 (("Retry-After", str(max(1, round(retry_after + 0.5)))),))


def _refusal(exc: Exception) -> Reply:
    """What the API's exception handler answers for `exc` (it counts the error, and logs what it
    does not expect)."""
    if not isinstance(exc, (exceptions.APIException, SendRefused, IdempotencyConflict)):
        log.debug("send on the event loop failed", exc_info=exc)
    response = api_exception_handler(exc, {})
    return Reply(response.status_code, response.data,
                 tuple((k, v) for k, v in response.items() if k.lower() != "content-type"))


def _request(scope: Scope, body: bytes) -> Request | None:
    """The parts of a send this path handles itself, or None (Django answers it)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in headers:
            return None  # a header given twice: Django decides what it means
        headers[name] = value
    media, _, params = headers.get(b"content-type", b"").partition(b";")
    if media.strip().lower() != b"application/json" or params.strip().lower() not in (b"", b"charset=utf-8"):
        return None
    if not body or len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE or declared_too_large(
            headers.get(b"content-length", b"0").decode("latin-1")):
        return None
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not KEY_TEXT.fullmatch(token):
        return None
    idempotency_key = headers.get(HEADER.lower().encode())
    if idempotency_key is not None:
        idempotency_key = idempotency_key.decode("latin-1")
        if not idempotency_key_valid(idempotency_key):
            return None
    try:
        data = drf_json.loads(body.decode("utf-8"), parse_constant=drf_json.strict_constant)
    except ValueError:  # not UTF-8 (UnicodeDecodeError) or not JSON: Django's parser words the error
        return None
    return Request(token, idempotency_key, data, scope.get("root_path", "") + scope["path"])


async def _body(receive: Receive) -> bytes | None:
    """The request's body (the web node has capped its size already: foundation.body_cap), or None
    when the client went away."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for Django: the body read here, then whatever the connection says next."""
    given = False

    async def replay() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _site_headers(scope: Scope) -> tuple[tuple[bytes, bytes], ...]:
    """The headers the site's middleware puts on every answer (security headers, frame options),
    as it would for this request: they depend only on whether it came over HTTPS."""
    proxy = _proxy_header()
    forwarded = next((v for k, v in scope["headers"] if k == proxy), None) if proxy else None
    return _site_headers_for(scope.get("scheme", "http"), forwarded)


@lru_cache(maxsize=1)
def _proxy_header() -> bytes | None:
    """SECURE_PROXY_SSL_HEADER as the header's name on the wire (`HTTP_X_FORWARDED_PROTO`:
    `x-forwarded-proto`), or None."""
    proxy = settings.SECURE_PROXY_SSL_HEADER
    return proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode() if proxy else None


@lru_cache(maxsize=16)
def _site_headers_for(scheme: str, forwarded: bytes | None) -> tuple[tuple[bytes, bytes], ...]:
    headers = [(b"host", b"localhost")]
    if forwarded is not None:
        headers.append((_proxy_header(), forwarded))
    request = ASGIRequest({"type": "http", "method": "POST", "path": "/", "scheme": scheme, "headers": headers,
                           "query_string": b"", "server": ("localhost", 80)}, BytesIO())
    response = HttpResponse()
    for middleware in (SecurityMiddleware, XFrameOptionsMiddleware):
        response = middleware(HttpResponse).process_response(request, response)
    return tuple((k.lower().encode(), v.encode("latin-1")) for k, v in response.items() if k.lower() != "content-type")
