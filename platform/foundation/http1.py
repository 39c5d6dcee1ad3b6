"""A lean HTTP/1.1 client for foundation.outgoing: keep-alive connections on asyncio streams, h11 for
the protocol. What it does is what outgoing calls need and nothing else: one request at a time per
connection, the request written in one piece, the answer read up to a cap, no redirects followed, no
proxies, no cookies, no decompression.

Why not httpx: measured on a web node making its requests' webhook calls (bench.requests), httpx's
layers (client, transport, pool, anyio streams, a readability probe of every pooled connection
before each use) cost about 1 ms of CPU per call, most of a request round trip's CPU on the web
node; this does the same exchange for a fraction of it. The protocol itself (framing, chunked bodies,
keep-alive rules, malformed answers) is h11's, the parser httpx uses underneath.

A connection goes back to the pool only when both sides ended their messages cleanly (h11 says so)
and the answer was read whole; one whose idle time passed `keepalive_expiry`, or that the peer closed
while idle, is not used again. A call on a reused connection that the peer closed before a byte of
the answer came (it timed out the idle connection as the request left) is made once more on a new
connection: the peer never read it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

READ_CHUNK = 65536
MAX_HEADER_BYTES = 64 * 1024  # an answer's status line and headers (h11's incomplete-event cap)


class HttpError(Exception):
    """The exchange failed (connect, TLS, a malformed answer, a connection lost); str() says how."""


class _Stale(Exception):
    """A reused connection closed by the peer before it answered: try a new one."""


Connect = Callable[[str, int, ssl.SSLContext | None], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@dataclass(frozen=True)
class Answer:
    """An answer as foundation.outgoing gives it to its callers."""

    status: int
    body: bytes  # at most the caller's max_bytes
    complete: bool  # False: the answer was longer than max_bytes and was cut off
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names (the last of a repeated one)


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT,
                                                                      max_incomplete_event_size=MAX_HEADER_BYTES))
    idle_since: float = 0.0
    used: bool = False
    received: int = 0  # bytes of the current answer so far

    def close(self) -> None:
        self.writer.transport.abort()


class Http1Pool:
    """Connections to any origin, at most `max_connections` open at once (callers beyond wait for
    one), at most `max_keepalive` of them kept idle. Belongs to the loop it is used on."""

    def __init__(self, connect: Connect, *, max_connections: int, max_keepalive: int, keepalive_expiry: float = 5.0,
                 ssl_context: Callable[[], ssl.SSLContext], user_agent: str = "") -> None:
        self._connect = connect
        self._slots = asyncio.Semaphore(max_connections)
        self._max_keepalive = max_keepalive
        self._expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._ssl: ssl.SSLContext | None = None
        self._user_agent = user_agent
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0

    async def request(self, method: str, url: str, *, content: bytes, headers: dict[str, str],
                      max_bytes: int) -> Answer:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"not an http:// or https:// URL: {url[:200]}")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise HttpError(f"a bad port in {url[:200]}") from None
        host = parts.hostname
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = parts.netloc.rpartition("@")[2]  # (never credentials in the Host header)
        given = {name.lower() for name in headers}
        sent = [("Host", authority), *headers.items()]
        if self._user_agent and "user-agent" not in given:
            sent.append(("User-Agent", self._user_agent))
        if content or method != "GET":
            sent.append(("Content-Length", str(len(content))))
        origin = (scheme, host, port)
        async with self._slots:
            for _ in range(2):
                conn = self._take(origin)
                if conn is None:
                    conn = _Connection(*await self._open(scheme, host, port))
                try:
                    return await self._exchange(conn, origin, method, target, sent, content, max_bytes)
                except _Stale:
                    continue
            raise HttpError("the connection was closed before an answer came")

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if now - conn.idle_since < self._expiry and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    def _give_back(self, origin: tuple[str, str, int], conn: _Connection) -> None:
        if self._idle_count >= self._max_keepalive:
            conn.close()
            return
        conn.h11.start_next_cycle()
        conn.idle_since = time.monotonic()
        self._idle.setdefault(origin, []).append(conn)
        self._idle_count += 1

    async def _open(self, scheme: str, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if scheme == "https" and self._ssl is None:
            self._ssl = self._ssl_context()  # (loading the CA bundle takes tens of ms: once)
        try:
            return await self._connect(host, port, self._ssl if scheme == "https" else None)
        except ssl.SSLError as exc:
            raise HttpError(f"TLS: {exc}") from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc}") from None

    async def _exchange(self, conn: _Connection, origin: tuple[str, str, int], method: str, target: str,
                        headers: list[tuple[str, str]], content: bytes, max_bytes: int) -> Answer:
        reused, conn.used, conn.received = conn.used, True, 0
        keep = False
        try:
            proto = conn.h11
            conn.writer.write(b"".join((proto.send(h11.Request(method=method, target=target, headers=headers)),
                                        proto.send(h11.Data(data=content)) if content else b"",
                                        proto.send(h11.EndOfMessage()))))
            response = await self._head(conn, reused)
            body = bytearray()
            while True:
                event = await self._next(conn)
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > max_bytes:
                        return Answer(response.status_code, bytes(body[:max_bytes]), False, _headers(response))
                elif isinstance(event, h11.EndOfMessage):
                    keep = proto.our_state is h11.DONE and proto.their_state is h11.DONE
                    return Answer(response.status_code, bytes(body), True, _headers(response))
                elif isinstance(event, h11.ConnectionClosed):
                    raise HttpError("the connection was closed in the middle of the answer")
        except h11.LocalProtocolError as exc:
            raise HttpError(f"not sent: {exc}") from None
        except h11.RemoteProtocolError as exc:
            raise HttpError(f"a malformed answer: {exc}") from None
        except (ConnectionError, OSError) as exc:
            raise HttpError(f"connection lost: {exc}") from None
        finally:
            if keep:
                self._give_back(origin, conn)
            else:
                conn.close()

    async def _head(self, conn: _Connection, reused: bool) -> h11.Response:
        while True:
            try:
                event = await self._next(conn)
            except (ConnectionError, OSError, h11.RemoteProtocolError):
                # (h11 calls a close before any answer a protocol error: nothing came at all)
                if conn.received:
                    raise
                if reused:
                    raise _Stale from None
                raise HttpError("the connection was closed before an answer came") from None
            if isinstance(event, h11.Response):
                return event
            # (an InformationalResponse, 1xx: the real one follows)

    @staticmethod
    async def _next(conn: _Connection) -> object:
        proto = conn.h11
        while True:
            event = proto.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await conn.reader.read(READ_CHUNK)
            conn.received += len(data)
            proto.receive_data(data)


def _headers(response: h11.Response) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in response.headers}
