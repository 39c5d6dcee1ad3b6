"""EVENT frames for an app's users connected over /ws: the engine (`manage.py eventsource`) calls
`events_to_ws` after each committed batch, when `ws_listeners` says anyone could get one.

User N of the event source is `<appName>-N` on /ws. Recipients are those of the TCP clients: F and P
go to `to`, B to every connected user, S to every current follower of `from`, U to nobody. A user
who is not connected gets nothing (as on TCP). Each connection gets its frames of a batch in one
channel-layer event, in sequence order, through the one door to the sockets.

Followers for S come from the durable graph (Follow), committed before the call, so as of the end
of the batch. An S event in the middle of a batch is owed the followers as of that event: the
batch's own F and U events are replayed over the edges they touch. For such an edge the state
before the batch cannot be read any more; it is taken as the opposite of the edge's first F or U in
the batch (a follow of someone not yet followed, an unfollow of someone followed), which is exact
for every stream that does not repeat a follow or an unfollow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.conf import settings
from redis.exceptions import RedisError

from apps_registry.models import ClientApp
from foundation.transport import sockets
from messaging.core.protocol import BIGINT_MAX, event_frame, plain_int
from messaging.exchange.selectors import follow_edges_among
from presence import cache
from presence.online import app_online_count_sync, app_online_users_sync

log = logging.getLogger(__name__)

Event = tuple[int, str, int | None, int | None]  # (seq, kind, from, to), as the engine applied it

_app_names: dict[int, str | None] = {}
_listeners: dict[int, tuple[float, bool]] = {}
_lock = threading.Lock()


def _app_name(app_id: int) -> str | None:
    # An app's name is its users' prefix: it never changes while the app has users.
    if app_id not in _app_names:
        _app_names[app_id] = ClientApp.objects.filter(pk=app_id).values_list("app_name", flat=True).first()
    return _app_names[app_id]


def ws_listeners(app_id: int) -> bool:
    """Whether any user of the app is connected (so a batch may owe someone an EVENT frame). The
    engine asks per batch: the answer (one ZCARD of the app's online index) is reused for
    EXCHANGE_WS_LISTENERS_TTL_SECONDS, so a user who has just connected may miss that long of events."""
    now = time.monotonic()
    with _lock:
        cached = _listeners.get(app_id)
    if cached is not None and now - cached[0] < settings.EXCHANGE_WS_LISTENERS_TTL_SECONDS:
        return cached[1]
    name = _app_name(app_id)
    try:
        listening = name is not None and app_online_count_sync(name) > 0
    except RedisError:
        log.warning("exchange: cannot tell whether app %s has /ws users (Redis)", app_id, exc_info=True)
        listening = False
    with _lock:
        _listeners[app_id] = (now, listening)
    return listening


def ws_listeners_forget() -> None:
    """Drop the cached answers (tests; an app renamed in the admin)."""
    with _lock:
        _listeners.clear()
        _app_names.clear()


def _online_numbers(app_name: str) -> dict[int, str]:
    """The app's connected users that the event source can name (`<appName>-<number>`), by number."""
    prefix, found = f"{app_name}-", {}
    for user_id in app_online_users_sync(app_name):
        digits = user_id[len(prefix):] if user_id.startswith(prefix) else ""
        number = plain_int(digits, BIGINT_MAX)
        if number is not None and str(number) == digits:
            found[number] = user_id
    return found


def _followers_at_each_status(app_id: int, batch: Sequence[Event], online: Iterable[int]) -> dict[int, list[int]]:
    """For each S event of the batch (by its index), the connected followers of its sender then."""
    senders = {sender for _, kind, sender, _ in batch if kind == "S"}
    online = set(online)
    edges = follow_edges_among(app_id=app_id, followees=senders, followers=online)  # as of the batch's end
    first_change: dict[tuple[int, int], str] = {}
    for _, kind, sender, to in batch:
        if kind in "FU" and to in senders and sender in online:
            first_change.setdefault((sender, to), kind)
    for edge, kind in first_change.items():  # back to the state before the batch (see the module's note)
        (edges.discard if kind == "F" else edges.add)(edge)
    followers: dict[int, set[int]] = defaultdict(set)
    for follower, followee in edges:
        followers[followee].add(follower)
    found: dict[int, list[int]] = {}
    for index, (_, kind, sender, to) in enumerate(batch):
        if kind in "FU" and (sender, to) in first_change:
            (followers[to].add if kind == "F" else followers[to].discard)(sender)
        elif kind == "S":
            found[index] = sorted(followers[sender])
    return found


def events_to_ws(app_id: int, batch: Sequence[Event]) -> int:
    """Push the EVENT frames a committed batch owes the app's connected users; returns how many
    frames went out (to connections still there). Never raises for Redis: /ws users miss the batch."""
    name = _app_name(app_id)
    if name is None or not batch:
        return 0
    try:
        online = _online_numbers(name)
        if not online:
            return 0
        statuses = _followers_at_each_status(app_id, batch, online) if any(e[1] == "S" for e in batch) else {}
        frames: dict[str, list[str]] = defaultdict(list)  # user id -> its frames, in sequence order
        for index, (seq, kind, sender, to) in enumerate(batch):
            if kind in "FP":
                recipients: Iterable[int] = (to,) if to in online else ()
            elif kind == "B":
                recipients = online
            elif kind == "S":
                recipients = statuses.get(index, ())
            else:
                continue
            frame = event_frame(seq=seq, kind=kind, sender=sender, to=to)
            for number in recipients:
                frames[online[number]].append(frame)
        connections = cache.connections_of_many(frames)
        sends = [(c.channel_name, sockets.exchange_events_event(frames[user]))
                 for user, conns in connections.items() for c in conns]
        failures = {channel for channel, _ in sockets.send_many_sync(sends)}
    except RedisError:
        log.warning("exchange: EVENT frames of app %s not pushed (Redis)", app_id, exc_info=True)
        return 0
    return sum(len(event["frames"]) for channel, event in sends if channel not in failures)
