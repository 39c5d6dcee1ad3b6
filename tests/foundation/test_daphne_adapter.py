"""A web node's view of a socket's outgoing bytes (foundation.daphne_adapter.OutgoingBuffer): a frame
to a socket with nothing waiting goes to the kernel at once, and what has left is counted exactly."""

from __future__ import annotations

import asyncio

from foundation.daphne_adapter import OutgoingBuffer


class Transport:
    """What OutgoingBuffer reads of Twisted's TCP transport; the kernel takes `room` bytes at most."""

    TLS = False
    producer = None

    def __init__(self, room: int = 1 << 20) -> None:
        self.room = room
        self.dataBuffer, self.offset, self._tempDataLen = b"", 0, 0
        self.connected, self.disconnecting, self._writeDisconnected = 1, 0, False
        self.kernel = b""  # what the socket took
        self.buffered: list[bytes] = []  # what Twisted's own write queued for its next doWrite

    def writeSomeData(self, data: bytes) -> int:
        taken = bytes(data[: self.room])
        self.room -= len(taken)
        self.kernel += taken
        return len(taken)

    def write(self, data: bytes) -> None:
        self.buffered.append(data)
        self._tempDataLen += len(data)

    def writeSequence(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def doWrite(self) -> None:
        data, self.buffered, self._tempDataLen = b"".join(self.buffered), [], 0
        self.writeSomeData(data)


def test_a_frame_to_a_socket_with_nothing_waiting_leaves_at_once_and_its_flush_is_told_on_the_next_turn():
    transport = Transport()
    buffer = OutgoingBuffer(transport)
    told: list[int] = []
    buffer.on_flush = lambda: told.append(buffer.flushed())

    async def write() -> tuple[list[int], list[int]]:
        transport.write(b"frame one")
        transport.write(b"frame two")
        during = list(told)
        await asyncio.sleep(0)
        return during, list(told)

    during, after = asyncio.run(write())

    assert transport.kernel == b"frame oneframe two" and transport.buffered == []
    assert buffer.queued == buffer.flushed() == 18 and buffer.pending() == 0
    assert during == [] and after == [18]  # never inside the write, once for the turn


def test_what_the_kernel_does_not_take_waits_in_twisteds_buffer_and_later_frames_queue_behind_it():
    transport = Transport(room=4)
    buffer = OutgoingBuffer(transport)

    transport.write(b"abcdefgh")
    transport.write(b"ijkl")

    assert transport.kernel == b"abcd" and transport.buffered == [b"efgh", b"ijkl"]
    assert buffer.queued == 12 and buffer.flushed() == 4
    transport.room = 100
    transport.doWrite()
    assert transport.kernel == b"abcdefghijkl" and buffer.flushed() == 12


def test_a_socket_under_tls_or_closing_is_written_by_twisted_alone():
    for change in ({"TLS": True}, {"disconnecting": 1}, {"connected": 0}):
        transport = Transport()
        for name, value in change.items():
            setattr(transport, name, value)
        buffer = OutgoingBuffer(transport)

        transport.write(b"frame")

        assert transport.kernel == b"" and transport.buffered == [b"frame"], change
        assert buffer.pending() == 5
