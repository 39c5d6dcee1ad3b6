"""`GET /sse/messages?channels=a,b` (docs/protocol.md, "Channel streams", the push seed's Server-Sent Events).

```
event:heartbeat            sent at once, then every heartbeat interval
data:{}

event:message              each publish, every message once and in channel order
data:{"channel":"a","message":"…"}
id:a:12,b:7                (extension) every channel's offset: Last-Event-ID on reconnect resumes them

event:reconnect            one grace period before the stream's (dithered) lifetime ends, and
data:{}                    when the node drains (then the stream ends at once)

event:missed               (extension) before a replay cut to the newest STREAM_REPLAY_MAX messages:
data:{"channel":"a","missed":n,"offset":k}   n skipped; the replay starts after offset k
```

No `channels`: 400 `{"error":"'channels' query parameter required"}`; a malformed `lastEventId` or
Last-Event-ID: 400; more streams than STREAM_MAX_PER_ADDRESS or STREAM_MAX_PER_APP: 429, with
Retry-After; a draining node: 503, with Retry-After. A plain ASGI application (not a Django view): it holds the response open for minutes, writes as publishes arrive, and needs the
node's channel hub and the socket's outgoing buffer. A reader that falls behind (what the node
holds for it passes PUSH_MAX_BUFFER_BYTES, or its queue of publishes overflows) never slows a
publisher or another reader: its stream is ended and counted, and it resumes with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from django.conf import settings

from foundation.asyncdb import run_db
from foundation.daphne_adapter import OUTGOING_EXTENSION
from foundation.draining import DRAINING_REASON, draining
from foundation.transport.frames import dumps
from messaging.channels.cursor import ChannelCursor
from messaging.channels.hub import ChannelKey
from messaging.core import metrics
from messaging.gateway.runtime import runtime
from messaging.gateway.streams.caps import StreamSlot, client_address, stream_slot_take
from messaging.gateway.streams.identity import (
    StreamRefused,
    event_id,
    header_text,
    query_params,
    resume_offsets,
    stream_identity,
)

log = logging.getLogger(__name__)
QUEUE_SIZE = 1000
HEARTBEAT = b"event:heartbeat\ndata:{}\n\n"
RECONNECT = b"event:reconnect\ndata:{}\n\n"
RETRY_AFTER_SECONDS = 5


class _FellBehind(Exception):
    pass


class _Reader:
    """The hub's side of one stream: publishes queue up; an overflow ends the stream."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=QUEUE_SIZE)
        self.behind = False
        self.leave = asyncio.Event()  # the node drains: `reconnect`, then the stream ends

    async def drain(self) -> None:
        self.leave.set()

    def channel_event(self, key: ChannelKey, offset: int, content: str) -> None:
        try:
            self.queue.put_nowait(("message", key[1], offset, content))
        except asyncio.QueueFull:
            self.behind = True

    def channel_resync(self, key: ChannelKey) -> None:
        try:
            self.queue.put_nowait(("repair", key[1], 0, ""))
        except asyncio.QueueFull:
            self.behind = True


