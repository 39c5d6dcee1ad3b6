"""The ASGI endpoint of /socket.io/ (HTTP long-polling and WebSocket): Engine.IO 4's handshake, polls,
posts, the probe and upgrade, and its refusals (docs/protocol.md, "Socket.IO"), on the sessions of
messaging.gateway.socketio.engine."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

from django.conf import settings
from engineio import packet as eio

from foundation.daphne_adapter import OUTGOING_EXTENSION
from messaging.core import metrics
from messaging.gateway.socketio.engine import (
    BY_TRANSPORT,
    CLOSE_GOING_AWAY,
    SESSIONS,
    App,
    EngineSession,
    Preauth,
    Receive,
    Send,
    client_address,
    packet_of,
    ws_write,
)

# Engine.IO's error codes (the protocol document's "Errors"), answered as 400 JSON.
TRANSPORT_UNKNOWN, SESSION_UNKNOWN, BAD_HANDSHAKE_METHOD, BAD_REQUEST, FORBIDDEN, UNSUPPORTED_VERSION = range(6)
ERROR_MESSAGES = {TRANSPORT_UNKNOWN: "Transport unknown", SESSION_UNKNOWN: "Session ID unknown",
                  BAD_HANDSHAKE_METHOD: "Bad handshake method", BAD_REQUEST: "Bad request", FORBIDDEN: "Forbidden",
                  UNSUPPORTED_VERSION: "Unsupported protocol version"}
SEPARATOR = "\x1e"  # between the packets of a polling payload
SEPARATOR_BYTE = b"\x1e"
SID_HEADER = b"x-socketio-sid"


def _query(scope: dict) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}


def _cors(scope: dict) -> list[tuple[bytes, bytes]]:
    """A browser's cross-origin poll is answered for its own origin, without credentials: nothing
    here reads a cookie (a client logs in with the CONNECT packet's auth), so no browser is asked to
    send one; which origins an app accepts is checked at the Socket.IO login, as for /ws
    (docs/protocol.md)."""
    origin = dict(scope.get("headers") or []).get(b"origin")
    if not origin:
        return []
    return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]


async def _answer(send: Send, scope: dict, status: int, body: str | bytes, *,
                  content_type: bytes = b"text/plain; charset=UTF-8", extra: list | None = None) -> None:
    payload = body.encode() if isinstance(body, str) else body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode()),
                            (b"cache-control", b"no-store"), *_cors(scope), *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})


async def _error(send: Send, scope: dict, code: int, status: int = 400, message: str | None = None) -> None:
    await _answer(send, scope, status, json.dumps({"code": code, "message": message or ERROR_MESSAGES[code]}),
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
            refused = Preauth.refusal(client_address(scope))
            if refused is not None:  # Engine.IO's refusal of a handshake (its allowRequest): 403, code 4
                metrics.SOCKETIO_LIMITED.labels("preauth_sessions").inc()
                await _error(send, scope, FORBIDDEN, status=403, message=refused)
                return
            session = EngineSession(scope, self.app)
            # The session's id in a header too: a load balancer keeps its later requests on this
            # node by it (devstack.balancer's stick table).
            await _answer(send, scope, 200, session.handshake(upgrades=["websocket"]).encode(),
                          extra=[(SID_HEADER, session.sid.encode())])
            return
        session = SESSIONS.get(sid)
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
            await session.close(by=BY_TRANSPORT)
            return
        session.polls += 1
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while not session.outbox and not session.closed:
                woken = asyncio.ensure_future(session.wait())
                await asyncio.wait([woken, gone], return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if gone.done():  # the client went away: what waited stays for its next poll
                    return
            packets, position = session.take_outbox()
            if not packets:  # the session ended, and all it had to say was taken: CLOSE, and it is gone
                SESSIONS.pop(session.sid, None)
                packets.append(eio.Packet(eio.CLOSE))
        finally:
            session.polls -= 1
            gone.cancel()
        await _answer(send, scope, 200, SEPARATOR.join(p.encode(b64=True) for p in packets))
        if position:  # what it carried has left the node once the answer's bytes have
            session.departures.track((scope.get("extensions") or {}).get(OUTGOING_EXTENSION), position)

    async def _post(self, session: EngineSession, scope: dict, receive: Receive, send: Send) -> None:
        # Before its client has logged in a session takes small payloads of a few packets (a CONNECT
        # and a PONG are all it needs); after, up to the advertised maxPayload and SOCKETIO_MAX_PACKETS.
        preauth = session.preauth
        limit = settings.SOCKETIO_PREAUTH_MAX_PAYLOAD if preauth else settings.SOCKETIO_MAX_PAYLOAD
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                metrics.SOCKETIO_LIMITED.labels("payload").inc()
                await _answer(send, scope, 413, json.dumps({"code": BAD_REQUEST, "message": "Payload too large"}),
                              content_type=b"application/json")
                await session.close(by=BY_TRANSPORT)
                return
            if not message.get("more_body"):
                break
        most = settings.SOCKETIO_PREAUTH_MAX_PACKETS if preauth else settings.SOCKETIO_MAX_PACKETS
        if body.count(SEPARATOR_BYTE) >= most:  # counted before anything is parsed
            metrics.SOCKETIO_LIMITED.labels("packets").inc()
            await _error(send, scope, BAD_REQUEST, message=f"more than {most} packets in one payload")
            await session.close(by=BY_TRANSPORT)
            return
        try:
            packets = [packet_of(part) for part in body.decode("utf-8").split(SEPARATOR)]
        except ValueError:  # (UnicodeDecodeError is one)
            await _error(send, scope, BAD_REQUEST)
            return
        for pkt in packets:  # (handed over HANDOFF_PACKETS at a time: each waits for room)
            await session.receive(pkt)
        await _answer(send, scope, 200, b"ok")

    # --- WebSocket -------------------------------------------------------------------------------

    async def _websocket(self, scope: dict, receive: Receive, send: Send) -> None:
        query = _query(scope)
        await receive()  # websocket.connect
        sid = query.get("sid")
        session = SESSIONS.get(sid) if sid else None
        if _checked(query) is not None or query["transport"] != "websocket" or (sid and session is None):
            await send({"type": "websocket.close", "code": 1008})  # refused before the handshake: HTTP 403
            return
        if session is not None and (not session.polling or session.closed):
            # A second socket for a session already on one: opened and closed again, the session
            # left as it is (the protocol's servers ignore it).
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1000})
            return
        buffer = (scope.get("extensions") or {}).get(OUTGOING_EXTENSION)
        if session is None:
            if Preauth.refusal(client_address(scope)) is not None:
                metrics.SOCKETIO_LIMITED.labels("preauth_sessions").inc()
                await send({"type": "websocket.close", "code": 1008})  # before the handshake: HTTP 403
                return
            await send({"type": "websocket.accept"})
            session = EngineSession(scope, self.app, ws_send=send, ws_buffer=buffer)
            session.frame_limit.attach(scope)
            await ws_write(send, session.handshake(upgrades=[]))
        else:
            await send({"type": "websocket.accept"})
            if not await self._upgrade(session, receive, send, buffer):
                return
            session.frame_limit.attach(scope)
        await self._read_websocket(session, receive, send)

    async def _upgrade(self, session: EngineSession, receive: Receive, send: Send, buffer) -> bool:
        """The probe ("2probe" answered "3probe"), the waiting poll let go with a NOOP, then the
        client's UPGRADE: from then on the session is on this socket."""
        message = await receive()
        if message.get("text") != "2probe":
            await send({"type": "websocket.close", "code": 1000})
            return False
        await send({"type": "websocket.send", "text": "3probe"})
        await session.send(eio.Packet(eio.NOOP))
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return False  # the upgrade was abandoned: the session goes on polling
            text = message.get("text")
            if text == "5":
                await session.on_websocket(send, buffer)
                return True
            if text is not None and text.startswith("4"):  # sent on the socket before its UPGRADE
                await session.receive(packet_of(text))

    async def _read_websocket(self, session: EngineSession, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await session.close(code=CLOSE_GOING_AWAY, by=BY_TRANSPORT)
                return
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            limit = settings.SOCKETIO_MAX_PAYLOAD
            if len(data) > limit:
                await session.close(code=1009, by=BY_TRANSPORT)
                await send({"type": "websocket.close", "code": 1009})
                return
            try:
                pkt = packet_of(data)
            except ValueError:
                continue  # not an Engine.IO packet: dropped, as the protocol's servers do
            await session.receive(pkt)  # (waits while the connection has HANDOFF_PACKETS to take)
            if session.closed:
                return


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
