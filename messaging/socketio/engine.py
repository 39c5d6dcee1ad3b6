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
configuration does, devstack.haproxy).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from django.conf import settings
from engineio import packet as eio

from foundation.daphne_adapter import FRAME_LIMIT_EXTENSION, OUTGOING_EXTENSION
from foundation.slim_queue import SlimQueue

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]
App = Callable[[dict, Receive, Send], Awaitable[None]]

# Engine.IO's error codes (the protocol document's "Errors"), answered as 400 JSON.
TRANSPORT_UNKNOWN, SESSION_UNKNOWN, BAD_HANDSHAKE_METHOD, BAD_REQUEST, FORBIDDEN, UNSUPPORTED_VERSION = range(6)
_MESSAGES = {TRANSPORT_UNKNOWN: "Transport unknown", SESSION_UNKNOWN: "Session ID unknown",
             BAD_HANDSHAKE_METHOD: "Bad handshake method", BAD_REQUEST: "Bad request", FORBIDDEN: "Forbidden",
             UNSUPPORTED_VERSION: "Unsupported protocol version"}
SEPARATOR = "\x1e"  # between the packets of a polling payload
SID_HEADER = b"x-socketio-sid"
CLOSE_GOING_AWAY = 1001  # the transport closed under the session (the consumer's disconnect code)

_sessions: dict[str, EngineSession] = {}


class Outgoing:
    """What the application above has written, and how much of it has left the node: the same
    report daphne's transport gives the /ws consumer (foundation.daphne_adapter.OutgoingBuffer,
    offered under the same scope extension), counted in messages. A message has left once the
    poll that carries it was answered, or once it was handed to the session's WebSocket; the
    consumer counts a message delivered only then, and gives back to the mailbox what a session
    that ends had not sent out."""

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


def sessions_open() -> int:
    return len(_sessions)


class EngineSession:
    """One client's Engine.IO session on this node, with the Socket.IO consumer above it."""

    def __init__(self, scope: dict, app: App, *, polling: bool) -> None:
        self.sid = secrets.token_urlsafe(15)
        self.polling = polling
        self.outbox: list[tuple[eio.Packet, int]] = []  # for the next poll: (packet, its Outgoing position or 0)
        self.outgoing = Outgoing()
        self.frame_limit = FrameLimitLift()
        self.wake = asyncio.Event()  # a poll waiting: something is in the outbox, or the session ended
        self.polls = 0  # polls in progress (one at a time)
        self.ws_send: Send | None = None  # the WebSocket transport, once the session is on one
        self.closed = False
        self.pong = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.inner = SlimQueue()
        self.inner.put_nowait({"type": "websocket.connect"})
        inner_scope = {**scope, "type": "websocket", "scheme": "wss" if scope.get("scheme") == "https" else "ws",
                       "subprotocols": [], "extensions": {OUTGOING_EXTENSION: self.outgoing,
                                                                            FRAME_LIMIT_EXTENSION: self.frame_limit}, "socketio_sid": self.sid}
        _sessions[self.sid] = self
        self.app_task = loop.create_task(self._run_app(app, inner_scope))
        self.beat = loop.create_task(self._heartbeat())

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
            await self.send([eio.Packet(eio.MESSAGE, data if data is not None else message.get("bytes"))],
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

    async def send(self, packets: list[eio.Packet], position: int = 0) -> None:
        """Packets for the client; `position`: the Outgoing count of the last of them (0: the
        session's own packets, PING and the like)."""
        if self.closed:
            return
        if self.ws_send is not None:
            for pkt in packets:
                await _ws_write(self.ws_send, pkt)
            self.outgoing.sent(position)
            return
        self.outbox.extend((pkt, position) for pkt in packets)
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
        self.polling = False
        packets, position = self.take_outbox()
        for pkt in packets:
            await _ws_write(ws_send, pkt)
        self.outgoing.sent(position)

    # --- packets from the client -----------------------------------------------------------------

    async def receive(self, pkt: eio.Packet) -> None:
        if pkt.packet_type == eio.MESSAGE:
            self.to_app(pkt)
        elif pkt.packet_type == eio.PONG:
            self.pong.set()
        elif pkt.packet_type == eio.CLOSE:
            await self.close(code=1000, tell_client=False)
        # PING (not sent by v4 clients), UPGRADE and NOOP outside the upgrade: nothing to do

    # --- the heartbeat and the end ---------------------------------------------------------------

    async def _heartbeat(self) -> None:
        try:
            while not self.closed:
                await asyncio.sleep(settings.SOCKETIO_PING_INTERVAL)
                self.pong.clear()
                await self.send([eio.Packet(eio.PING)])
                try:
                    await asyncio.wait_for(self.pong.wait(), settings.SOCKETIO_PING_TIMEOUT)
                except TimeoutError:
                    log.info("engine session %s: no pong within %ss, closed", self.sid, settings.SOCKETIO_PING_TIMEOUT)
                    await self.close(code=CLOSE_GOING_AWAY, tell_client=False)
                    return
        except asyncio.CancelledError:
            pass

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
            asyncio.get_running_loop().call_later(settings.SOCKETIO_PING_TIMEOUT, _sessions.pop, self.sid, None)
        else:
            _sessions.pop(self.sid, None)
        self.wake.set()
        if self.beat is not asyncio.current_task():
            self.beat.cancel()
        if self.ws_send is not None and tell_client:
            try:
                await self.ws_send({"type": "websocket.close", "code": 1000})
            except Exception:  # already gone
                pass
        self.inner.put_nowait({"type": "websocket.disconnect", "code": code})


async def _ws_write(send: Send, pkt: eio.Packet) -> None:
    if pkt.packet_type == eio.MESSAGE and isinstance(pkt.data, str):  # the common case, without the codec
        await send({"type": "websocket.send", "text": "4" + pkt.data})
        return
    encoded = pkt.encode()
    await send({"type": "websocket.send", "bytes": encoded} if isinstance(encoded, bytes)
               else {"type": "websocket.send", "text": encoded})


def _query(scope: dict) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}


