"""What an Engine.IO session tells the connection above it (messaging.gateway.socketio.engine): how much of
what the connection wrote has left the node (Outgoing, fed by Departures from daphne's report of each
transport's buffer), and the lift of the WebSocket frame limit at the client's login (FrameLimitLift).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from foundation.daphne_adapter import FRAME_LIMIT_EXTENSION, OutgoingBuffer

log = logging.getLogger(__name__)


class Outgoing:
    """What the application above has written, and how much of it has left the node: the same
    report daphne's transport gives the /ws consumer (foundation.daphne_adapter.OutgoingBuffer,
    offered under the same scope extension), counted in messages. The consumer counts a message
    delivered only once it has left, and gives back to the mailbox what a session that ends had not
    sent out."""

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


class Departures:
    """Messages (Outgoing positions) handed to a transport, waiting for the bytes that carry them to
    leave the node: a poll's answer or a socket's frames, on daphne's report of the socket's buffer
    (OutgoingBuffer). Without such a report (another server) a message has left once handed over."""

    __slots__ = ("outgoing", "waiting", "buffers")

    def __init__(self, outgoing: Outgoing) -> None:
        self.outgoing = outgoing
        # (made when first needed: a session that never carries a stored message costs none of it)
        self.waiting: collections.deque[tuple[OutgoingBuffer, int, int]] | None = None
        self.buffers: list[OutgoingBuffer] | None = None  # the buffers whose flushes this watches

    def track(self, buffer: OutgoingBuffer | None, position: int) -> None:
        """Messages up to `position` went into `buffer` (the bytes queued in it so far carry them)."""
        if buffer is None or (not self.waiting and buffer.flushed() >= buffer.queued):
            self.outgoing.sent(position)
            return
        if self.waiting is None:
            self.waiting, self.buffers = collections.deque(), []
        self.waiting.append((buffer, buffer.queued, position))
        if buffer.on_flush != self.check:
            buffer.on_flush = self.check
            self.buffers.append(buffer)

    def check(self) -> None:
        position = 0
        while self.waiting:  # (None or empty: nothing waits)
            buffer, target, at = self.waiting[0]
            if buffer.flushed() < target:
                break
            self.waiting.popleft()
            position = at
        if position:
            self.outgoing.sent(position)

    def stop(self) -> None:
        for buffer in self.buffers or ():
            if buffer.on_flush == self.check:
                buffer.on_flush = None
        self.buffers = None


class FrameLimitLift:
    """The application's `lift()` of the WebSocket frame limit (foundation.daphne_adapter.FrameLimit,
    under the same scope extension): a session's socket takes frames up to WS_PREAUTH_MAX_FRAME_BYTES
    until its client has logged in, as /ws does, whether the socket comes before the login or after
    it (an upgrade). The consumer lifts it when it admits its client: the session's login."""

    __slots__ = ("lifted", "socket_limit", "on_lift")

    def __init__(self, on_lift: Callable[[], None]) -> None:
        self.lifted = False
        self.socket_limit = None  # the session's WebSocket's FrameLimit, once it has one
        self.on_lift = on_lift

    def attach(self, scope: dict) -> None:
        self.socket_limit = (scope.get("extensions") or {}).get(FRAME_LIMIT_EXTENSION)
        if self.lifted and self.socket_limit is not None:
            self.socket_limit.lift()

    def lift(self) -> None:
        if self.lifted:
            return
        self.lifted = True
        if self.socket_limit is not None:
            self.socket_limit.lift()
        self.on_lift()
