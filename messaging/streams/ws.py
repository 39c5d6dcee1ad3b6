"""`WS /ws/messages?channels=a,b` (docs/protocol.md, "Channel streams", the push seed's WebSocket endpoint).

- `{"event":"ping","data":{}}` at once and every heartbeat interval; the client answers
  `{"event":"pong"}` within the grace period or is closed (4004);
- `{"event":"message","data":{"channel":…,"message":…,"offset":…}}` for each publish (`offset`
  is an extension), every message once and in channel order;
- the connection lives a random time between the reconnect dither bounds; one grace period
  before it ends, `{"event":"reconnect","data":{}}`; then the server closes (1000);
- a client `{"event":"ping"}` gets `{"event":"pong","data":{}}`;
- no `channels`: `{"error":"'channels' query parameter required"}`, then close (1008).

`?since=news:12,sport:7` (an extension) replays what came after those offsets first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

from django.conf import settings

from foundation.transport.frames import CLOSE_NORMAL, CLOSE_POLICY, dumps
from messaging import metrics
from messaging.asyncdb import run_db
from messaging.channels.cursor import ChannelCursor
from messaging.connection.inbox import ChannelReaderConsumer
from messaging.limits import TokenBucket
from messaging.runtime import runtime
from messaging.streams.identity import StreamRefused, query_params, resume_offsets, stream_identity

log = logging.getLogger(__name__)
CLOSE_PONG_TIMEOUT = 4004
FRAMES_PER_SECOND, FRAMES_BURST = 10.0, 20

PING = dumps({"event": "ping", "data": {}})
PONG = dumps({"event": "pong", "data": {}})
RECONNECT = dumps({"event": "reconnect", "data": {}})


class PushStreamConsumer(ChannelReaderConsumer):
    timers: list[asyncio.Task] | tuple = ()
    counted = False  # in the open-connections gauge

    async def connect(self) -> None:
        self.timers: list[asyncio.Task] = []
        self.last_pong = time.monotonic()
        self.bucket = TokenBucket(FRAMES_PER_SECOND, FRAMES_BURST)
        await self.accept()
        try:
            identity = await run_db(stream_identity, query_params(self.scope.get("query_string", b"")))
        except StreamRefused as exc:
            await self.send(text_data=dumps(exc.body()))
            await self.close(code=CLOSE_POLICY, reason=exc.detail or exc.error)
            return
        node = runtime()
        await node.ensure_started()
        metrics.TRANSPORT_CONNECTIONS.labels("ws_stream").inc()
        self.counted = True
        self.channels = ChannelCursor(app_id=identity.app.pk, hub=node.hub, reader=self, write=self._write_message,
                                      transport="ws_stream")
        # Joined before the first ping: a client that has its ping is subscribed, and a publish it
        # then triggers reaches it. With `since`, the replay follows the ping.
        since = resume_offsets(query_params(self.scope.get("query_string", b"")).get("since"), identity.channels)
        for name in identity.channels:
            await self.channels.join(name)
        await self.send(text_data=PING)
        for name, offset in since.items():
            await self.channels.join(name, since=offset)
        lifetime = random.uniform(settings.PUSH_RECONNECT_DITHER_MIN_SECONDS,
                                  settings.PUSH_RECONNECT_DITHER_MAX_SECONDS)
        self.timers = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._lifetime(lifetime))]

    async def _write_message(self, channel: str, offset: int, content: str) -> bool:
        await self.send(text_data=dumps({"event": "message",
                                         "data": {"channel": channel, "message": content, "offset": offset}}))
        return True

    async def _heartbeat(self) -> None:
        grace = settings.PUSH_CLIENT_GRACE_SECONDS
        while True:
            await asyncio.sleep(settings.PUSH_HEARTBEAT_SECONDS)
            sent = time.monotonic()
            await self.send(text_data=PING)
            await asyncio.sleep(grace)
            if self.last_pong < sent:
                metrics.STREAM_CLOSED.labels("ws_stream", "no_pong").inc()
                await self.close(code=CLOSE_PONG_TIMEOUT, reason=f"no pong within {grace:g} s")
                return

    async def _lifetime(self, lifetime: float) -> None:
        grace = settings.PUSH_CLIENT_GRACE_SECONDS
        await asyncio.sleep(max(0.0, lifetime - grace))
        await self.send(text_data=RECONNECT)
        await asyncio.sleep(grace)
        metrics.STREAM_CLOSED.labels("ws_stream", "lifetime").inc()
        await self.close(code=CLOSE_NORMAL, reason="connection lifetime ended; reconnect")

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.bucket.take(1):
            return  # beyond the budget: not answered
        try:
            event = json.loads(text_data or "").get("event")
        except (ValueError, AttributeError):
            event = None
        if event == "pong":
            self.last_pong = time.monotonic()
        elif event == "ping":
            await self.send(text_data=PONG)

    async def disconnect(self, code: int) -> None:
        await self.end()

    async def release(self) -> None:
        for timer in self.timers:
            timer.cancel()
        if self.counted:
            metrics.TRANSPORT_CONNECTIONS.labels("ws_stream").dec()
        if self.channels is not None:
            await self.channels.leave_all()