async def _respond(send, status: int, body: dict, retry_after: bool = False) -> None:
    payload = dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if retry_after:  # a stream refused at a cap: another may end any moment
        headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class SseStream:
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, {"error": "method_not_allowed", "detail": "use GET"})
            return
        if draining():
            await _respond(send, 503, {"error": "draining", "detail": DRAINING_REASON}, retry_after=True)
            return
        try:
            slot = stream_slot_take(address=client_address(scope), transport="sse")
        except StreamRefused as exc:
            await _respond(send, exc.status, exc.body(), retry_after=True)
            return
        reader = _Reader()
        node = runtime()
        node.drainable_add(reader, reader.drain)
        try:
            await self._stream(scope, receive, send, slot, reader)
        finally:
            slot.release()
            node.drainable_remove(reader)  # a drain waits for the stream's end

    async def _stream(self, scope, receive, send, slot: StreamSlot, reader: _Reader) -> None:
        params = query_params(scope.get("query_string", b""))
        try:
            identity = await run_db(stream_identity, params)
            slot.take_app(identity.app.pk)
            last_event_id = header_text(scope, "Last-Event-ID")
            source = "the Last-Event-ID header" if last_event_id else "lastEventId"
            resume = resume_offsets(last_event_id or params.get("lastEventId"), identity.channels, source=source)
        except StreamRefused as exc:
            await _respond(send, exc.status, exc.body(), retry_after=exc.status == 429)
            return
        outgoing = (scope.get("extensions") or {}).get(OUTGOING_EXTENSION)
        node = runtime()
        await node.ensure_started()
        metrics.TRANSPORT_CONNECTIONS.labels("sse").inc()
        disconnected = asyncio.ensure_future(_wait_disconnect(receive))

        async def write(channel: str, offset: int, content: str) -> bool:
            if disconnected.done():
                return False  # the reader has gone: the replay stops, no more history is read for it
            if outgoing is not None and outgoing.pending() > settings.PUSH_MAX_BUFFER_BYTES:
                raise _FellBehind()
            event = (f"event:message\ndata:{dumps({'channel': channel, 'message': content})}\n"
                     f"id:{event_id({**cursor.positions, channel: offset})}\n\n")
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            return True

        async def missed(notice: dict) -> None:
            if not disconnected.done():
                body = dumps(notice)
                await send({"type": "http.response.body", "body": f"event:missed\ndata:{body}\n\n".encode(),
                            "more_body": True})

        cursor = ChannelCursor(app_id=identity.app.pk, hub=node.hub, reader=reader, write=write, transport="sse",
                               missed=missed)
        reason = "lifetime"
        try:
            # Joined before the first heartbeat: a client that has its heartbeat is subscribed.
            for name in identity.channels:
                await cursor.join(name)
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
            for name, offset in resume.items():  # Last-Event-ID: what was missed, then live
                if disconnected.done():
                    break
                await cursor.join(name, since=offset)
            reason = await self._serve(reader, cursor, send, disconnected)
        except _FellBehind:
            reason = "slow_reader"
        finally:
            disconnected.cancel()
            await cursor.leave_all()
            metrics.TRANSPORT_CONNECTIONS.labels("sse").dec()
            metrics.STREAM_CLOSED.labels("sse", reason).inc()
        if reason != "disconnected":
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _serve(self, reader: _Reader, cursor: ChannelCursor, send, disconnected: asyncio.Future) -> str:
        started = time.monotonic()
        lifetime = random.uniform(settings.PUSH_RECONNECT_DITHER_MIN_SECONDS, settings.PUSH_RECONNECT_DITHER_MAX_SECONDS)
        leaving = asyncio.ensure_future(reader.leave.wait())
        try:
            return await self._loop(reader, cursor, send, disconnected, leaving, started, lifetime)
        finally:
            leaving.cancel()

    async def _loop(self, reader: _Reader, cursor: ChannelCursor, send, disconnected: asyncio.Future,
                    leaving: asyncio.Future, started: float, lifetime: float) -> str:
        grace = settings.PUSH_CLIENT_GRACE_SECONDS
        reconnect_at, end_at = started + lifetime - grace, started + lifetime
        next_beat = started + settings.PUSH_HEARTBEAT_SECONDS
        told = False
        while True:
            if reader.behind:
                raise _FellBehind()
            now = time.monotonic()
            if now >= end_at:
                return "lifetime"
            if not told and now >= reconnect_at:
                await send({"type": "http.response.body", "body": RECONNECT, "more_body": True})
                told = True
            if now >= next_beat:
                await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
                next_beat = now + settings.PUSH_HEARTBEAT_SECONDS
            wake = min(next_beat, end_at if told else reconnect_at)
            get = asyncio.ensure_future(reader.queue.get())
            done, _ = await asyncio.wait({get, disconnected, leaving}, timeout=max(0.0, wake - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
            if disconnected in done:
                return "disconnected"
            if leaving in done:
                await send({"type": "http.response.body", "body": RECONNECT, "more_body": True})
                return "drain"
            if get.done() and not get.cancelled():
                kind, channel, offset, content = get.result()
                if kind == "message":
                    await cursor.publish(channel, offset, content)
                else:
                    cursor.mark(channel)
                    await cursor.repair()


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
