"""The one door to the sockets: every event for a live connection goes through here.

Events travel over the Redis channel layer to the node holding the connection, where the
consumer method named after the event type (``message.deliver`` -> ``message_deliver``) writes
to the socket. Each event type has a TypedDict below.

Web nodes call the async functions from their event loop; Celery workers (sync code) call the
``*_sync`` variants.

With the pub/sub channel layer (the default) a send is a Redis PUBLISH on the channel's name of
the layer's serialized event. channels-redis serialises every publish of a process behind one
lock, one round trip at a time; this door instead pipelines all the publishes of a batch in one
round trip (writing what the layer would: foundation.patches.channels_redis), and PUBLISH's answer
(how many subscribers got it) tells at once whether anyone holds that connection any more: zero
means nobody does (the recipient went offline, or its node died). With the core layer it falls back to `layer.send`, on one long-lived loop thread per worker
process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine, Iterable
from typing import Any, Literal, NotRequired, TypedDict

from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer

from foundation.patches.channels_redis import local_queues, publishes_queue
from foundation.transport.redis_clients import async_client, sync_client

log = logging.getLogger(__name__)


class DeliverItem(TypedDict):
    delivery_id: int
    message_id: int
    frame: str  # the JSON text written to the socket as is
    stored_at: float  # epoch seconds the message was stored (for the delivery-latency metric)
    claim: int  # the claim the push was made under (a connection that cannot take it releases it)


class MessageDeliverEvent(TypedDict):
    type: Literal["message.deliver"]
    items: list[DeliverItem]


class MessageFastEvent(TypedDict):
    type: Literal["message.fast"]
    frame: str


class PresenceEvent(TypedDict):
    type: Literal["presence.event"]
    frame: str
    user_id: str  # whom the frame is about,
    online: bool  # and what it says: the master's connection writes it only while it is still true
    domain: NotRequired[str]  # a user of another domain (presence.remote): checked against that domain's list


class PresenceResyncEvent(TypedDict):
    """A master user's connection compares what it told with who is online (presence.master_view)."""

    type: Literal["presence.resync"]


class ExchangeEventsEvent(TypedDict):
    """EVENT frames of the event exchange for one connection, in sequence order (one channel-layer
    event per connection per batch, not per frame)."""

    type: Literal["exchange.events"]
    frames: list[str]


class ConnectionCloseEvent(TypedDict):
    """Close one connection with `code`; `final`: it is ended for good (closed by its app's master
    user, the API or an operator), so a client that would reconnect by itself is told not to
    (Socket.IO's DISCONNECT); otherwise it may come back (a drain, a takeover)."""

    type: Literal["connection.close"]
    code: int
    reason: str
    final: NotRequired[bool]


class ChannelMembershipEvent(TypedDict):
    """A server-managed subscription changed: the connection joins or leaves the channel live."""

    type: Literal["channel.join", "channel.leave"]
    channel: str


Event = (MessageDeliverEvent | MessageFastEvent | PresenceEvent | PresenceResyncEvent | ConnectionCloseEvent
         | ChannelMembershipEvent | ExchangeEventsEvent)


def message_deliver_event(items: list[DeliverItem]) -> MessageDeliverEvent:
    return {"type": "message.deliver", "items": items}


def message_fast_event(frame: str) -> MessageFastEvent:
    return {"type": "message.fast", "frame": frame}


def presence_event(frame: str, *, user_id: str, online: bool, domain: str | None = None) -> PresenceEvent:
    event: PresenceEvent = {"type": "presence.event", "frame": frame, "user_id": user_id, "online": online}
    if domain is not None:
        event["domain"] = domain
    return event


def presence_resync_event() -> PresenceResyncEvent:
    return {"type": "presence.resync"}


def exchange_events_event(frames: list[str]) -> ExchangeEventsEvent:
    return {"type": "exchange.events", "frames": frames}


def connection_close_event(code: int, reason: str, *, final: bool = False) -> ConnectionCloseEvent:
    event: ConnectionCloseEvent = {"type": "connection.close", "code": code, "reason": reason}
    if final:
        event["final"] = True
    return event


def channel_join_event(channel: str) -> ChannelMembershipEvent:
    return {"type": "channel.join", "channel": channel}


def channel_leave_event(channel: str) -> ChannelMembershipEvent:
    return {"type": "channel.leave", "channel": channel}


class NoSubscriber(Exception):
    """Nobody listens on that channel any more (the connection or its node is gone)."""


def _pubsub_layer():
    layer = get_channel_layer()
    return layer if isinstance(layer, RedisPubSubChannelLayer) else None


def _outcomes(sends: list[tuple[str, Event]], counts: list) -> list[tuple[str, Exception]]:
    failures = []
    for (channel, _), count in zip(sends, counts, strict=True):
        if isinstance(count, Exception):
            failures.append((channel, count))
        elif not count:
            failures.append((channel, NoSubscriber(channel)))
    return failures


def _all_failed(sends: list[tuple[str, Event]], exc: Exception) -> list[tuple[str, Exception]]:
    # Redis away: every send failed; the caller retries them (stored ones come back via the sweep).
    log.warning("publishing %d events failed: %r", len(sends), exc)
    return [(channel, exc) for channel, _ in sends]


async def send_many(sends: Iterable[tuple[str, Event]]) -> list[tuple[str, Exception]]:
    """Send each (channel, event); returns the channels that could not be reached and why."""
    sends = list(sends)
    if not sends:
        return []
    layer = _pubsub_layer()
    if layer is not None:
        remote, local = [], local_queues(layer)
        for channel, event in sends:
            if (queue := local.get(channel)) is not None:
                queue.put_nowait(layer.serialize(event))  # read here: as Redis would hand it back, without Redis
            else:
                remote.append((channel, event))
        if not remote:
            return []
        pipe = async_client().pipeline(transaction=False)
        publishes_queue(pipe, layer, remote)
        try:
            return _outcomes(remote, await pipe.execute(raise_on_error=False))
        except Exception as exc:
            return _all_failed(remote, exc)
    layer = get_channel_layer()
    results = await asyncio.gather(*(layer.send(channel, event) for channel, event in sends), return_exceptions=True)
    failures = []
    for (channel, _), result in zip(sends, results, strict=True):
        if isinstance(result, Exception):
            log.warning("channel-layer send to %s failed: %r", channel, result)
            failures.append((channel, result))
    return failures


# --- sync side (workers) -------------------------------------------------------------------------


class _LoopThread:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sockets-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def _loop_thread() -> _LoopThread:
    global _loop
    with _loop_lock:
        # Celery's prefork children inherit the parent's object but not its thread: start anew.
        if _loop is None or _loop.pid != os.getpid():
            _loop = _LoopThread()
        return _loop


def send_many_sync(sends: Iterable[tuple[str, Event]], timeout: float = 10) -> list[tuple[str, Exception]]:
    sends = list(sends)
    if not sends:
        return []
    layer = _pubsub_layer()
    if layer is not None:
        pipe = sync_client().pipeline(transaction=False)
        publishes_queue(pipe, layer, sends)
        try:
            return _outcomes(sends, pipe.execute(raise_on_error=False))
        except Exception as exc:
            return _all_failed(sends, exc)
    return _loop_thread().run(send_many(sends), timeout)


def run_async(coro: Coroutine[Any, Any, Any], timeout: float = 10) -> Any:
    """Run a coroutine that uses the channel layer or async Redis from sync worker code."""
    return _loop_thread().run(coro, timeout)
