"""Engine.IO 4 at /socket.io/: the transport under Socket.IO (docs/protocol.md, "Socket.IO").

An Engine.IO session is a conversation with one client that outlives any one HTTP request or
socket: it starts on HTTP long-polling (GET for what the server has, POST for what the client
sends) or directly on a WebSocket, and a polling session may move to a WebSocket (the probe and
upgrade). The server pings every SOCKETIO_PING_INTERVAL seconds and closes a session whose pong does
not come within SOCKETIO_PING_TIMEOUT.

Above the session runs one Socket.IO connection: the Channels consumer of messaging.socketio.consumer,
the same consumer as /ws with its frames translated. It is run here as the ASGI application of a
WebSocket conversation of our own: each Engine.IO message the client sends is a `websocket.receive`
for it, each `websocket.send` it makes is an Engine.IO message to the client, whichever transport
carries the session at that moment, and its `websocket.close` closes the session's transport (not a
Socket.IO DISCONNECT: the client reconnects). So a Socket.IO connection has the same life, ledger,
presence, delivery and drain as a /ws one, on a channel of the channel layer of its own.

The packet codecs are python-engineio's; sessions, transports, the upgrade and the heartbeat are
written here, because python-engineio's server owns the whole ASGI application and the session's
life, and this one has to hand both to the consumer above. Sessions live on the node that opened
them: with several web nodes a polling session must keep to its node (the generated HAProxy
configuration does, devstack.balancer). The HTTP and WebSocket endpoint that opens and serves
sessions is messaging.socketio.endpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable

from django.conf import settings
from engineio import packet as eio

from foundation.daphne_adapter import FRAME_LIMIT_EXTENSION, OUTGOING_EXTENSION
from foundation.slim_queue import SlimQueue

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]
App = Callable[[dict, Receive, Send], Awaitable[None]]

CLOSE_GOING_AWAY = 1001  # the transport closed under the session (the consumer's disconnect code)

SESSIONS: dict[str, EngineSession] = {}  # this node's open sessions, by id


class Outgoing:
    """What the application above has written, and how much of it has left the node: the same
    report daphne's transport gives the /ws consumer (foundation.daphne_adapter.OutgoingBuffer,
    offered under the same scope extension), counted in messages. A message has left once the
    poll that carries it was answered, or once it was handed to the session's WebSocket; the
    consumer counts a message delivered only then, and gives back to the mailbox what a session
    that ends had not sent out."""

    __slots__ = ("queued", "closed", "on_flush", "_flushed")

    def __init__(self) -> None:
        self.queued = 0
        self.closed = False
        self.on_flush: Callable[[], None] | None = None
        self._flushed = 0

    def flushed(self) -> int:
        return self._flushed

    def sent(self, position: int) -> None:
        if position > self._flushed:
            self._flushed = position
            if self.on_flush is not None:
                try:
                    self.on_flush()
                except Exception:
                    log.exception("flush callback failed")


class FrameLimitLift:
    """The application's `lift()` of the WebSocket frame limit (foundation.daphne_adapter.FrameLimit,
    under the same scope extension): a session's socket takes frames up to WS_PREAUTH_MAX_FRAME_BYTES
    until its client has logged in, as /ws does, whether the socket comes before the login or after
    it (an upgrade)."""

    __slots__ = ("lifted", "socket_limit")

    def __init__(self) -> None:
        self.lifted = False
        self.socket_limit = None  # the session's WebSocket's FrameLimit, once it has one

    def attach(self, scope: dict) -> None:
        self.socket_limit = (scope.get("extensions") or {}).get(FRAME_LIMIT_EXTENSION)
        if self.lifted and self.socket_limit is not None:
            self.socket_limit.lift()

    def lift(self) -> None:
        self.lifted = True
        if self.socket_limit is not None:
            self.socket_limit.lift()


class EngineSession:
    """One client's Engine.IO session on this node, with the Socket.IO consumer above it."""

    # (slots: thousands are held on a node; docs/benchmarks.md measures a held connection's memory)
    __slots__ = ("sid", "outbox", "outgoing", "frame_limit", "wake", "polls", "ws_send", "closed",
                 "ping_due", "pong_due", "inner", "app_task")

    def __init__(self, scope: dict, app: App, *, ws_send: Send | None = None) -> None:
        """A session on long-polling, or (`ws_send`) straight on a WebSocket."""
        self.sid = secrets.token_urlsafe(15)
        self.outbox: list[tuple[eio.Packet, int]] = []  # for the next poll: (packet, its Outgoing position or 0)
        self.outgoing = Outgoing()
        self.frame_limit = FrameLimitLift()
        self.wake = asyncio.Event()  # a poll waiting: something is in the outbox, or the session ended
        self.polls = 0  # polls in progress (one at a time)
        self.ws_send = ws_send  # the WebSocket transport, once the session is on one
        self.closed = False
        loop = asyncio.get_running_loop()
        self.ping_due = loop.time() + settings.SOCKETIO_PING_INTERVAL
        self.pong_due: float | None = None  # a PING is out: its PONG must come by then
        self.inner = SlimQueue()
        self.inner.put_nowait({"type": "websocket.connect"})
        extensions = {OUTGOING_EXTENSION: self.outgoing, FRAME_LIMIT_EXTENSION: self.frame_limit}
        inner_scope = {**scope, "type": "websocket", "scheme": "wss" if scope.get("scheme") == "https" else "ws",
                       "subprotocols": [], "extensions": extensions}
        SESSIONS[self.sid] = self
        self.app_task = loop.create_task(self._run_app(app, inner_scope))
        _heartbeat_ensure()

    @property
    def polling(self) -> bool:
        return self.ws_send is None

    def handshake(self, *, upgrades: list[str]) -> eio.Packet:
        return eio.Packet(eio.OPEN, {
            "sid": self.sid, "upgrades": upgrades, "pingInterval": int(settings.SOCKETIO_PING_INTERVAL * 1000),
            "pingTimeout": int(settings.SOCKETIO_PING_TIMEOUT * 1000), "maxPayload": settings.SOCKETIO_MAX_PAYLOAD})

    # --- the application above -------------------------------------------------------------------

    async def _run_app(self, app: App, scope: dict) -> None:
        try:
            await app(scope, self.inner.get, self._from_app)
        except Exception:
            log.exception("the Socket.IO connection of engine session %s failed", self.sid)
        finally:
            await self.close()

    async def _from_app(self, message: dict) -> None:
        kind = message["type"]
        if kind == "websocket.send":
            if self.closed:
                return  # taken by nothing: the consumer sees Outgoing.queued unchanged
            data = message.get("text")
            self.outgoing.queued += 1
            await self.send(eio.Packet(eio.MESSAGE, data if data is not None else message.get("bytes")),
                            position=self.outgoing.queued)
        elif kind == "websocket.close":
            await self.close(code=message.get("code") or 1000)

    def to_app(self, pkt: eio.Packet) -> None:
        """An Engine.IO message from the client, for the application."""
        if self.closed:
            return
        if pkt.binary:
            self.inner.put_nowait({"type": "websocket.receive", "bytes": pkt.data})
        else:
            self.inner.put_nowait({"type": "websocket.receive", "text": pkt.data if isinstance(pkt.data, str)
                                   else json.dumps(pkt.data)})

    # --- packets to the client -------------------------------------------------------------------

    async def send(self, pkt: eio.Packet, position: int = 0) -> None:
        """A packet for the client; `position`: its Outgoing count (0: the session's own packets,
        PING and the like)."""
        if self.closed:
            return
        if self.ws_send is not None:
            await ws_write(self.ws_send, pkt)
            self.outgoing.sent(position)
            return
        self.outbox.append((pkt, position))
        self.wake.set()

    def take_outbox(self) -> tuple[list[eio.Packet], int]:
        """What waits for the client, and the Outgoing position it reaches."""
        taken, self.outbox = self.outbox, []
        self.wake.clear()
        return [pkt for pkt, _ in taken], max((position for _, position in taken), default=0)

    async def on_websocket(self, ws_send: Send) -> None:
        """The session moves to a WebSocket (the upgrade's last step): what waited for a poll goes
        there, in order, and everything after."""
        self.ws_send = ws_send
        packets, position = self.take_outbox()
        for pkt in packets:
            await ws_write(ws_send, pkt)
        self.outgoing.sent(position)

    # --- packets from the client -----------------------------------------------------------------

    async def receive(self, pkt: eio.Packet) -> None:
        if pkt.packet_type == eio.MESSAGE:
            self.to_app(pkt)
        elif pkt.packet_type == eio.PONG:
            self.pong_due = None
            self.ping_due = asyncio.get_running_loop().time() + settings.SOCKETIO_PING_INTERVAL
        elif pkt.packet_type == eio.CLOSE:
            await self.close(code=1000, tell_client=False)
        # PING (not sent by v4 clients), UPGRADE and NOOP outside the upgrade: nothing to do

    # --- the end ------------------------------------------------------------------------------

    async def close(self, *, code: int = CLOSE_GOING_AWAY, tell_client: bool = True) -> None:
        """The session ends: the client's transport is closed (what waited for it goes first on a
        poll), and the application hears `websocket.disconnect`."""
        if self.closed:
            return
        self.closed = True
        self.outgoing.closed = True
        if tell_client and self.ws_send is None:
            # What waits for the client ends with CLOSE: the next poll takes it (the session stays
            # findable for a ping timeout so that one can), then the session is gone.
            self.outbox.append((eio.Packet(eio.CLOSE), 0))
            asyncio.get_running_loop().call_later(settings.SOCKETIO_PING_TIMEOUT, SESSIONS.pop, self.sid, None)
        else:
            SESSIONS.pop(self.sid, None)
        self.wake.set()
        if self.ws_send is not None and tell_client:
            try:
                await self.ws_send({"type": "websocket.close", "code": 1000})
            except Exception:  # already gone
                pass
        self.inner.put_nowait({"type": "websocket.disconnect", "code": code})


