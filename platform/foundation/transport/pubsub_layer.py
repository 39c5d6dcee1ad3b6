"""channels-redis's pub/sub channel layer, with a SlimQueue per channel.

The layer keeps an asyncio.Queue per consumer channel of its process; a WebSocket connection is one
such channel, read by its consumer alone, so foundation.slim_queue's one-reader queue serves and a
held connection costs about 2.5 KB less (issue 17). Nothing else changes: same Redis channels, same
messages, so processes on this layer and on channels-redis's own talk to each other.

A consumer may also read its channel's queue directly (`channel_queue`, `channel_discard`): the
/ws consumer waits on its three queues with one future instead of three tasks
(messaging.gateway.connection.inbox).
"""

from __future__ import annotations

import asyncio

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer
from channels_redis.utils import _wrap_close

from foundation.slim_queue import SlimQueue


class SlimPubSubLoopLayer(RedisPubSubLoopLayer):
    async def _subscribe_to_channel(self, channel):
        self.channels[channel] = SlimQueue()
        await self._get_shard(channel).subscribe(channel)

    def channel_queue(self, channel: str) -> SlimQueue:
        """The queue of a channel of this process (new_channel's): its reader may take from it
        directly, deserializing what it takes, instead of calling receive(); it must then
        channel_discard() the channel when done, which receive() would have done on cancellation."""
        return self.channels[channel]

    async def channel_discard(self, channel: str) -> None:
        if self.channels.pop(channel, None) is not None:
            await self._get_shard(channel).unsubscribe(channel)


class SlimPubSubChannelLayer(RedisPubSubChannelLayer):
    def _get_layer(self):
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = SlimPubSubLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer
