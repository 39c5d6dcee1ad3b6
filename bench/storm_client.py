"""The reconnect storm's clients: many /ws connections per process, each as cheap as a socket can be.

A storm of thousands of handshakes on a two-core machine is bounded by whoever spends the CPU, and
the harness must not be the one: a general WebSocket library spends more per handshake than the
server path being measured. So each client here is a bare asyncio protocol that writes a fixed
upgrade request, checks for `101`, sends AUTH_CLIENT as one masked frame (the all-zero mask: valid,
and the payload needs no XOR) and reads frames only as far as to find AUTH_CLIENT_REPLY and to answer
the server's pings. Dropping is `transport.abort()`: the socket goes at once, no close frame, the way
a network cut or a killed client ends it.

A process runs one `ClientGroup` and obeys its parent over a pipe: `connect` (open and authenticate
every client; answers with how many were admitted, refused or failed, and the monotonic time the last
one was admitted), `drop` (abort every socket), `quit`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

HANDSHAKE = ("GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
CONNECT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Login:
    url: str
    user_id: str
    token: str
    acks: bool


def masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    n = len(payload)
    if n < 126:
        head = bytes((0x81, 0x80 | n))
    elif n < 65536:
        head = bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x81, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def read_frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Complete server frames (unmasked) taken off the front of `buffer`: (opcode, payload)."""
    frames = []
    while len(buffer) >= 2:
        opcode, n, start = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
        if n == 126:
            if len(buffer) < 4:
                break
            n, start = int.from_bytes(buffer[2:4], "big"), 4
        elif n == 127:
            if len(buffer) < 10:
                break
            n, start = int.from_bytes(buffer[2:10], "big"), 10
        if len(buffer) < start + n:
            break
        frames.append((opcode, bytes(buffer[start:start + n])))
        del buffer[:start + n]
    return frames


class StormClient(asyncio.Protocol):
    def __init__(self, login: Login, auth_frame: bytes, request: bytes, done: asyncio.Future) -> None:
        self.login, self.auth_frame, self.request, self.done = login, auth_frame, request, done
        self.transport: asyncio.Transport | None = None
        self.upgraded = False
        self.buffer = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.buffer.startswith(b"HTTP/1.1 101"):
                self._finish("failed")
                return
            del self.buffer[:end + 4]
            self.upgraded = True
            self.transport.write(self.auth_frame)
        for opcode, payload in read_frames(self.buffer):
            if opcode == 0x9:  # ping: pong with the same payload, masked
                self.transport.write(bytes((0x8A, 0x80 | len(payload))) + b"\0\0\0\0" + payload)
            elif opcode == 0x1 and not self.done.done() and b"AUTH_CLIENT_REPLY" in payload:
                admitted = json.loads(payload)["data"].get("isAuthenticated") is True
                self._finish("admitted" if admitted else "refused")
            elif opcode == 0x8:
                self._finish("closed")

    def connection_lost(self, exc) -> None:
        self._finish("lost")

    def _finish(self, outcome: str) -> None:
        if not self.done.done():
            self.done.set_result((outcome, time.monotonic()))

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class ClientGroup:
    def __init__(self, logins: list[Login], app_id: str) -> None:
        self.logins = logins
        self.app_id = app_id
        self.clients: list[StormClient] = []
        self._frames = [masked_text_frame(json.dumps({"type": "AUTH_CLIENT", "data": {
            "appId": app_id, "userId": lg.user_id, "token": lg.token, "acks": lg.acks}})) for lg in logins]

    async def _one(self, login: Login, auth_frame: bytes) -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        parts = urlsplit(login.url)
        done = loop.create_future()
        request = HANDSHAKE.format(path=parts.path, host=parts.netloc).encode()
        client = StormClient(login, auth_frame, request, done)
        self.clients.append(client)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: client, parts.hostname, parts.port),
                                   CONNECT_TIMEOUT)
            return await asyncio.wait_for(done, CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            client.drop()
            return ("failed", time.monotonic())

    async def connect(self) -> dict:
        self.clients = []
        results = await asyncio.gather(*(self._one(lg, fr) for lg, fr in zip(self.logins, self._frames, strict=True)))
        outcomes: dict[str, int] = {}
        for outcome, _ in results:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        admitted_at = [at for outcome, at in results if outcome == "admitted"]
        return {"outcomes": outcomes, "last_admitted": max(admitted_at, default=None)}

    def drop(self) -> float:
        for client in self.clients:
            client.drop()
        return time.monotonic()


def client_process(pipe, logins: list[Login], app_id: str) -> None:
    """A client process's whole life: commands from the parent over `pipe` until `quit`."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        group = ClientGroup(logins, app_id)
        while True:
            command = await loop.run_in_executor(None, pipe.recv)
            if command == "connect":
                pipe.send(await group.connect())
            elif command == "drop":
                pipe.send(group.drop())
                await asyncio.sleep(0)  # let the aborts run
            elif command == "quit":
                group.drop()
                pipe.send("bye")
                return

    asyncio.run(serve())