def packet_of(data: str | bytes) -> eio.Packet:
    """An Engine.IO packet from the client as it came (a poll's part, a WebSocket frame): a MESSAGE,
    the common case, without the codec (which tries JSON on it first); ValueError if it is none."""
    if isinstance(data, str) and data.startswith("4"):
        return eio.Packet(eio.MESSAGE, data[1:])
    try:
        return eio.Packet(encoded_packet=data)
    except IndexError:
        raise ValueError("not an Engine.IO packet") from None


async def ws_write(send: Send, pkt: eio.Packet) -> None:
    if pkt.packet_type == eio.MESSAGE and isinstance(pkt.data, str):  # the common case, without the codec
        await send({"type": "websocket.send", "text": "4" + pkt.data})
        return
    encoded = pkt.encode()
    await send({"type": "websocket.send", "bytes": encoded} if isinstance(encoded, bytes)
               else {"type": "websocket.send", "text": encoded})



# --- the heartbeat: one task for every session of the node ---------------------------------------

HEARTBEAT_TICK = 0.25  # seconds between two looks at every session's ping and pong
_heartbeat: asyncio.Task | None = None


def _heartbeat_ensure() -> None:
    global _heartbeat
    if _heartbeat is None or _heartbeat.done():
        _heartbeat = asyncio.get_running_loop().create_task(_heartbeat_run())


async def _heartbeat_run() -> None:
    """PING each session SOCKETIO_PING_INTERVAL after it opened or last answered, and close one whose
    PONG has not come SOCKETIO_PING_TIMEOUT after its PING (one task for the node rather than one
    per session: a held session costs less memory)."""
    loop = asyncio.get_running_loop()
    while SESSIONS:
        await asyncio.sleep(min(HEARTBEAT_TICK, settings.SOCKETIO_PING_INTERVAL / 4))
        now = loop.time()
        for session in list(SESSIONS.values()):
            if session.closed:
                continue
            try:
                if session.pong_due is not None:
                    if now >= session.pong_due:
                        log.info("engine session %s: no pong within %ss, closed", session.sid,
                                 settings.SOCKETIO_PING_TIMEOUT)
                        await session.close(code=CLOSE_GOING_AWAY, tell_client=False)
                elif now >= session.ping_due:
                    session.pong_due = now + settings.SOCKETIO_PING_TIMEOUT
                    await session.send(eio.Packet(eio.PING))
            except Exception:
                log.exception("the heartbeat of engine session %s failed", session.sid)
