"""The Redis presence cache: who is connected, on which channel of which node.

One hash per user, `sb:u:<userId>`, field = channel name, value = "<node>|<acks 0/1>". Adding and
removing a connection are Lua scripts, so "was this the user's first / last connection in the
cluster?" is answered atomically: two nodes connecting (or a node and the reaper disconnecting)
the same user at once cannot both announce.

The cache is rebuilt, not trusted: every node re-asserts its live connections on each heartbeat,
so a restarted (emptied) Redis is whole again within one heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from django.conf import settings

USER_KEY = "sb:u:{user_id}"
NODE_ALIVE_KEY = "sb:n:{node_id}:alive"

_CONNECT = """
local added = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {added, redis.call('HLEN', KEYS[1])}
"""
_DISCONNECT = """
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
return {removed, redis.call('HLEN', KEYS[1])}
"""


@dataclass(frozen=True)
class LiveConnection:
    channel_name: str
    node_id: str
    acks: bool


def user_key(user_id: str) -> str:
    return USER_KEY.format(user_id=user_id)


def _decode(channel: bytes | str, value: bytes | str) -> LiveConnection:
    channel = channel.decode() if isinstance(channel, bytes) else channel
    value = value.decode() if isinstance(value, bytes) else value
    node_id, _, acks = value.rpartition("|")
    return LiveConnection(channel_name=channel, node_id=node_id, acks=acks == "1")


def _value(node_id: str, acks: bool) -> str:
    return f"{node_id}|{1 if acks else 0}"


# --- async (web nodes) ---------------------------------------------------------------------------

_async_clients: dict[int, aioredis.Redis] = {}


def async_client() -> aioredis.Redis:
    import asyncio

    loop_id = id(asyncio.get_running_loop())
    client = _async_clients.get(loop_id)
    if client is None:
        client = aioredis.Redis.from_url(
            settings.REDIS_URL, max_connections=settings.REDIS_MAX_CONNECTIONS, socket_timeout=5,
            socket_connect_timeout=5, retry_on_timeout=True, health_check_interval=30,
        )
        _async_clients[loop_id] = client
    return client


async def connection_add(*, user_id: str, channel_name: str, node_id: str, acks: bool) -> bool:
    """Register a connection; True when it is the user's first in the cluster."""
    added, count = await async_client().eval(_CONNECT, 1, user_key(user_id), channel_name, _value(node_id, acks))
    return bool(added) and int(count) == 1


async def connection_remove(*, user_id: str, channel_name: str) -> bool:
    """Forget a connection; True when it was the user's last one in the cluster."""
    removed, count = await async_client().eval(_DISCONNECT, 1, user_key(user_id), channel_name)
    return bool(removed) and int(count) == 0


async def connections_of(user_id: str) -> list[LiveConnection]:
    raw = await async_client().hgetall(user_key(user_id))
    return [_decode(c, v) for c, v in raw.items()]


async def node_heartbeat(*, node_id: str, ttl: int, connections: Iterable[tuple[str, str, bool]]) -> None:
    """Mark the node alive and re-assert its connections (restores a flushed or restarted Redis)."""
    pipe = async_client().pipeline(transaction=False)
    pipe.set(NODE_ALIVE_KEY.format(node_id=node_id), "1", ex=ttl)
    for user_id, channel_name, acks in connections:
        pipe.hset(user_key(user_id), channel_name, _value(node_id, acks))
    await pipe.execute()


# --- sync (workers, maintenance, admin) ----------------------------------------------------------

_sync_client: redis.Redis | None = None


def sync_client() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5,
                                            retry_on_timeout=True, health_check_interval=30)
    return _sync_client


def connections_of_many(user_ids: Iterable[str]) -> dict[str, list[LiveConnection]]:
    users = list(dict.fromkeys(user_ids))
    pipe = sync_client().pipeline(transaction=False)
    for user_id in users:
        pipe.hgetall(user_key(user_id))
    return {u: [_decode(c, v) for c, v in raw.items()] for u, raw in zip(users, pipe.execute(), strict=True)}


def connection_remove_sync(*, user_id: str, channel_name: str) -> bool:
    removed, count = sync_client().eval(_DISCONNECT, 1, user_key(user_id), channel_name)
    return bool(removed) and int(count) == 0


def node_is_alive(node_id: str) -> bool:
    return bool(sync_client().exists(NODE_ALIVE_KEY.format(node_id=node_id)))


def lock_acquire(name: str, ttl: int) -> redis.lock.Lock | None:
    lock = sync_client().lock(f"sb:lock:{name}", timeout=ttl, blocking=False)
    return lock if lock.acquire() else None
