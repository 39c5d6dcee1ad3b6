"""The Pusher HTTP API (pusher.com/docs/channels/library_auth_reference/rest-api) on every web node,
for the `pusher` server libraries (Python, Node, PHP, Laravel's broadcaster) unchanged:

- `POST /apps/{app_id}/events` `{name, data, channel | channels (≤ 100), socket_id?, info?}` → `{}`
  (or `{"channels": {name: {subscription_count?, user_count?}}}` with `info`);
- `POST /apps/{app_id}/batch_events` `{batch: [{channel, name, data, socket_id?, info?}]}` (≤ 10) → `{}` or `{"batch": [...]}`;
- `GET /apps/{app_id}/channels?filter_by_prefix=&info=user_count,subscription_count` → `{"channels": {name: {...}}}`;
- `GET /apps/{app_id}/channels/{name}?info=…` → `{"occupied", "subscription_count"?, "user_count"?}`;
- `GET /apps/{app_id}/channels/{name}/users` → `{"users": [{"id"}]}` (presence channels);
- `POST /apps/{app_id}/users/{user_id}/terminate_connections` → `{}`: the user's signed-in
  connections, on every node, get `pusher:error` 4009 and are closed with it.

Every request is signed (messaging.gateway.pusher.api_auth). Errors are the API's: 400 with a text
reason, 401 (signature, key, timestamp, body_md5), 403 (credentials disabled), 404 (unknown app_id),
413 (an event's data over PUSHER_MAX_EVENT_BYTES), 429 with Retry-After past the app's API rate limit (the
budget the native REST API draws on too).
"""

from __future__ import annotations

import json
import math
import re

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError

from apps_registry.selectors import AppSnapshot, app_snapshot_by_pusher_app_id
from messaging.gateway.pusher import figures, metrics
from messaging.gateway.pusher import protocol as p
from messaging.gateway.pusher.api_auth import api_request_check
from messaging.gateway.pusher.services import (
    EventToPublish,
    channels_occupied,
    pusher_events_publish,
    subscription_count,
    user_count,
    users_of,
    users_terminate,
)
from messaging.intake.throttling import rate_limit_take

MAX_CHANNELS = 100
MAX_BATCH = 10
SOCKET_ID = re.compile(r"\d+\.\d+")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> HttpResponse:
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


def _signed(request: HttpRequest, app_id: str) -> AppSnapshot | HttpResponse:
    app = app_snapshot_by_pusher_app_id(app_id)
    params = {k: request.GET.get(k, "") for k in request.GET}
    refusal = api_request_check(app=app, method=request.method or "", path=request.path, params=params,
                                body=request.body, grace_seconds=settings.PUSHER_API_TIMESTAMP_GRACE_SECONDS)
    return _error(refusal.status, refusal.message) if refusal is not None else app


def _body(request: HttpRequest) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise BadRequest("The body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object")
    return body


def _event(item: dict, *, many: bool) -> EventToPublish:
    name, data, socket_id = item.get("name"), item.get("data"), item.get("socket_id")
    if not isinstance(name, str) or not 0 < len(name) <= p.PUSHER_NAME_MAX:
        raise BadRequest(f"name must be an event name of 1 to {p.PUSHER_NAME_MAX} characters")
    if not isinstance(data, str):
        raise BadRequest("data must be a string (JSON-encode objects)")
    if len(data.encode()) > settings.PUSHER_MAX_EVENT_BYTES:
        raise BadRequest(f"data is larger than {settings.PUSHER_MAX_EVENT_BYTES} bytes", status=413)
    channels = item.get("channels") if many and "channels" in item else [item.get("channel")]
    if not isinstance(channels, list) or not 0 < len(channels) <= MAX_CHANNELS:
        raise BadRequest(f"channels must be a list of 1 to {MAX_CHANNELS} channel names")
    for channel in channels:
        if (problem := p.api_channel_problem(channel)) is not None:
            raise BadRequest(f"{str(channel)[:200]!r}: {problem}")
    if socket_id is not None and (not isinstance(socket_id, str) or not SOCKET_ID.fullmatch(socket_id)):
        raise BadRequest("socket_id must be a socket id (digits.digits)")
    return EventToPublish(channels=channels, name=name, data=data, socket_id=socket_id)


def _info(app: AppSnapshot, channel: str, wanted: set[str], occupied: int | None = None) -> dict:
    out: dict = {}
    if "subscription_count" in wanted:
        out["subscription_count"] = subscription_count(app.pk, channel) if occupied is None else occupied
    if "user_count" in wanted and p.channel_kind(channel).presence:
        out["user_count"] = user_count(app.pk, channel)
    return out


