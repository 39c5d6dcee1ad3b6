"""A small synchronous WebSocket client for tests, on the `websockets` library."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

APP_ID = "app-id-343"


class FrameReader:
    """What a test does with a /ws connection, on top of its `send(type, data)` and `recv(timeout)`
    (a real socket here; an in-process node's communicator in tests/inprocess.py)."""

    frames: list[dict]

    def send(self, frame_type: str, data: Any = None, **extra: Any) -> None:
        self.send_raw(json.dumps({"type": frame_type, "data": data if data is not None else {}, **extra}))

    def recv_type(self, frame_type: str, timeout: float = 10) -> dict:
        return self.recv_until(lambda f: f["type"] == frame_type, timeout)

    def recv_until(self, predicate: Callable[[dict], bool], timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching frame within {timeout}s; got {self.frames[-5:]}")
            frame = self.recv(timeout=left)
            if predicate(frame):
                return frame

    def recv_all(self, quiet: float = 0.5) -> list[dict]:
        """Everything that arrives until the socket is quiet for `quiet` seconds."""
        got = []
        while True:
            try:
                got.append(self.recv(timeout=quiet))
            except TimeoutError:
                return got

    def auth(self, user_id: str, app_id: str = APP_ID, token: str = "token-12345", **extra: Any) -> dict:
        self.send("AUTH_CLIENT", {"appId": app_id, "userId": user_id, "token": token, **extra})
        return self.recv_type("AUTH_CLIENT_REPLY")

    def message(self, to: str, content: str, **extra: Any) -> None:
        data = {"to": to, "content": content}
        if "clientMessageId" in extra:
            data["clientMessageId"] = extra.pop("clientMessageId")
        self.send("MESSAGE", data, **extra)

    def fetch(self, count: int) -> tuple[list[dict], int]:
        self.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": count})
        messages = []
        while True:
            frame = self.recv()
            if frame["type"] == "FETCH_MISSING_MESSAGES_COMPLETE":
                return messages, frame["data"]["leftMissingCount"]
            if frame["type"] in ("MESSAGE", "MESSAGE_CONFIRMATION"):
                messages.append(frame)


class WsClient(FrameReader):
    def __init__(self, url: str, **kwargs: Any):
        self.url = url
        self.ws = connect(url, open_timeout=10, max_size=None, **kwargs)
        self.frames: list[dict] = []  # everything received, in order

    def send_raw(self, text: str) -> None:
        self.ws.send(text)

    def recv(self, timeout: float = 10) -> dict:
        frame = json.loads(self.ws.recv(timeout=timeout))
        self.frames.append(frame)
        return frame

    def collect_frames(self, until: Callable[[list[dict]], bool], timeout: float) -> list[dict]:
        """Every frame received until `until(frames)` holds or `timeout` passes: duplicates kept."""
        got: list[dict] = []
        deadline = time.monotonic() + timeout
        while not until(got) and time.monotonic() < deadline:
            try:
                got.append(self.recv(timeout=max(0.05, deadline - time.monotonic())))
            except TimeoutError:
                break
        return got

    def collect_messages(self, want: int, timeout: float) -> dict[str, str]:
        """Message id -> content of the MESSAGE frames received until `want` distinct ids arrived
        or `timeout` passed (a redelivery with the same id counts once: the client's view)."""
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < want and time.monotonic() < deadline:
            try:
                frame = self.recv(timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            if frame["type"] == "MESSAGE":
                seen[frame["data"]["id"]] = frame["data"]["content"]
        return seen

    def wait_closed(self, timeout: float = 10) -> int | None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(timeout=deadline - time.monotonic())
        except ConnectionClosed:
            return self.ws.close_code
        except TimeoutError:
            pass
        raise TimeoutError("socket still open")

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> WsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_for(condition: Callable[[], bool], timeout: float = 15, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval)


_TCP_CLOSE = 7  # linux/tcp_states.h
_TCP_CLOSE_WAIT = 8


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's state of a TCP socket (the first byte of struct tcp_info)."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return _TCP_CLOSE


class SilentWs:
    """A WebSocket client that sends but never reads: a reader that stopped reading.

    Plain socket, minimal RFC 6455 handshake and masked text frames; its receive buffer is small
    and never drained, so whatever the server sends piles up on the server's side.
    """

    def __init__(self, host: str, port: int, path: str = "/ws"):
        import base64
        import os

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(1)
        assert b" 101 " in response.split(b"\r\n", 1)[0], response

    def send(self, frame_type: str, data: Any) -> None:
        import os
        import struct

        payload = json.dumps({"type": frame_type, "data": data}).encode()
        header = bytes([0x81])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        elif len(payload) < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def frame_begin(self, length: int, first: bytes) -> None:
        """Send the header of a text frame of `length` bytes and only its first bytes (a frame that
        is still arriving)."""
        import os
        import struct

        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(first))
        self.sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", length) + mask + masked)

    def close_code(self, timeout: float) -> int | None:
        """The code of the server's close frame, if one comes within `timeout` (frames before it skipped)."""
        import struct

        self.sock.settimeout(timeout)
        data = b""
        try:
            while True:
                if len(data) >= 2:
                    length = data[1] & 0x7F
                    start = 2 + {126: 2, 127: 8}.get(length, 0)
                    if length >= 126 and len(data) >= start:
                        length = struct.unpack("!H" if length == 126 else "!Q", data[2:start])[0]
                    if len(data) >= start + length:
                        if data[0] & 0x0F == 0x8:
                            return struct.unpack("!H", data[start:start + 2])[0] if length >= 2 else None
                        data = data[start + length:]
                        continue
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                data += chunk
        except (TimeoutError, OSError):
            return None

    def closed_by_server(self, timeout: float) -> bool:
        """True once the server has dropped the connection, told without reading a byte.

        Reading would drain the socket and turn the slow reader into a fast one (the server would
        then never need to cut it off), so the kernel's view of the connection is asked instead:
        a FIN from the server leaves it in CLOSE_WAIT, a reset in CLOSE.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _tcp_state(self.sock) in (_TCP_CLOSE, _TCP_CLOSE_WAIT):
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        self.sock.close()


class LateCloseWs(FrameReader):
    """A WebSocket client that answers the server's close frame only when told (`reply_close`): a
    slow client, still sending the frames it owed (ACKs) after the server's close came. websockets'
    sans-I/O protocol over a plain socket; once the server's close frame has come, frames are
    written by hand (the protocol refuses to send while closing)."""

    def __init__(self, url: str, timeout: float = 10):
        from websockets.client import ClientProtocol
        from websockets.http11 import Response
        from websockets.uri import parse_uri

        uri = parse_uri(url)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=timeout)
        self.protocol = ClientProtocol(uri, max_size=None)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        self.frames: list[dict] = []
        self._texts: list[str] = []
        self.close_code: int | None = None
        self.dropped_at: float | None = None
        while not any(isinstance(event, Response) for event in self._read(timeout)):
            pass

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)

    def _read(self, timeout: float) -> list:
        """What one read of the socket brought (the handshake's response, frames)."""
        from websockets.frames import Opcode

        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return []
        except OSError:  # reset by the server
            data = b""
        if not data:
            self.dropped_at = time.monotonic()
            self.protocol.receive_eof()
            return []
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        for event in events:
            if getattr(event, "opcode", None) == Opcode.TEXT:
                self._texts.append(event.data.decode())
            elif getattr(event, "opcode", None) == Opcode.CLOSE:
                self.close_code = self.protocol.close_rcvd.code if self.protocol.close_rcvd else None
        if self.close_code is None:
            self._flush()  # (pongs) but not the reply to a close frame: that waits for reply_close
        return events

    def send_raw(self, text: str) -> None:
        from websockets.frames import Frame, Opcode

        if self.close_code is None:
            self.protocol.send_text(text.encode())
            self._flush()
        else:
            self.sock.sendall(Frame(Opcode.TEXT, text.encode()).serialize(mask=True))

    def recv(self, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while not self._texts:
            if self.close_code is not None or self.dropped_at is not None:
                raise ConnectionClosed(self.protocol.close_rcvd, None)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self._read(left)
        frame = json.loads(self._texts.pop(0))
        self.frames.append(frame)
        return frame

    def wait_close_frame(self, timeout: float = 15) -> int:
        """The code of the server's close frame (frames before it kept for `recv`), not yet answered."""
        deadline = time.monotonic() + timeout
        while self.close_code is None:
            assert time.monotonic() < deadline, "no close frame came"
            self._read(deadline - time.monotonic())
        return self.close_code

    def reply_close(self, timeout: float = 15) -> float:
        """Answer the close frame; the seconds until the server dropped the connection."""
        replied = time.monotonic()
        self._flush()
        deadline = replied + timeout
        while self.dropped_at is None:
            assert time.monotonic() < deadline, "the server never dropped the connection"
            self._read(deadline - time.monotonic())
        self.sock.close()
        return self.dropped_at - replied
