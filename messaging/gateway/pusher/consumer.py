"""`ws(s)://host/app/{key}?protocol=7&client=…&version=…`: a Pusher Channels connection
(docs/protocol.md, "Pusher protocol"). Thin: the frames are checked here and handed to the
connection's subscriptions (messaging.gateway.pusher.subscriptions), which read Switchboard
channels through the node's hub like every other channel reader."""

from __future__ import annotations

import asyncio
import json
import time

from django.conf import settings

from apps_registry.selectors import AppSnapshot, app_snapshot_by_pusher_key
from foundation.asyncdb import run_db
from foundation.daphne_adapter import OUTGOING_EXTENSION, OutgoingBuffer
from foundation.draining import draining
from messaging.core import metrics
from messaging.gateway.connection.inbox import ChannelReaderConsumer
from messaging.gateway.limits import TokenBucket
from messaging.gateway.pusher import metrics as pusher_metrics
from messaging.gateway.pusher import protocol as p
from messaging.gateway.pusher.node import pusher_node
from messaging.gateway.pusher.subscriptions import Subscriptions
from messaging.gateway.runtime import runtime
from messaging.gateway.streams.caps import client_address
from messaging.gateway.streams.identity import query_params

CLOSE_TOO_LARGE = 1009
TRANSPORT = "pusher"


