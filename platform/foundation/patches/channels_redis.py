"""channels-redis's internals, reached into on the version it was tested with (foundation.patches.versions).

1. **A SlimQueue per channel.** The pub/sub layer keeps an asyncio.Queue per consumer channel of its
   process; a WebSocket connection is one such channel, read by its consumer alone, so
   foundation.slim_queue's one-reader queue serves and a held connection costs about 2.5 KB less
   (issue 17). The queue is made in the loop layer's private `_subscribe_to_channel`, and the loop
   layer in the proxy's private `_get_layer`, so both are overridden. Nothing else changes: same
   Redis channels, same messages, so processes on this layer and on channels-redis's own talk to
   each other.
2. **A channel's queue read directly.** A consumer may read its channel's queue itself
   (`channel_queue`, `channel_discard`): the /ws consumer waits on its three queues with one future
   instead of three tasks (messaging.gateway.connection.inbox). The queue holds what Redis
   delivered, still serialized: the reader deserializes it, as the layer's `receive` would.
3. **Publishes pipelined.** The socket door (foundation.transport.sockets) publishes a batch of
   sends in one Redis round trip instead of the layer's one locked PUBLISH at a time, so it writes
   what the layer's `send` writes: its serialization of the event, on the Redis channel named as the
   channel (`publishes_queue`).
4. **A send to a channel of this process kept out of Redis.** What the socket door sends to a channel
   a consumer of this process reads on the running loop (a FAST message between two users of one
   node, a presence notice) is put in that channel's queue as the layer's reader would put it, from
   Redis: serialized, so the consumer reads it exactly as before (`local_queues`). It saves the
   publish and the reader's round of it (issue 47).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer
from channels_redis.utils import _wrap_close

from foundation.patches.versions import require_tested
from foundation.slim_queue import SlimQueue

# After an upgrade, check every patch above against the new version, then change this.
TESTED_VERSIONS = {"channels-redis": "4.3.0"}
require_tested(TESTED_VERSIONS, patcher=__name__,
               risk="on other versions the layer can stop delivering to sockets, or deliver what consumers cannot read")


class SlimPubSubLoopLayer(RedisPubSubLoopLayer):
    # 1. the channel's queue, made where channels-redis makes an asyncio.Queue
    async def _subscribe_to_channel(self, channel):
        self.channels[channel] = SlimQueue()
        await self._get_shard(channel).subscribe(channel)

    # 2. the queue read by its consumer directly
    def channel_queue(self, channel: str) -> SlimQueue:
        """The queue of a channel of this process (new_channel's): its reader may take from it
        directly, deserializing what it takes, instead of calling receive(); it must then
        channel_discard() the channel when done, which receive() would have done on cancellation."""
        return self.channels[channel]

    async def channel_discard(self, channel: str) -> None:
        if self.channels.pop(channel, None) is not None:
            await self._get_shard(channel).unsubscribe(channel)


class SlimPubSubChannelLayer(RedisPubSubChannelLayer):
    # 1. the loop layer above instead of channels-redis's, made and closed as channels-redis does
    def _get_layer(self):
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = SlimPubSubLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer


# 3. what the layer's `send` publishes, queued on a pipeline of the one Redis the layer uses (REDIS_URL)
def publishes_queue(pipe: Any, layer: RedisPubSubChannelLayer, sends: Iterable[tuple[str, Any]]) -> None:
    for channel, event in sends:
        pipe.publish(channel, layer.serialize(event))


# 4. the queues of the channels this process reads on the running loop (channel -> queue), where the
# layer's reader puts what Redis delivers
def local_queues(layer: RedisPubSubChannelLayer) -> dict[str, SlimQueue]:
    loop_layer = layer._layers.get(asyncio.get_running_loop())
    return {} if loop_layer is None else loop_layer.channels