def _wanted(info: object) -> set[str]:
    return {part.strip() for part in info.split(",")} if isinstance(info, str) else set()


def _throttled(app: AppSnapshot) -> HttpResponse | None:
    """The app's server API budget (messaging.intake.throttling), shared with the native REST API."""
    try:
        wait = rate_limit_take(app_pk=app.pk, rate=app.api_rate_limit_per_second, burst=app.api_rate_limit_burst)
    except RedisError:
        return None  # the limit protects the platform; a request needs Redis anyway to reach anyone
    if not wait:
        return None
    response = _error(429, "Too many requests: the app's API rate limit")
    response["Retry-After"] = str(max(1, math.ceil(wait)))
    return response


def _api(view):
    @csrf_exempt
    def wrapped(request: HttpRequest, app_id: str, **kwargs) -> HttpResponse:
        signed = _signed(request, app_id)
        if isinstance(signed, HttpResponse):
            return signed
        if (throttled := _throttled(signed)) is not None:
            return throttled
        try:
            return view(request, signed, **kwargs)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
    return wrapped


def _published(app: AppSnapshot, count: int) -> None:
    metrics.PUBLISHED.labels(app.app_name, "api").inc(count)
    figures.published_count(app_id=app.pk, count=count)


@_api
def events(request: HttpRequest, app: AppSnapshot) -> HttpResponse:
    if request.method != "POST":
        return _error(405, "POST an event")
    body = _body(request)
    event = _event(body, many=True)
    pusher_events_publish(app_id=app.pk, events=[event])
    _published(app, len(event.channels))
    wanted = _wanted(body.get("info"))
    if not wanted:
        return JsonResponse({})
    return JsonResponse({"channels": {c: _info(app, c, wanted) for c in event.channels}})


@_api
def batch_events(request: HttpRequest, app: AppSnapshot) -> HttpResponse:
    if request.method != "POST":
        return _error(405, "POST a batch")
    batch = _body(request).get("batch")
    if not isinstance(batch, list) or not 0 < len(batch) <= MAX_BATCH:
        raise BadRequest(f"batch must be a list of 1 to {MAX_BATCH} events")
    if not all(isinstance(item, dict) for item in batch):
        raise BadRequest("every batch item must be an object")
    items = [_event(item, many=False) for item in batch]
    pusher_events_publish(app_id=app.pk, events=items)
    _published(app, len(items))
    if not any(item.get("info") for item in batch):
        return JsonResponse({})
    return JsonResponse({"batch": [_info(app, e.channels[0], _wanted(item.get("info")))
                                   for e, item in zip(items, batch, strict=True)]})


@_api
def channels(request: HttpRequest, app: AppSnapshot) -> HttpResponse:
    prefix = request.GET.get("filter_by_prefix", "")
    wanted = _wanted(request.GET.get("info"))
    if "user_count" in wanted and not prefix.startswith("presence-"):
        raise BadRequest("info=user_count needs filter_by_prefix=presence-")
    occupied = channels_occupied(app.pk, prefix)
    return JsonResponse({"channels": {name: _info(app, name, wanted, count) for name, count in sorted(occupied.items())}})


@_api
def channel(request: HttpRequest, app: AppSnapshot, name: str) -> HttpResponse:
    if (problem := p.channel_name_problem(name)) is not None:
        raise BadRequest(problem)
    wanted = _wanted(request.GET.get("info"))
    if "user_count" in wanted and not p.channel_kind(name).presence:
        raise BadRequest("user_count is only for presence channels")
    count = subscription_count(app.pk, name)
    return JsonResponse({"occupied": count > 0, **_info(app, name, wanted, count)})


@_api
def channel_users(request: HttpRequest, app: AppSnapshot, name: str) -> HttpResponse:
    if (problem := p.channel_name_problem(name)) is not None:
        raise BadRequest(problem)
    if not p.channel_kind(name).presence:
        raise BadRequest("users are listed for presence channels only")
    return JsonResponse({"users": [{"id": user} for user in users_of(app.pk, name)]})


@_api
def terminate_connections(request: HttpRequest, app: AppSnapshot, user_id: str) -> HttpResponse:
    if request.method != "POST":
        return _error(405, "POST to terminate")
    if p.user_channel(user_id) is None:
        raise BadRequest("the user id is not one this server can name")
    users_terminate(app.pk, user_id)
    return JsonResponse({})
