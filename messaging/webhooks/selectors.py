"""Read-side queries of webhooks, and the per-process cache of which events each app has
endpoints for.

Events happen on hot paths (every connect and disconnect, every channel's first reader), and most
apps have no endpoint for most events. Asking Postgres each time would cost a query per event for
nothing, so each process remembers, per app, the set of events its enabled endpoints want, for
CACHE_TTL seconds: a new or changed endpoint is heard from within that time on every node (at
once in the process that made the change). Recording re-checks against the endpoints table in
the same statement, so a stale "yes" records nothing for an endpoint that is gone or disabled.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from django.db.models import Count

from messaging.webhooks.models import (
    WEBHOOK_ALL_EVENTS,
    WEBHOOK_OPEN_STATES,
    WEBHOOK_SUBSCRIBABLE_EVENTS,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookState,
)

CACHE_TTL = 5.0
CACHE_SIZE = 4096  # apps remembered per process

_wanted: OrderedDict[int, tuple[float, frozenset[str]]] = OrderedDict()
_wanted_lock = threading.Lock()


def webhook_events_wanted_cached(app_id: int) -> frozenset[str] | None:
    """What the cache knows, without any I/O: the events the app has endpoints for, or None when
    it does not know (never asked, or too old). Safe on an event loop."""
    with _wanted_lock:
        cached = _wanted.get(app_id)
    if cached is None or time.monotonic() - cached[0] >= CACHE_TTL:
        return None
    return cached[1]


def webhook_events_wanted(app_id: int) -> frozenset[str]:
    """The events the app's enabled endpoints want (from the cache, else one query)."""
    known = webhook_events_wanted_cached(app_id)
    if known is not None:
        return known
    wanted: set[str] = set()
    for events in WebhookEndpoint.objects.filter(app_id=app_id, enabled=True).values_list("events", flat=True):
        wanted.update(WEBHOOK_SUBSCRIBABLE_EVENTS if WEBHOOK_ALL_EVENTS in events else ())
        wanted.update(e for e in events if e != WEBHOOK_ALL_EVENTS)  # (Pusher's are always named)
    result = frozenset(wanted)
    with _wanted_lock:
        _wanted[app_id] = (time.monotonic(), result)
        _wanted.move_to_end(app_id)
        while len(_wanted) > CACHE_SIZE:
            _wanted.popitem(last=False)
    return result


def webhook_events_forget(app_id: int | None = None) -> None:
    """Drop what the cache knows about one app (after its endpoints changed here), or all apps."""
    with _wanted_lock:
        if app_id is None:
            _wanted.clear()
        else:
            _wanted.pop(app_id, None)


def webhook_endpoint_list(*, app_id: int) -> list[WebhookEndpoint]:
    """The app's endpoints, oldest first (the app_id foreign-key index). Their secrets are on the
    rows: show them to nobody."""
    return list(WebhookEndpoint.objects.filter(app_id=app_id).order_by("id"))


def webhook_endpoint_get(*, app_id: int, endpoint_id: int) -> WebhookEndpoint | None:
    """One endpoint of the app; None for another app's (or no) endpoint."""
    return WebhookEndpoint.objects.filter(app_id=app_id, pk=endpoint_id).first()


def webhook_backlog() -> dict[str, int]:
    """Open (pending, retrying) and dead webhook deliveries, by state, cluster-wide. Served by the
    partial indexes webhook_delivery_due and webhook_delivery_dead: delivered rows are not read."""
    counts = dict.fromkeys((*WEBHOOK_OPEN_STATES, WebhookState.DEAD.value), 0)
    open_rows = WebhookDelivery.objects.filter(state__in=WEBHOOK_OPEN_STATES).values("state")
    for row in open_rows.annotate(n=Count("pk")).order_by():
        counts[row["state"]] = row["n"]
    counts[WebhookState.DEAD.value] = WebhookDelivery.objects.filter(state=WebhookState.DEAD.value).count()
    return counts
