"""The relay consumer: the linker protocol's AUTH_CLIENT and MESSAGE, relayed through a Channels group.

No persistence, no confirmation, no retries: what a developer would write by hand with Channels in
an afternoon. It is the floor the platform's latency is compared against.
"""

from __future__ import annotations

import re
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9\-_.]")


def user_group(user_id: str) -> str:
    """Channels group names allow only [A-Za-z0-9-_.] and < 100 characters."""
    return "u." + _GROUP_UNSAFE.sub("_", user_id)[:90]


def channel_group(channel: str) -> str:
    return "c." + _GROUP_UNSAFE.sub("_", channel)[:90]


class RelayConsumer(AsyncJsonWebsocketConsumer):
    user_id: str | None = None

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        data = content.get("data") or {}
        if kind == "AUTH_CLIENT":
            await self._authenticate(data)
        elif kind == "PING":
            await self.send_json({"type": "PONG", "data": {}})
        elif self.user_id is None:
            await self.send_json({"type": "AUTH_REQUIRED", "data": {}})
        elif kind == "MESSAGE":
            await self._relay(data, content.get("reference"))
        elif kind == "SUBSCRIBE":
            await self._subscribe(str(data.get("channel", "")))
        elif kind == "PUBLISH":
            await self.channel_layer.group_send(
                channel_group(str(data.get("channel", ""))),
                {"type": "relay.channel", "channel": data.get("channel"), "content": data.get("content")})

    async def _authenticate(self, data: dict[str, Any]) -> None:
        # Everyone is accepted: the baseline measures relaying, not authentication.
        self.user_id = str(data.get("userId", ""))
        await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
        reply = {"appId": data.get("appId"), "userId": self.user_id, "isAuthenticated": True}
        await self.send_json({"type": "AUTH_CLIENT_REPLY", "data": reply})

    async def _relay(self, data: dict[str, Any], reference: Any) -> None:
        event = {"type": "relay.message", "from": self.user_id, "content": data.get("content"), "reference": reference}
        await self.channel_layer.group_send(user_group(str(data.get("to", ""))), event)

    async def _subscribe(self, channel: str) -> None:
        """A group per channel: what a hand-built Channels app does for a channel fan-out."""
        self.channels_joined = {*getattr(self, "channels_joined", set()), channel}
        await self.channel_layer.group_add(channel_group(channel), self.channel_name)
        await self.send_json({"type": "SUBSCRIBED", "data": {"channel": channel}})

    async def relay_channel(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "CHANNEL_MESSAGE", "data": {"channel": event["channel"],
                                                                  "content": event["content"]}})

    async def relay_message(self, event: dict[str, Any]) -> None:
        frame: dict[str, Any] = {"type": "MESSAGE", "data": {"from": event["from"], "content": event["content"]}}
        if event.get("reference") is not None:
            frame["reference"] = event["reference"]
        await self.send_json(frame)

    async def disconnect(self, code: int) -> None:
        if self.user_id is not None:
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)
        for channel in getattr(self, "channels_joined", ()):
            await self.channel_layer.group_discard(channel_group(channel), self.channel_name)
