"""What one web node keeps for its Pusher connections: their socket ids, the caps on how many it
holds (per address here; per app across the cluster, messaging.gateway.pusher.quota), and its side
of the presence channels (members per channel, written to Redis whole under a lock per channel,
re-asserted and reconciled at every heartbeat)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from messaging.gateway.pusher import figures, presence, quota
from messaging.gateway.pusher import protocol as p
from messaging.gateway.runtime import runtime

log = logging.getLogger(__name__)
ChannelKey = tuple[int, str]  # (app id, Switchboard channel name)


@dataclass
class LocalMembers:
    """A presence channel's members on this node: user -> [connections, user_info]."""

    users: dict[str, list] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def field_value(self) -> dict[str, Any]:
        return {user: entry[1] for user, entry in self.users.items()}


class PusherNode:
    def __init__(self) -> None:
        self.prefix = secrets.randbelow(10**9)
        self.counter = 0
        self.by_address: Counter[str] = Counter()
        self.by_app: Counter[int] = Counter()
        self.quota_apps: set[int] = set()  # apps whose quota field this node writes at its heartbeat
        self.members: dict[ChannelKey, LocalMembers] = {}
        # The connections subscribed to each presence channel here, told what the heartbeat finds.
        self.watchers: dict[ChannelKey, dict[object, Callable[[dict[str, Any]], None]]] = {}
        self._beat: asyncio.Task | None = None
        # Each connection's way to be closed with 4200, for a node the reaper declared dead while it
        # was only paused (messaging.gateway.runtime.declared_dead): its clients reconnect.
        self.connections: dict[object, Callable[[], Awaitable[None]]] = {}
        runtime().declared_dead_hooks.append(self._declared_dead)

    async def _declared_dead(self) -> None:
        ends = list(self.connections.values())
        self.connections.clear()
        await asyncio.gather(*(end() for end in ends), return_exceptions=True)

    def socket_id(self) -> str:
        self.counter += 1
        return f"{self.prefix}.{self.counter}"

    # --- caps -------------------------------------------------------------------------------------

    async def admit(self, address: str, app_pk: int) -> tuple[int, str] | None:
        """Count a connection in; None, or the close code and why it is refused: 4100 (over capacity,
        one address's share of this node) or 4004 (the app is over its connection quota in the
        cluster; with Redis away, on this node)."""
        if self.by_address[address] >= settings.PUSHER_MAX_PER_ADDRESS:
            return p.CLOSE_OVER_CAPACITY, (f"over capacity: {settings.PUSHER_MAX_PER_ADDRESS} connections from your "
                                           "address on this server")
        self.by_address[address] += 1  # (held while the quota is asked: the address's next connection sees it)
        try:
            counted = await quota.connection_count_in(app_id=app_pk, node_id=runtime().node_id,
                                                      quota=settings.PUSHER_MAX_PER_APP)
        except RedisError:
            log.warning("the Pusher connection quota of app %s was checked on this node alone: Redis is away", app_pk)
            counted = self.by_app[app_pk] < settings.PUSHER_MAX_PER_APP
        if not counted:
            _drop(self.by_address, address)
            return p.CLOSE_OVER_QUOTA, (f"Application is over its connection quota: {settings.PUSHER_MAX_PER_APP} "
                                        "connections")
        self.by_app[app_pk] += 1
        self.quota_apps.add(app_pk)
        return None

    async def leave(self, address: str, app_pk: int) -> None:
        _drop(self.by_address, address)
        _drop(self.by_app, app_pk)
        try:
            await quota.connection_count_out(app_id=app_pk, node_id=runtime().node_id)
        except RedisError:
            pass  # (the heartbeat writes the node's counts whole)

    # --- presence ---------------------------------------------------------------------------------

    def ensure_beating(self) -> None:
        if self._beat is None or self._beat.done():
            self._beat = asyncio.ensure_future(self._heartbeat())

    async def member_join(self, key: ChannelKey, user_id: str, info: Any) -> bool:
        """A connection of `user_id` joined; True when it is the user's first in the cluster."""
        local = self.members.setdefault(key, LocalMembers())
        async with local.lock:
            entry = local.users.setdefault(user_id, [0, info])
            entry[0] += 1
            if entry[0] > 1:
                return False
            before, _ = await presence.node_members_write(app_id=key[0], channel=key[1], node_id=runtime().node_id,
                                                          user_id=user_id, members=local.field_value())
            return not before

    async def member_leave(self, key: ChannelKey, user_id: str) -> bool:
        """A connection of `user_id` left; True when it was its last in the cluster."""
        local = self.members.get(key)
        if local is None:
            return False
        async with local.lock:
            entry = local.users.get(user_id)
            if entry is None:
                return False
            entry[0] -= 1
            if entry[0] > 0:
                return False
            del local.users[user_id]
            if not local.users and self.members.get(key) is local:
                del self.members[key]
            _, after = await presence.node_members_write(app_id=key[0], channel=key[1], node_id=runtime().node_id,
                                                         user_id=user_id, members=local.field_value())
            return not after

    def watch(self, key: ChannelKey, reader: object, told: Callable[[dict[str, Any]], None]) -> None:
        self.watchers.setdefault(key, {})[reader] = told
        self.ensure_beating()

    def unwatch(self, key: ChannelKey, reader: object) -> None:
        readers = self.watchers.get(key)
        if readers is not None:
            readers.pop(reader, None)
            if not readers:
                del self.watchers[key]

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(settings.PRESENCE_HEARTBEAT_SECONDS)
            try:
                await self.heartbeat()
            except Exception:
                log.exception("the Pusher presence heartbeat failed")

    async def heartbeat(self) -> None:
        """Re-assert this node's fields and write its connections per app (the console's figures), then tell each presence subscriber here the members as Redis
        has them now: members a dead node took with it are told member_removed by the subscriber."""
        fields = {key: local.field_value() for key, local in list(self.members.items())
                  if local.users and not local.lock.locked()}
        await presence.node_members_reassert(node_id=runtime().node_id, fields=fields)
        try:
            await figures.node_connections_write(node_id=runtime().node_id, by_app=dict(self.by_app))
            apps = {app: self.by_app.get(app, 0) for app in self.quota_apps}
            await quota.connections_reassert(node_id=runtime().node_id, by_app=apps)
            self.quota_apps.difference_update(app for app, count in apps.items() if count <= 0)
        except RedisError:  # (the members' reconciliation below goes on)
            log.warning("this node's Pusher connections were not written (console, quota): Redis is away")
        keys = list(self.watchers)
        if not keys:
            return
        for key, members in zip(keys, await presence.members_read_many(keys), strict=True):
            for told in list(self.watchers.get(key, {}).values()):
                told(members)


def _drop(counts: Counter, key: object) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


_node: PusherNode | None = None


def pusher_node() -> PusherNode:
    global _node
    if _node is None:
        _node = PusherNode()
    return _node
