"""`WS /ws/messages?channels=a,b` (docs/protocol.md, "Channel streams", the push seed's WebSocket endpoint).

- `{"event":"ping","data":{}}` at once and every heartbeat interval; the client answers
  `{"event":"pong"}` within the grace period or is closed (4004);
- `{"event":"message","data":{"channel":…,"message":…,"offset":…}}` for each publish (`offset`
  is an extension), every message once and in channel order;
- the connection lives a random time between the reconnect dither bounds; one grace period
  before it ends, `{"event":"reconnect","data":{}}`; then the server closes (1000);
- when the node drains (messaging.gateway.drain): `{"event":"reconnect","data":{}}`, then close (1012);
- a client `{"event":"ping"}` gets `{"event":"pong","data":{}}`;
- no `channels`: `{"error":"'channels' query parameter required"}`, then close (1008); any other
  refusal likewise (a malformed `since` is one), except more streams than STREAM_MAX_PER_ADDRESS
  or STREAM_MAX_PER_APP: `{"error":"too_many_streams",…}`, then close (1013: try again later).

`?since=news:12,sport:7` (an extension) replays what came after those offsets first: at most the
newest STREAM_REPLAY_MAX messages of a channel, after `{"event":"missed","data":{"channel","missed",
"offset"}}` when there were more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

from django.conf import settings

from foundation.asyncdb import run_db
from foundation.daphne_adapter import OUTGOING_EXTENSION, OutgoingBuffer
from foundation.draining import DRAINING_REASON, draining
from foundation.transport.frames import CLOSE_NORMAL, CLOSE_POLICY, CLOSE_RESTART, CLOSE_TRY_AGAIN, dumps
from messaging.channels.cursor import ChannelCursor
from messaging.core import metrics
from messaging.gateway.connection.inbox import ChannelReaderConsumer
from messaging.gateway.limits import TokenBucket
from messaging.gateway.runtime import runtime
from messaging.gateway.streams.caps import StreamSlot, client_address, stream_slot_take
from messaging.gateway.streams.identity import StreamRefused, query_params, resume_offsets, stream_identity

log = logging.getLogger(__name__)
CLOSE_PONG_TIMEOUT = 4004
FRAMES_PER_SECOND, FRAMES_BURST = 10.0, 20

PING = dumps({"event": "ping", "data": {}})
PONG = dumps({"event": "pong", "data": {}})
RECONNECT = dumps({"event": "reconnect", "data": {}})


class PushStreamConsumer(ChannelReaderConsumer):
    timers: list[asyncio.Task] | tuple = ()
    counted = False  # in the open-connections gauge
    slot: StreamSlot | None = None
    outgoing: OutgoingBuffer | None = None

    async def connect(self) -> None:
        self.timers: list[asyncio.Task] = []
        self.last_pong = time.monotonic()
        self.bucket = TokenBucket(FRAMES_PER_SECOND, FRAMES_BURST)
        self.outgoing = (self.scope.get("extensions") or {}).get(OUTGOING_EXTENSION)
        await self.accept()
        if draining():  # on a connection accepted before the node stopped listening
            await self._drain()
            return
        runtime().drainable_add(self.channel_name, self._drain)
        params = query_params(self.scope.get("query_string", b""))
        try:
            self.slot = stream_slot_take(address=client_address(self.scope), transport="ws_stream")
            identity = await run_db(stream_identity, params)
            self.slot.take_app(identity.app.pk)
            since = resume_offsets(params.get("since"), identity.channels, source="since")
        except StreamRefused as exc:
            await self.send(text_data=dumps(exc.body()))
            code = CLOSE_TRY_AGAIN if exc.status == 429 else CLOSE_POLICY
            await self.close(code=code, reason=exc.detail or exc.error)
            return
        node = runtime()
        await node.ensure_started()
        metrics.TRANSPORT_CONNECTIONS.labels("ws_stream").inc()
        self.counted = True
        self.channels = ChannelCursor(app_id=identity.app.pk, hub=node.hub, reader=self, write=self._write_message,
                                      transport="ws_stream", missed=self._write_missed)
        # Joined before the first ping: a client that has its ping is subscribed, and a publish it
        # then triggers reaches it. With `since`, the replay follows the ping.
        for name in identity.channels:
            await self.channels.join(name)
        await self.send(text_data=PING)
        for name, offset in since.items():
            if self._gone():
                break
            await self.channels.join(name, since=offset)
        lifetime = random.uniform(settings.PUSH_RECONNECT_DITHER_MIN_SECONDS,
                                  settings.PUSH_RECONNECT_DITHER_MAX_SECONDS)
        self.timers = [asyncio.ensure_future(self._heartbeat()), asyncio.ensure_future(self._lifetime(lifetime))]

    def _gone(self) -> bool:
        """The socket is closed or cut off. Known from the transport: while this consumer replays
        history (inside connect), the client's disconnect waits in its queue unread."""
        return self.ended or (self.outgoing is not None and self.outgoing.closed)

    async def _write_message(self, channel: str, offset: int, content: str) -> bool:
        if self._gone():
            return False  # the replay stops: no more history is read for a reader that has gone
        await self.send(text_data=dumps({"event": "message",
                                         "data": {"channel": channel, "message": content, "offset": offset}}))
        return True

    async def _write_missed(self, notice: dict) -> None:
        if not self._gone():
            await self.send(text_data=dumps({"event": "missed", "data": notice}))

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

    async def _drain(self) -> None:
        """The node drains: `reconnect`, then the socket closes (1012)."""
        for timer in self.timers:
            timer.cancel()
        metrics.STREAM_CLOSED.labels("ws_stream", "drain").inc()
        await self.send(text_data=RECONNECT)
        await self.close(code=CLOSE_RESTART, reason=DRAINING_REASON)

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
        if self.slot is not None:
            self.slot.release()
        if self.counted:
            metrics.TRANSPORT_CONNECTIONS.labels("ws_stream").dec()
        try:
            if self.channels is not None:
                await self.channels.leave_all()
        finally:
            runtime().drainable_remove(self.channel_name)  # a drain waits for the stream's end
