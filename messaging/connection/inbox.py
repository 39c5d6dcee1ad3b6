"""WebSocket consumers that read channels: events from the client, from the channel layer (the
socket door) and from the node's channel hub, handled one at a time in arrival order.

Channels' AsyncConsumer waits on two sources (the client and the channel layer); a channel reader
needs a third, the node-local inbox the hub hands publishes to, so a fan-out to a thousand readers
on a node costs no Redis round trip per reader. A reader whose inbox is full does not block the
hub: it marks the channel and repairs it from the history once it catches up.
"""

from __future__ import annotations

import asyncio
import functools

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch

from foundation.slim_queue import SlimQueue
from messaging.channels.cursor import ChannelCursor
from messaging.channels.hub import ChannelKey

INBOX_SIZE = 1000  # channel publishes waiting for one connection


class ChannelReaderConsumer(AsyncWebsocketConsumer):
    channels: ChannelCursor | None = None
    ended = False

    async def __call__(self, scope, receive, send) -> None:
        self.ended = False
        self.inbox = SlimQueue(maxsize=INBOX_SIZE)  # one reader: the dispatch loop
        self.scope = scope
        self.base_send = send
        try:
            self.channel_layer = get_channel_layer(self.channel_layer_alias)
            self.channel_name = await self.channel_layer.new_channel()
            self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
            await await_many_dispatch([receive, self.channel_receive, self.inbox.get], self.dispatch)
        except StopConsumer:
            pass
        finally:
            # Runs on every way out: a clean disconnect, an exception in a handler, a cancellation.
            await asyncio.shield(self.end())

    async def end(self) -> None:
        """Release what the connection holds, once, on whichever way out comes first (the client's
        disconnect, or the finally above)."""
        if self.ended:
            return
        self.ended = True
        await self.release()

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