class PusherConsumer(ChannelReaderConsumer):
    app: AppSnapshot | None = None
    admitted = False
    outgoing: OutgoingBuffer | None = None
    subs: Subscriptions | None = None
    timers: tuple | list = ()

    async def connect(self) -> None:
        self.outgoing = (self.scope.get("extensions") or {}).get(OUTGOING_EXTENSION)
        self.address = client_address(self.scope)
        self.last_seen = time.monotonic()
        self.frames = TokenBucket(settings.PUSHER_FRAMES_PER_SECOND, settings.PUSHER_FRAMES_BURST)
        await self.accept()
        if draining():
            await self._refuse(p.CLOSE_RECONNECT, "this server is restarting; reconnect")
            return
        params = query_params(self.scope.get("query_string", b""))
        version = params.get("protocol")
        if not version:
            await self._refuse(p.CLOSE_NO_PROTOCOL, "No protocol version supplied")
            return
        if version != str(p.PROTOCOL_VERSION):
            await self._refuse(p.CLOSE_UNSUPPORTED_PROTOCOL, f"Unsupported protocol version {version[:16]}: "
                                                             f"this server speaks {p.PROTOCOL_VERSION}")
            return
        key = str(self.scope.get("url_route", {}).get("kwargs", {}).get("key", ""))
        app = await run_db(app_snapshot_by_pusher_key, key) if key else None
        if app is None:
            await self._refuse(p.CLOSE_UNKNOWN_APP, f"App key {key[:64]} not in this cluster")
            return
        if not app.pusher_enabled:
            await self._refuse(p.CLOSE_APP_DISABLED, "App is disabled")
            return
        origin = dict(self.scope.get("headers") or []).get(b"origin")
        if origin is not None and app.allowed_origins and origin.decode(errors="replace") not in app.allowed_origins:
            await self._refuse(p.CLOSE_UNAUTHORIZED, "Origin not allowed for this app")
            return
        # (started first: a node's start drops what its earlier life registered in Redis, and the
        # quota's count is such a registration)
        await runtime().ensure_started()
        node = pusher_node()
        refusal = await node.admit(self.address, app.pk)
        if refusal is not None:
            code, why = refusal
            metrics.STREAM_REFUSED.labels(TRANSPORT, "capacity" if code == p.CLOSE_OVER_CAPACITY else "quota").inc()
            await self._refuse(code, why)
            return
        self.admitted, self.app = True, app
        runtime().drainable_add(self.channel_name, self._drain)
        node.connections[self.channel_name] = self._drain  # (and a node declared dead ends it the same way)
        node.ensure_beating()  # (its heartbeat writes the node's connections for the console)
        metrics.TRANSPORT_CONNECTIONS.labels(TRANSPORT).inc()
        pusher_metrics.CONNECTIONS.labels(app.app_name).inc()
        self.socket_id = node.socket_id()
        self.subs = Subscriptions(app=app, socket_id=self.socket_id, reader=self, send=self._send_text,
                                  gone=self._gone, offsets=params.get("offsets") == "1")
        self.channels = self.subs.cursor
        await self._send_text(p.frame("pusher:connection_established", {
            "socket_id": self.socket_id, "activity_timeout": settings.PUSHER_ACTIVITY_TIMEOUT_SECONDS}))
        self.timers = [asyncio.ensure_future(self._watch_activity())]

    async def _refuse(self, code: int, message: str) -> None:
        await self.send(text_data=p.error_frame(code, message))
        await self.close(code=code, reason=message[:120])

    def _gone(self) -> bool:
        return self.ended or (self.outgoing is not None and self.outgoing.closed)

    async def _send_text(self, text: str) -> bool:
        if self._gone():
            return False
        await self.send(text_data=text)
        return True

    async def _drain(self) -> None:
        """The node drains (or was declared dead): pusher-js reconnects at once after 4200 (to another
        node behind the balancer)."""
        for timer in self.timers:
            timer.cancel()
        metrics.STREAM_CLOSED.labels(TRANSPORT, "drain").inc()
        await self._refuse(p.CLOSE_RECONNECT, "this server is restarting; reconnect")

    async def _watch_activity(self) -> None:
        """A connection silent for the activity timeout is pinged; no pong in time closes it (4201)."""
        timeout = settings.PUSHER_ACTIVITY_TIMEOUT_SECONDS
        while True:
            await asyncio.sleep(max(0.05, self.last_seen + timeout - time.monotonic()))
            if time.monotonic() - self.last_seen < timeout:
                continue
            pinged = time.monotonic()
            await self._send_text(p.frame("pusher:ping", {}))
            await asyncio.sleep(settings.PUSHER_PONG_TIMEOUT_SECONDS)
            if self.last_seen < pinged:
                metrics.STREAM_CLOSED.labels(TRANSPORT, "no_pong").inc()
                await self._refuse(p.CLOSE_PONG_TIMEOUT, "Pong reply not received")
                return

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.subs is None:
            return
        self.last_seen = time.monotonic()
        size = len(text_data or bytes_data or b"")
        if not self.subs.names and size > settings.WS_PREAUTH_MAX_FRAME_BYTES:
            await self.close(code=CLOSE_TOO_LARGE, reason="frame too large before any subscription")
            return
        if size > settings.PUSHER_MAX_EVENT_BYTES + settings.PUSHER_FRAME_OVERHEAD_BYTES:
            await self._send_text(p.error_frame(p.ERROR_BAD_INPUT, "Frame too large"))
            return
        if self.frames.take(1):
            await self._send_text(p.error_frame(p.CLOSE_CLIENT_EVENT_RATE, "Too many frames; slow down"))
            return
        try:
            message = json.loads(text_data if text_data is not None else (bytes_data or b"").decode())
        except (ValueError, UnicodeDecodeError):
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("event"), str):
            await self._send_text(p.error_frame(p.ERROR_BAD_INPUT, "Invalid message format: a JSON object with "
                                                                   "an event is expected"))
            return
        await self.subs.handle(message)

    async def pusher_signal(self, event: dict) -> None:
        if self.subs is not None:
            await self.subs.signal(event["channel"], event["data"])

    async def pusher_members(self, event: dict) -> None:
        if self.subs is not None:
            await self.subs.members_told(event["channel"], event["members"])

    # Hub and node callbacks (must not block): through the inbox, handled in turn with everything else.
    def channel_signal(self, key, data) -> None:
        try:
            self.inbox.put_nowait({"type": "pusher.signal", "channel": key[1], "data": data})
        except asyncio.QueueFull:
            pass  # the next heartbeat's member list repairs it

    def members_told(self, channel: str, members: dict) -> None:
        try:
            self.inbox.put_nowait({"type": "pusher.members", "channel": channel, "members": members})
        except asyncio.QueueFull:
            pass

    async def disconnect(self, code: int) -> None:
        await self.end()

    async def release(self) -> None:
        for timer in self.timers:
            timer.cancel()
        if not self.admitted:
            return
        await pusher_node().leave(self.address, self.app.pk)
        pusher_node().connections.pop(self.channel_name, None)
        metrics.TRANSPORT_CONNECTIONS.labels(TRANSPORT).dec()
        pusher_metrics.CONNECTIONS.labels(self.app.app_name).dec()
        try:
            if self.subs is not None:
                await self.subs.leave_all()
        finally:
            runtime().drainable_remove(self.channel_name)