def _cors(scope: dict) -> list[tuple[bytes, bytes]]:
    """A browser's cross-origin poll is answered for its own origin, with credentials: which origins
    an app accepts is checked at the Socket.IO login, as for /ws (docs/protocol.md)."""
    origin = dict(scope.get("headers") or []).get(b"origin")
    if not origin:
        return []
    return [(b"access-control-allow-origin", origin), (b"access-control-allow-credentials", b"true"),
            (b"vary", b"Origin")]


async def _answer(send: Send, scope: dict, status: int, body: str | bytes, *,
                  content_type: bytes = b"text/plain; charset=UTF-8", extra: list | None = None) -> None:
    payload = body.encode() if isinstance(body, str) else body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode()),
                            (b"cache-control", b"no-store"), *_cors(scope), *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})


async def _error(send: Send, scope: dict, code: int, status: int = 400) -> None:
    await _answer(send, scope, status, json.dumps({"code": code, "message": _MESSAGES[code]}),
                  content_type=b"application/json")


def _checked(query: dict[str, str]) -> int | None:
    """The Engine.IO error of a request's query, or None."""
    if query.get("EIO") != "4":
        return UNSUPPORTED_VERSION
    if query.get("transport") not in ("polling", "websocket"):
        return TRANSPORT_UNKNOWN
    return None


