"""Channels' internals, reached into on the version it was tested with (foundation.patches.versions).

1. **A consumer that runs its own dispatch loop** (`consumer_attach`): the /ws and stream consumers
   replace AsyncConsumer.__call__ (messaging.gateway.connection.inbox) to wait on three queues with
   one future instead of await_many_dispatch's task per source, so they set what AsyncConsumer.__call__
   sets before its loop, which the rest of the consumer reads: `scope`, `base_send` (`send`),
   `channel_layer` and `channel_name` (`websocket_connect`'s groups, `close`, the socket door).
"""

from __future__ import annotations

from typing import Any

from channels.consumer import AsyncConsumer
from channels.layers import get_channel_layer

from foundation.patches.versions import require_tested

# After an upgrade, check the patch above against the new version, then change this.
TESTED_VERSIONS = {"channels": "4.3.2"}
require_tested(TESTED_VERSIONS, patcher=__name__,
               risk="on other versions a WebSocket consumer can miss state Channels' own methods read")


async def consumer_attach(consumer: AsyncConsumer, scope: dict, send: Any) -> None:
    """What AsyncConsumer.__call__ sets before it dispatches, for an async consumer with a channel layer."""
    consumer.scope = scope
    consumer.base_send = send
    consumer.channel_layer = get_channel_layer(consumer.channel_layer_alias)
    consumer.channel_name = await consumer.channel_layer.new_channel()
