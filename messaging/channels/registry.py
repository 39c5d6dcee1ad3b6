"""Who is reading a channel, cluster-wide, in Redis: `sb:cs:<app>:<channel>` is a hash with a
field per web node holding how many of that node's connections (WebSocket, SSE, stream sockets)
read the channel. A publish answers with the sum (the push seed's "subscribers": N). A channel's
total going from 0 to 1 is "occupied", back to 0 "vacated": the Lua script reports both, so two
nodes changing at once cannot both announce.

A node lists these hashes in its presence registrations (presence.cache), so when it is declared
dead its fields go; its heartbeat re-asserts them (a restarted Redis is whole again). When a node's
last reader of a channel leaves, its field and its listing go at once (and the hash itself with the
cluster's last reader): a channel nobody reads leaves nothing behind, whatever names clients tried.
"""

from __future__ import annotations

from foundation.transport.redis_clients import async_client, pubsub_namespace, sync_client
from presence.cache import node_registrations_key

KEY = "sb:cs:{app_id}:{channel}"
FANOUT = "sb:ch:{app_id}:{channel}"  # the pub/sub channel a publish goes out on (after pubsub_namespace())

# KEYS: registry hash, node registrations set. ARGV: node, count. -> {total before, total after}
_SET = """
local before = 0
for _, n in ipairs(redis.call('HVALS', KEYS[1])) do before = before + tonumber(n) end
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('SADD', KEYS[2], KEYS[1])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[2], KEYS[1])
end
local after = 0
for _, n in ipairs(redis.call('HVALS', KEYS[1])) do after = after + tonumber(n) end
return {before, after}
"""


def registry_key(app_id: int, channel: str) -> str:
    return KEY.format(app_id=app_id, channel=channel)


def fanout_key(app_id: int, channel: str) -> str:
    # App ids are database ids: two domains on one Redis server (make network) have the same ones.
    return pubsub_namespace() + FANOUT.format(app_id=app_id, channel=channel)


def fanout_parse(name: str) -> tuple[int, str] | None:
    """(app id, channel) of a fanout_key name; None for any other pub/sub channel."""
    name = name.removeprefix(pubsub_namespace())
    if not name.startswith("sb:ch:"):
        return None
    _, _, app_id, channel = name.split(":", 3)
    return int(app_id), channel


async def readers_set(*, app_id: int, channel: str, node_id: str, count: int) -> tuple[int, int]:
    """Record that `node_id` has `count` readers of the channel; (cluster total before, after)."""
    before, after = await async_client().eval(_SET, 2, registry_key(app_id, channel),
                                              node_registrations_key(node_id), node_id, count)
    return int(before), int(after)


async def readers_reassert(*, node_id: str, counts: dict[tuple[int, str], int]) -> None:
    pipe = async_client().pipeline(transaction=False)
    for (app_id, channel), count in counts.items():
        pipe.hset(registry_key(app_id, channel), node_id, count)
        pipe.sadd(node_registrations_key(node_id), registry_key(app_id, channel))
    await pipe.execute()


def _total(values) -> int:
    return sum(int(v) for v in values)


def readers_count(app_id: int, channel: str) -> int:
    return _total(sync_client().hvals(registry_key(app_id, channel)))


async def readers_count_async(app_id: int, channel: str) -> int:
    return _total(await async_client().hvals(registry_key(app_id, channel)))
