"""WebSocket consumers that read channels: events from the client, from the channel layer (the
socket door) and from the node's channel hub, handled one at a time in arrival order.

Channels' AsyncConsumer waits on two sources (the client and the channel layer); a channel reader
needs a third, the node-local inbox the hub hands publishes to, so a fan-out to a thousand readers
on a node costs no Redis round trip per reader. A reader whose inbox is full does not block the
hub: it marks the channel and repairs it from the history once it catches up.

The three sources are three SlimQueues read by one loop that waits on a single future (`_serve`,
run by a `__call__` that replaces Channels' own: foundation.patches.channels), wherever the consumer
runs: on daphne with foundation's pub/sub layer (the default) the client's queue is daphne's input
queue and the channel's is the layer's own, read directly; under another server or transport (an
in-process test's communicator, Channels' core layer) a feeder task moves what arrives into a
SlimQueue, and the same loop serves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from foundation.patches.channels import consumer_attach
from foundation.slim_queue import SlimQueue
from messaging.channels.cursor import ChannelCursor
from messaging.channels.hub import ChannelKey

INBOX_SIZE = 1000  # channel publishes waiting for one connection
# A connection whose queues never run dry (a client flooding frames, a burst of pushes) gives the
# event loop a turn after this many items handled in a row: one connection cannot hold the node's
# loop (every other client, /healthz) for the length of its whole backlog.
YIELD_EVERY = 64


async def _feed(source: Callable[[], Awaitable], queue: SlimQueue) -> None:
    """Move what `source` yields into `queue`, for ever (cancelled when the connection ends)."""
    while True:
        queue.put_nowait(await source())


class ChannelReaderConsumer(AsyncWebsocketConsumer):
    channels: ChannelCursor | None = None
    ended = False
    _release: asyncio.Future | None = None  # `release`, running or done, once `end` was called

    async def __call__(self, scope, receive, send) -> None:
        self.ended = False
        self._release = None
        direct = False
        feeders: list[asyncio.Task] = []
        self.inbox = SlimQueue(maxsize=INBOX_SIZE)  # one reader: the dispatch loop
        try:
            await consumer_attach(self, scope, send)  # what Channels' own __call__ sets up
            client = getattr(receive, "__self__", None)  # daphne's input queue (foundation.patches.daphne)
            if not isinstance(client, SlimQueue):
                client = SlimQueue()
                feeders.append(asyncio.ensure_future(_feed(receive, client)))
            if hasattr(self.channel_layer, "channel_queue"):
                direct = True
                channel = self.channel_layer.channel_queue(self.channel_name)
            else:
                channel = SlimQueue()
                feeders.append(asyncio.ensure_future(_feed(lambda: self.channel_layer.receive(self.channel_name),
                                                           channel)))
            await self._serve(client, channel, *feeders)
        except StopConsumer:
            pass
        finally:
            for feeder in feeders:
                feeder.cancel()
            # Runs on every way out: a clean disconnect, an exception in a handler, a cancellation.
            finishing = asyncio.ensure_future(self._finish(direct))
            finishing.add_done_callback(self._let_go)
            await asyncio.shield(finishing)

    def _let_go(self, _finished: asyncio.Future | None = None) -> None:
        """The connection is over and released: the consumer drops what it holds, so reference
        counting frees the connection's objects now, not the collector's next full pass.

        A consumer is a knot of references to itself (its life's close callback, its channel
        cursor's writer, its ledger and buffers are its own and point back): left as it is, each
        closed connection leaves about 70 objects in reference cycles that only a full collection
        frees, on the event loop's thread, 50-150 ms for a round of 200 (issue 47). What reads the
        consumer after this finds its class's defaults (no life, no ledger, ended)."""
        vars(self).clear()
        self.ended = True

    async def _finish(self, direct: bool) -> None:
        await self.end()
        if direct:
            await self.channel_layer.channel_discard(self.channel_name)

    async def _serve(self, client: SlimQueue, channel: SlimQueue, *feeders: asyncio.Task) -> None:
        """Channels' await_many_dispatch without its three tasks: the client's frames, the channel
        layer's events and the hub's publishes are taken in turn, one at a time, and while all three
        queues are empty the connection waits on one future that a put into any of them wakes (or a
        feeder that fails: its error ends the connection, as it would end await_many_dispatch)."""
        loop = asyncio.get_running_loop()
        deserialize = getattr(self.channel_layer, "deserialize", None)
        sources = (client, channel, self.inbox)
        wake: asyncio.Future | None = None

        def woken(*_) -> None:
            if wake is not None and not wake.done():
                wake.set_result(None)

        for queue in sources:
            queue.on_put = woken
        for feeder in feeders:
            feeder.add_done_callback(woken)
        turn = 0
        in_a_row = 0
        try:
            while True:
                for feeder in feeders:
                    if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
                        raise feeder.exception()
                for step in range(3):
                    queue = sources[(turn + step) % 3]
                    if queue.qsize():
                        turn = (turn + step + 1) % 3  # the next look starts at the next source
                        item = queue.get_nowait()
                        await self.dispatch(deserialize(item) if isinstance(item, bytes) and deserialize else item)
                        in_a_row += 1
                        if in_a_row >= YIELD_EVERY:
                            in_a_row = 0
                            await asyncio.sleep(0)
                        break
                else:
                    in_a_row = 0
                    wake = loop.create_future()
                    await wake
                    wake = None
        finally:
            for queue in sources:
                queue.on_put = None

    async def end(self) -> None:
        """Release what the connection holds, once, on whichever way out comes first (the client's
        disconnect, or the finally above).

        The release is a task of its own, awaited shielded: daphne cancels a consumer that outlives
        its client by its application close timeout (and again every second until it is done), and
        such a cancellation must not cut a release short half-way (presence given back, the session
        row left open). A later call waits for the same release."""
        if self._release is None:
            self.ended = True
            self._release = asyncio.ensure_future(self.release())
        await asyncio.shield(self._release)

    async def release(self) -> None:
        """What a subclass holds (its channels, its presence, ...): released here, exactly once."""

    # ChannelReader (messaging.channels.hub): called by the hub, must not block.
    def channel_event(self, key: ChannelKey, offset: int, content: str) -> None:
        try:
            self.inbox.put_nowait({"type": "channel.message", "channel": key[1], "offset": offset,
                                   "content": content})
        except asyncio.QueueFull:
            self.channel_fell_behind(key[1])

    def channel_fell_behind(self, name: str) -> None:
        if self.channels is not None:
            self.channels.mark(name)  # repaired from the history once the inbox drains

    def channel_resync(self, key: ChannelKey) -> None:
        if self.channels is not None:
            self.channels.mark(key[1])
        try:
            self.inbox.put_nowait({"type": "channel.repair"})
        except asyncio.QueueFull:
            pass  # the queued events trigger the repair

    async def channel_message(self, event: dict) -> None:
        if self.channels is not None:
            await self.channels.publish(event["channel"], event["offset"], event["content"])

    async def channel_repair(self, event: dict) -> None:
        if self.channels is not None:
            await self.channels.repair()