class EngineIO:
    """The ASGI application of /socket.io/ (HTTP and WebSocket), with `app` (an ASGI WebSocket
    application) above every session."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    # --- HTTP long-polling -----------------------------------------------------------------------

    async def _http(self, scope: dict, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method == "OPTIONS":  # a browser's preflight for a cross-origin POST
            await _answer(send, scope, 204, b"", extra=[(b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                                                       (b"access-control-allow-headers", b"content-type")])
            return
        query = _query(scope)
        problem = _checked(query)
        if problem is None and query["transport"] != "polling":
            problem = TRANSPORT_UNKNOWN  # a WebSocket's handshake is not an HTTP request
        if problem is not None:
            await _error(send, scope, problem)
            return
        sid = query.get("sid")
        if sid is None:
            if method != "GET":
                await _error(send, scope, BAD_HANDSHAKE_METHOD)
                return
            session = EngineSession(scope, self.app, polling=True)
            # The session's id in a header too: a load balancer keeps its later requests on this
            # node by it (devstack.balancer's stick table).
            await _answer(send, scope, 200, session.handshake(upgrades=["websocket"]).encode(),
                          extra=[(SID_HEADER, session.sid.encode())])
            return
        session = _sessions.get(sid)
        if session is None:
            await _error(send, scope, SESSION_UNKNOWN)
            return
        if session.closed and method != "GET":
            await _error(send, scope, SESSION_UNKNOWN)
            return
        if not session.polling and not session.closed:
            await _error(send, scope, BAD_REQUEST)  # the session is on its WebSocket now
            return
        if method == "GET":
            await self._poll(session, scope, receive, send)
        elif method == "POST":
            await self._post(session, scope, receive, send)
        else:
            await _error(send, scope, BAD_REQUEST)

    async def _poll(self, session: EngineSession, scope: dict, receive: Receive, send: Send) -> None:
        if session.polls:
            # Two polls at once is a broken client (or a replayed request): the protocol ends the session.
            await _error(send, scope, BAD_REQUEST)
            await session.close(tell_client=False)
            return
        session.polls += 1
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while not session.outbox and not session.closed:
                woken = asyncio.ensure_future(session.wake.wait())
                await asyncio.wait([woken, gone], return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if gone.done():  # the client went away: what waited stays for its next poll
                    return
            packets, position = session.take_outbox()
            if session.closed:
                _sessions.pop(session.sid, None)
                if not packets or packets[-1].packet_type != eio.CLOSE:
                    packets.append(eio.Packet(eio.CLOSE))
        finally:
            session.polls -= 1
            gone.cancel()
        await _answer(send, scope, 200, SEPARATOR.join(p.encode(b64=True) for p in packets))
        session.outgoing.sent(position)  # answered: what it carried has left the node

    async def _post(self, session: EngineSession, scope: dict, receive: Receive, send: Send) -> None:
        limit = settings.SOCKETIO_MAX_PAYLOAD
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await _answer(send, scope, 413, json.dumps({"code": BAD_REQUEST, "message": "Payload too large"}),
                              content_type=b"application/json")
                await session.close(tell_client=False)
                return
            if not message.get("more_body"):
                break
        try:
            packets = [eio.Packet(encoded_packet=part) for part in body.decode("utf-8").split(SEPARATOR)]
        except (ValueError, IndexError, UnicodeDecodeError):
            await _error(send, scope, BAD_REQUEST)
            return
        for pkt in packets:
            await session.receive(pkt)
        await _answer(send, scope, 200, b"ok")

    # --- WebSocket -------------------------------------------------------------------------------

    async def _websocket(self, scope: dict, receive: Receive, send: Send) -> None:
        query = _query(scope)
        await receive()  # websocket.connect
        sid = query.get("sid")
        session = _sessions.get(sid) if sid else None
        if _checked(query) is not None or query["transport"] != "websocket" or (sid and session is None) or (
                session is not None and (not session.polling or session.ws_send is not None)):
            await send({"type": "websocket.close", "code": 1008})  # refused before the handshake: HTTP 403
            return
        await send({"type": "websocket.accept"})
        if session is None:
            session = EngineSession(scope, self.app, polling=False)
            session.ws_send = send
            session.frame_limit.attach(scope)
            await _ws_write(send, session.handshake(upgrades=[]))
        elif not await self._upgrade(session, receive, send):
            return
        else:
            session.frame_limit.attach(scope)
        await self._read_websocket(session, receive, send)

    async def _upgrade(self, session: EngineSession, receive: Receive, send: Send) -> bool:
        """The probe ("2probe" answered "3probe"), the waiting poll let go with a NOOP, then the
        client's UPGRADE: from then on the session is on this socket."""
        message = await receive()
        if message.get("text") != "2probe":
            await send({"type": "websocket.close", "code": 1000})
            return False
        await send({"type": "websocket.send", "text": "3probe"})
        await session.send([eio.Packet(eio.NOOP)])
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return False  # the upgrade was abandoned: the session goes on polling
            text = message.get("text")
            if text == "5":
                await session.on_websocket(send)
                return True
            if text is not None and text.startswith("4"):  # sent on the socket before its UPGRADE
                await session.receive(eio.Packet(encoded_packet=text))

    async def _read_websocket(self, session: EngineSession, receive: Receive, send: Send) -> None:
        limit = settings.SOCKETIO_MAX_PAYLOAD
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await session.close(code=CLOSE_GOING_AWAY, tell_client=False)
                return
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            if len(data) > limit:
                await session.close(code=1009, tell_client=False)
                await send({"type": "websocket.close", "code": 1009})
                return
            if isinstance(data, str) and data.startswith("4"):  # a MESSAGE: the common case, as it came
                session.inner.put_nowait({"type": "websocket.receive", "text": data[1:]})
                continue
            try:
                pkt = eio.Packet(encoded_packet=data)
            except (ValueError, IndexError):
                continue  # not an Engine.IO packet: dropped, as the protocol's servers do
            await session.receive(pkt)
            if session.closed:
                return


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
