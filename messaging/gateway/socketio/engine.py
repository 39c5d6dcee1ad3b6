"""Engine.IO 4 at /socket.io/: the transport under Socket.IO (docs/protocol.md, "Socket.IO").

An Engine.IO session is a conversation with one client that outlives any one HTTP request or
socket: it starts on HTTP long-polling (GET for what the server has, POST for what the client
sends) or directly on a WebSocket, and a polling session may move to a WebSocket (the probe and
upgrade). The server pings every SOCKETIO_PING_INTERVAL seconds and closes a session whose pong does
not come within SOCKETIO_PING_TIMEOUT of its ping.

Above the session runs one Socket.IO connection: the Channels consumer of messaging.gateway.socketio.consumer,
the same consumer as /ws with its frames translated. It is run here as the ASGI application of a
WebSocket conversation of our own: each Engine.IO message the client sends is a `websocket.receive`
for it, each `websocket.send` it makes is an Engine.IO message to the client, whichever transport
carries the session at that moment, and its `websocket.close` closes the session's transport (not a
Socket.IO DISCONNECT: the client reconnects). So a Socket.IO connection has the same life, ledger,
presence, delivery and drain as a /ws one, on a channel of the channel layer of its own.

What a session guarantees the node (docs/security.md, "Socket.IO"):
- what a client sends is handed to the connection in bounded pieces (HANDOFF_PACKETS at a time; the
  writer waits for the connection to take them), so no poll or socket grows the node's memory or
  holds its event loop, however many packets it carries;
- until its client has logged in, a session costs a few hundred bytes (the connection above starts
  with the first packet the client sends), and there are at most SOCKETIO_PREAUTH_SESSIONS_PER_NODE
  of them on the node and SOCKETIO_PREAUTH_SESSIONS_PER_ADDRESS per client address; one not logged
  in within WS_AUTH_TIMEOUT is closed;
- what waits for a client's next poll is bounded (SOCKETIO_MAX_OUTBOX_PACKETS, SOCKETIO_MAX_OUTBOX_BYTES):
  a client that does not poll is cut off as a slow reader, and what it held goes back to the mailbox;
- only a PONG to a PING the client was given (its poll carried it, or its socket was written it)
  keeps a session alive: a client that never polls cannot keep one open with blind PONGs.

What it guarantees the connection above (the consumer counts a stored message delivered by it):
a message has left once the bytes that carry it (the poll's answer, or the socket's frame) have left
the node, as daphne's transport reports for /ws (foundation.daphne_adapter.OutgoingBuffer); a frame
the socket did not take (cut off as a slow reader, closed) is not counted at all.

The packet codecs are python-engineio's; sessions, transports, the upgrade and the heartbeat are
written here, because python-engineio's server owns the whole ASGI application and the session's
life, and this one has to hand both to the consumer above. Sessions live on the node that opened
them: with several web nodes a polling session must keep to its node (the generated HAProxy
configuration does, devstack.balancer). The HTTP and WebSocket endpoint that opens and serves
sessions is messaging.gateway.socketio.endpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable

from django.conf import settings
from engineio import packet as eio

from foundation.daphne_adapter import FRAME_LIMIT_EXTENSION, OUTGOING_EXTENSION, OutgoingBuffer
from foundation.slim_queue import SlimQueue
from foundation.transport.frames import CLOSE_SLOW_READER
from messaging.core import metrics
from messaging.gateway.socketio.departures import Departures, FrameLimitLift, Outgoing
from messaging.gateway.socketio.preauth import Preauth, client_address

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]
App = Callable[[dict, Receive, Send], Awaitable[None]]

CLOSE_GOING_AWAY = 1001  # the transport closed under the session (the consumer's disconnect code)
# Packets from the client handed to the connection at a time: the poll or socket that brought more
# waits until the connection has taken these (and the event loop has run everyone else).
HANDOFF_PACKETS = 64

# How a session ends (EngineSession.close): the application above closed it (the client is told:
# CLOSE on its next poll, or its socket closed); the client sent CLOSE (a waiting poll is let go with
# NOOP); its PONG did not come; its transport went away under it.
BY_SERVER, BY_CLIENT, BY_TIMEOUT, BY_TRANSPORT = "server", "client", "timeout", "transport"

SESSIONS: dict[str, EngineSession] = {}  # this node's open sessions, by id


# What a session keeps of the request that opened it, for the connection above: not the request's
# own extensions (they hold daphne's request, which would live as long as the session) and only the
# headers the connection reads (thousands of sessions wait for their login on a node).
KEPT_SCOPE = ("path", "root_path", "query_string", "client", "server", "scheme")
KEPT_HEADERS = frozenset({b"origin", b"user-agent"})


def _kept(scope: dict) -> dict:
    kept = {key: scope[key] for key in KEPT_SCOPE if key in scope}
    kept["headers"] = [(name, value) for name, value in scope.get("headers") or () if name in KEPT_HEADERS]
    return kept


class EngineSession:
    """One client's Engine.IO session on this node, with the Socket.IO consumer above it."""

    # (slots: thousands are held on a node; docs/benchmarks.md measures a held connection's memory)
    __slots__ = ("sid", "address", "preauth", "outbox", "outbox_bytes", "outgoing", "departures", "frame_limit",
                 "waiter", "polls", "ws_send", "ws_buffer", "closed", "ping_out", "ping_given", "timer", "scope",
                 "inner", "app", "app_task")

    def __init__(self, scope: dict, app: App, *, ws_send: Send | None = None,
                 ws_buffer: OutgoingBuffer | None = None) -> None:
        """A session on long-polling, or (`ws_send`, with daphne's report of its buffer) straight on
        a WebSocket. The caller has checked Preauth.refusal."""
        self.sid = secrets.token_urlsafe(15)
        self.address = client_address(scope)
        self.preauth = True
        Preauth.add(self.address)
        self.outbox: list[tuple[eio.Packet, int, int]] = []  # for the next poll: (packet, Outgoing position or 0, size)
        self.outbox_bytes = 0
        self.outgoing = Outgoing()
        self.departures = Departures(self.outgoing)
        self.frame_limit = FrameLimitLift(self._preauth_end)
        self.waiter: asyncio.Future | None = None  # a poll waiting (one at a time): woken by a packet or the end
        self.polls = 0  # polls in progress (one at a time)
        self.ws_send = ws_send  # the WebSocket transport, once the session is on one
        self.ws_buffer = ws_buffer
        self.closed = False
        self.ping_out = False  # a PING waits for its PONG...
        self.ping_given = False  # ... and has reached the client: only then does a PONG answer it
        # One timer at a time (a handle costs memory, and thousands of sessions are held): first the
        # look at whether the client has said anything at all, then the heartbeat's.
        self.timer = asyncio.get_running_loop().call_later(
            min(settings.WS_AUTH_TIMEOUT, settings.SOCKETIO_PING_INTERVAL), self._first_look)
        self.inner = SlimQueue()
        self.scope = _kept(scope)  # (the application's, made from it when it starts)
        self.app = app
        self.app_task: asyncio.Task | None = None  # started by the client's first packet
        SESSIONS[self.sid] = self

    @property
    def polling(self) -> bool:
        return self.ws_send is None

    def handshake(self, *, upgrades: list[str]) -> eio.Packet:
        return eio.Packet(eio.OPEN, {
            "sid": self.sid, "upgrades": upgrades, "pingInterval": int(settings.SOCKETIO_PING_INTERVAL * 1000),
            "pingTimeout": int(settings.SOCKETIO_PING_TIMEOUT * 1000), "maxPayload": settings.SOCKETIO_MAX_PAYLOAD})

    # --- the application above -------------------------------------------------------------------

    def _start_app(self) -> None:
        self.inner.put_nowait({"type": "websocket.connect"})
        extensions = {OUTGOING_EXTENSION: self.outgoing, FRAME_LIMIT_EXTENSION: self.frame_limit}
        scope = {**self.scope, "type": "websocket", "scheme": "wss" if self.scope.get("scheme") == "https" else "ws",
                 "subprotocols": [], "extensions": extensions}
        self.app_task = asyncio.get_running_loop().create_task(self._run_app(scope))

    async def _run_app(self, scope: dict) -> None:
        try:
            await self.app(scope, self.inner.get, self._from_app)
        except Exception:
            log.exception("the Socket.IO connection of engine session %s failed", self.sid)
        finally:
            self.inner.clear()  # nobody takes them now: a writer waiting for room is let go
            await self.close()

    async def _from_app(self, message: dict) -> None:
        kind = message["type"]
        if kind == "websocket.send":
            if self.closed:
                return  # taken by nothing: the consumer sees Outgoing.queued unchanged
            data = message.get("text")
            pkt = eio.Packet(eio.MESSAGE, data if data is not None else message.get("bytes"))
            position = self.outgoing.queued + 1
            if await self.send(pkt, position=position):
                self.outgoing.queued = position
        elif kind == "websocket.close":
            await self.close(code=message.get("code") or 1000, by=BY_SERVER)

    def _preauth_end(self) -> None:
        if self.preauth:
            self.preauth = False
            Preauth.remove(self.address)

    async def to_app(self, pkt: eio.Packet) -> None:
        """An Engine.IO message from the client, for the application; waits while the application
        has HANDOFF_PACKETS of them still to take."""
        if self.closed:
            return
        if self.app_task is None:
            self._start_app()
        elif self.inner.qsize() >= HANDOFF_PACKETS:
            await self.inner.below(HANDOFF_PACKETS)
            if self.closed:
                return
        if pkt.binary:
            self.inner.put_nowait({"type": "websocket.receive", "bytes": pkt.data})
        else:
            self.inner.put_nowait({"type": "websocket.receive", "text": pkt.data if isinstance(pkt.data, str)
                                   else json.dumps(pkt.data)})

    # --- packets to the client -------------------------------------------------------------------

    async def send(self, pkt: eio.Packet, position: int = 0) -> bool:
        """A packet for the client; `position`: its Outgoing count (0: the session's own packets,
        PING and the like). False when it was not taken: the session ended, its socket refused it
        (cut off as a slow reader), or its outbox is full (it is then cut off)."""
        if self.closed:
            return False
        if self.ws_send is not None:
            buffer = self.ws_buffer
            before = buffer.queued if buffer is not None else 0
            await ws_write(self.ws_send, pkt)
            if buffer is not None and (buffer.queued == before or buffer.closed):
                return False  # (the socket is gone or was cut off: its close ends the session)
            if pkt.packet_type == eio.PING:
                self.ping_given = True
            if position:
                self.departures.track(buffer, position)
            return True
        size = _size_of(pkt)
        if (len(self.outbox) >= settings.SOCKETIO_MAX_OUTBOX_PACKETS
                or self.outbox_bytes + size > settings.SOCKETIO_MAX_OUTBOX_BYTES):
            log.warning("engine session %s: %d packets (%d bytes) wait for a poll that does not come; cut off",
                        self.sid, len(self.outbox), self.outbox_bytes)
            metrics.SOCKETIO_LIMITED.labels("outbox").inc()
            self.outbox, self.outbox_bytes = [], 0  # (given back to the mailbox: its next poll gets CLOSE)
            asyncio.ensure_future(self.close(code=CLOSE_SLOW_READER, by=BY_SERVER))
            return False
        self.outbox.append((pkt, position, size))
        self.outbox_bytes += size
        self._wake()
        return True

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until something is in the outbox or the session has ended (one poll at a time waits)."""
        if self.outbox or self.closed:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take_outbox(self) -> tuple[list[eio.Packet], int]:
        """What waits for the client, and the Outgoing position it reaches."""
        taken, self.outbox = self.outbox, []
        self.outbox_bytes = 0
        if self.ping_out and any(pkt.packet_type == eio.PING for pkt, _, _ in taken):
            self.ping_given = True
        return [pkt for pkt, _, _ in taken], max((position for _, position, _ in taken), default=0)

    async def on_websocket(self, ws_send: Send, ws_buffer: OutgoingBuffer | None) -> None:
        """The session moves to a WebSocket (the upgrade's last step): what waited for a poll goes
        there, in order, and everything after."""
        packets, position = self.take_outbox()
        self.ws_send, self.ws_buffer = ws_send, ws_buffer
        for pkt in packets:
            await ws_write(ws_send, pkt)
        if position:
            self.departures.track(ws_buffer, position)

    # --- packets from the client -----------------------------------------------------------------

    async def receive(self, pkt: eio.Packet) -> None:
        if pkt.packet_type == eio.MESSAGE:
            await self.to_app(pkt)
        elif pkt.packet_type == eio.PONG:
            if self.ping_out and self.ping_given:
                self.ping_out = self.ping_given = False
                self.timer.cancel()
                self.timer = asyncio.get_running_loop().call_later(settings.SOCKETIO_PING_INTERVAL, self._ping)
            # else: a PONG to no PING the client was given answers nothing (and keeps nothing alive)
        elif pkt.packet_type == eio.CLOSE:
            await self.close(code=1000, by=BY_CLIENT)
        # PING (not sent by v4 clients), UPGRADE and NOOP outside the upgrade: nothing to do

    # --- the heartbeat ---------------------------------------------------------------------------

    def _first_look(self) -> None:
        """A session whose client has sent nothing by now (not even a CONNECT) is closed: a session
        whose connection has started is closed by it, if its login does not come in time."""
        if self.closed:
            return
        if self.app_task is None and settings.WS_AUTH_TIMEOUT <= settings.SOCKETIO_PING_INTERVAL:
            asyncio.ensure_future(self.close(by=BY_SERVER))
            return
        until_ping = settings.SOCKETIO_PING_INTERVAL - settings.WS_AUTH_TIMEOUT
        if until_ping > 0:
            self.timer = asyncio.get_running_loop().call_later(until_ping, self._ping)
        else:
            self._ping()

    def _ping(self) -> None:
        if self.closed:
            return
        self.ping_out, self.ping_given = True, False
        self.timer = asyncio.get_running_loop().call_later(settings.SOCKETIO_PING_TIMEOUT, self._pong_overdue)
        asyncio.ensure_future(self.send(eio.Packet(eio.PING)))

    def _pong_overdue(self) -> None:
        if not self.closed:
            log.info("engine session %s: no pong within %ss, closed", self.sid, settings.SOCKETIO_PING_TIMEOUT)
            asyncio.ensure_future(self.close(code=CLOSE_GOING_AWAY, by=BY_TIMEOUT))

    # --- the end ------------------------------------------------------------------------------

    async def close(self, *, code: int = CLOSE_GOING_AWAY, by: str = BY_SERVER) -> None:
        """The session ends, `by` whom (BY_SERVER, ...): the client's transport is told as the
        protocol says (a poll: CLOSE after what waited for it, or NOOP when the client closed; a
        socket: closed), and the application hears `websocket.disconnect` with `code` once it has
        handled what the client sent before."""
        if self.closed:
            return
        self.closed = True
        self.outgoing.closed = True
        self.timer.cancel()
        self._preauth_end()  # (no longer one waiting for its login)
        self.departures.stop()
        if self.ws_send is None:
            if by == BY_SERVER:
                # What waits for the client goes out, then CLOSE, in a poll of its own (the client
                # handles a payload's Socket.IO packets on its next tick, after a CLOSE beside them:
                # a DISCONNECT would come too late to keep it from reconnecting). The session stays
                # findable for a ping timeout so that the client's next polls can take them.
                asyncio.get_running_loop().call_later(settings.SOCKETIO_PING_TIMEOUT, SESSIONS.pop, self.sid, None)
            else:
                SESSIONS.pop(self.sid, None)
                if self.polls and by == BY_CLIENT:  # a waiting poll is let go with NOOP (else with CLOSE)
                    self.outbox.append((eio.Packet(eio.NOOP), 0, 1))
        else:
            SESSIONS.pop(self.sid, None)
            if by != BY_TRANSPORT:
                try:
                    await self.ws_send({"type": "websocket.close", "code": 1000})
                except Exception:  # already gone
                    pass
        self._wake()
        if self.app_task is not None and not self.app_task.done():
            self.inner.put_nowait({"type": "websocket.disconnect", "code": code})


def _size_of(pkt: eio.Packet) -> int:
    data = pkt.data
    return 1 + (len(data) if isinstance(data, (str, bytes)) else 0)


def packet_of(data: str | bytes) -> eio.Packet:
    """An Engine.IO packet from the client as it came (a poll's part, a WebSocket frame): a MESSAGE,
    the common case, without the codec (which tries JSON on it first); ValueError if it is none
    (a deeply nested JSON body included)."""
    if isinstance(data, str) and data.startswith("4"):
        return eio.Packet(eio.MESSAGE, data[1:])
    try:
        return eio.Packet(encoded_packet=data)
    except (IndexError, TypeError, RecursionError):
        raise ValueError("not an Engine.IO packet") from None


async def ws_write(send: Send, pkt: eio.Packet) -> None:
    if pkt.packet_type == eio.MESSAGE and isinstance(pkt.data, str):  # the common case, without the codec
        await send({"type": "websocket.send", "text": "4" + pkt.data})
        return
    encoded = pkt.encode()
    await send({"type": "websocket.send", "bytes": encoded} if isinstance(encoded, bytes)
               else {"type": "websocket.send", "text": encoded})
