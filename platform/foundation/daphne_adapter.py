"""What daphne's patched server offers the application (foundation.patches.daphne installs it):

- `OutgoingBuffer`, the scope extension `switchboard.outgoing`: how many bytes of a socket's frames
  have left the node, and whether the socket is gone or was cut off as a slow reader;
- `FrameLimit`, the scope extension `switchboard.frame_limit`: the largest frame a WebSocket may
  receive, lifted once its client has authenticated;
- `IncomingQueue`: a WebSocket's application queue, counting the bytes of the received frames in it;
- `CloseHold`, the scope extension `switchboard.close_hold`: the end of a closing handshake held
  until the application has handled what the client sent before its close frame.

`OutgoingBuffer` reads Twisted's private write buffer (`dataBuffer`, `offset`, `_tempDataLen`),
wraps its `doWrite`, and writes a frame to the socket at once when nothing waits before it
(`writeSomeData`, what `doWrite` calls): it is made only by the patched server, so only on the versions
foundation.patches.daphne was tested with.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from foundation.slim_queue import SlimQueue

log = logging.getLogger(__name__)

OUTGOING_EXTENSION = "switchboard.outgoing"
FRAME_LIMIT_EXTENSION = "switchboard.frame_limit"
CLOSE_HOLD_EXTENSION = "switchboard.close_hold"
# Put in a WebSocket's application queue after the frames that came before the client's close frame
# (a consumer's handler for it is `switchboard_close_reply`).
CLOSE_REPLY_EVENT = "switchboard.close_reply"


class OutgoingBuffer:
    """Bytes a connection has queued for its socket, and how many of them have left the node.

    Counts what passes through the transport's `write`; "left" means handed to the kernel (what
    Twisted's write buffer no longer holds). On a transport that does not expose its buffer (TLS
    terminated by daphne itself) nothing is ever pending, and every write counts as gone at once.
    """

    def __init__(self, transport) -> None:
        self.transport = transport
        self.queued = 0
        self.closed = False  # the socket is gone, or was cut off as a slow reader: nothing more leaves
        self.on_flush: Callable[[], None] | None = None
        self._exact = all(hasattr(transport, a) for a in ("dataBuffer", "offset", "_tempDataLen", "doWrite"))
        self._direct = self._exact and all(hasattr(transport, a) for a in ("writeSomeData", "connected", "TLS"))
        self._flush_due = False
        original_write, original_sequence = transport.write, transport.writeSequence

        def write(data: bytes) -> None:
            self.queued += len(data)
            if self._direct and data and self._idle():
                sent = transport.writeSomeData(data)
                if isinstance(sent, int) and sent > 0:
                    self._flush_later()
                    if sent == len(data):
                        return
                    data = data[sent:]
            original_write(data)

        def write_sequence(chunks) -> None:
            chunks = list(chunks)
            self.queued += sum(len(c) for c in chunks)
            original_sequence(chunks)

        transport.write, transport.writeSequence = write, write_sequence
        if self._exact:
            original_do_write = transport.doWrite

            def do_write():
                result = original_do_write()
                self._notify()
                return result

            transport.doWrite = do_write

    def detach(self) -> None:
        """The socket is gone: its transport's own write methods back. The wrappers above are
        stored on the transport and hold it (a reference cycle, left for the collector's full pass
        by every closed connection, issue 47). What was counted stays readable."""
        for name in ("write", "writeSequence", "doWrite"):
            self.transport.__dict__.pop(name, None)
        self._direct = False

    def _idle(self) -> bool:
        """Nothing of this socket waits in Twisted's buffer, and Twisted would write now: a frame
        can go to the kernel at once (as asyncio's transports do), instead of the socket being
        registered for writing and written on the loop's next turn (two epoll_ctl calls and a turn
        per frame, a tenth of a web node's CPU per FAST message; issue 47). Not under TLS, nor
        with a producer or a close under way: Twisted's own path then."""
        t = self.transport
        return (not t._tempDataLen and len(t.dataBuffer) == t.offset and t.connected and not t.TLS
                and not t.disconnecting and not t._writeDisconnected and t.producer is None)

    def _flush_later(self) -> None:
        """What a direct write sent has left the node: `on_flush` is told on the loop's next turn,
        as after Twisted's doWrite (never inside the write: its caller has not yet noted what it wrote)."""
        if self.on_flush is None or self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs here (a test driving the transport by hand): told at once
            self._notify()
            return
        self._flush_due = True
        loop.call_soon(self._notify)

    def _notify(self) -> None:
        self._flush_due = False
        if self.on_flush is not None:
            try:
                self.on_flush()
            except Exception:
                log.exception("flush callback failed")

    def pending(self) -> int:
        if not self._exact:
            return 0
        t = self.transport
        return len(t.dataBuffer) - t.offset + t._tempDataLen

    def flushed(self) -> int:
        return self.queued - self.pending()


class FrameLimit:
    """The largest frame a WebSocket may receive, enforced by autobahn as soon as a frame's header
    arrives: a larger frame closes the socket with 1009 before any of its payload is read. A socket
    starts at WS_PREAUTH_MAX_FRAME_BYTES (an anonymous client cannot make the node read a megabyte);
    the application lifts it to the node's limit (WS_MAX_FRAME_BYTES) once its client has
    authenticated. Offered to the application as the scope extension `switchboard.frame_limit`."""

    def __init__(self, protocol, initial: int) -> None:
        self.protocol = protocol
        self.full = (protocol.maxMessagePayloadSize, protocol.maxFramePayloadSize)  # the factory's: 0 is none
        self.protocol.maxMessagePayloadSize = min(initial, self.full[0] or initial)
        self.protocol.maxFramePayloadSize = min(initial, self.full[1] or initial)

    def lift(self) -> None:
        self.protocol.maxMessagePayloadSize, self.protocol.maxFramePayloadSize = self.full


class IncomingQueue(SlimQueue):
    """A WebSocket's application queue (daphne's `input_queue`) that counts the bytes of the
    received frames waiting in it.

    The size of a frame is noted in `arriving` just before daphne puts it in the queue, and given
    back when the application takes it out (`_put`/`_get`, which every put and get go through).
    Overridden here rather than wrapped on the instance: wrappers stored on the queue that call its
    own bound methods are a reference cycle, left for the collector's full pass by every closed
    connection (issue 47)."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.bytes = 0
        self.arriving = 0
        self._sizes: collections.deque[int] | None = None

    def _put(self, item) -> None:
        if self._sizes is None:
            self._sizes = collections.deque()
        self._sizes.append(self.arriving)
        self.bytes += self.arriving
        self.arriving = 0
        super()._put(item)

    def _get(self):
        item = super()._get()
        self.bytes -= self._sizes.popleft() if self._sizes else 0
        return item


class CloseHold:
    """The end of a WebSocket's closing handshake, held until the application has handled every frame
    the client sent before its close frame (foundation.patches.daphne, 9). Offered to the application
    as the scope extension `switchboard.close_hold`.

    Autobahn drops the TCP connection the moment the client's close frame arrives (the answer to our
    close, or its own). A client reconnects as soon as it sees that, perhaps at another node, while
    the frames it sent just before (its ACKs) may still wait in the application's queue, or be
    handled but not yet committed: the next node then finds those messages unacknowledged and hands
    them again. An application that sets `wanted` is sent CLOSE_REPLY_EVENT in its queue, after those
    frames, and calls `done()` once it has handled them; only then is the connection dropped, or
    after `timeout` seconds whatever the application does."""

    __slots__ = ("wanted", "timeout", "_drop", "_timer")  # one per WebSocket, wanted or not

    def __init__(self, timeout: float) -> None:
        self.wanted = False
        self.timeout = timeout
        self._drop: Callable[[], None] | None = None
        self._timer = None

    def hold(self, queue: SlimQueue | None, drop: Callable[[], None]) -> bool:
        """Called by the protocol instead of dropping the connection: True when it is held (the
        application was told through `queue`, and `drop` is called by `done`)."""
        if not self.wanted or queue is None or self._drop is not None:
            return False
        from twisted.internet import reactor  # (the reactor daphne installed: asyncio's, this loop)

        self._drop = drop
        self._timer = reactor.callLater(self.timeout, self.done)
        queue.put_nowait({"type": CLOSE_REPLY_EVENT})
        return True

    def done(self) -> None:
        """The application has handled what came before the close frame: drop the connection now."""
        drop = self._drop
        self.forget()
        if drop is not None:
            drop()

    def forget(self) -> None:
        """The connection is gone (or dropped): nothing left to drop, no timer."""
        self._drop = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
