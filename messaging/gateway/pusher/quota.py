"""An app's Pusher connection quota across the cluster (close 4004, as Pusher counts it: the app's
connections on every web node, not one node's).

`sb:pq:<app>` is a hash with a field per web node holding how many Pusher connections of the app
that node has. A connection is counted in by a script that sums the fields and adds one only while
the sum is under PUSHER_MAX_PER_APP, so two nodes admitting at once cannot both take the last place.
The node lists the hash among its registrations (presence.cache.node_registrations_key), so the
reaper drops a dead node's field with its other registrations; its heartbeat writes its fields
whole again (a restarted Redis, or a count a lost reply left wrong, is right again within a
heartbeat).
"""

from __future__ import annotations

from foundation.transport.redis_clients import async_client
from presence.cache import node_registrations_key

KEY = "sb:pq:{app_id}"

# KEYS: quota hash, node registrations set. ARGV: node, quota. -> 1 counted in, 0 over the quota
_ADMIT = """
local total = 0
for _, n in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(n) end
if total >= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('SADD', KEYS[2], KEYS[1])
return 1
"""

# KEYS: quota hash, node registrations set. ARGV: node.
_LEAVE = """
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[2], KEYS[1])
end
return 0
"""


def quota_key(app_id: int) -> str:
    return KEY.format(app_id=app_id)


async def connection_count_in(*, app_id: int, node_id: str, quota: int) -> bool:
    """Count one more connection of the app on `node_id`; False (nothing counted) when the app's
    connections in the cluster are at `quota` already. Raises RedisError when Redis is away."""
    return bool(await async_client().eval(_ADMIT, 2, quota_key(app_id), node_registrations_key(node_id),
                                          node_id, quota))


async def connection_count_out(*, app_id: int, node_id: str) -> None:
    await async_client().eval(_LEAVE, 2, quota_key(app_id), node_registrations_key(node_id), node_id)


async def connections_reassert(*, node_id: str, by_app: dict[int, int]) -> None:
    """This node's connections per app, whole (its heartbeat); an app at 0 loses the node's field."""
    pipe = async_client().pipeline(transaction=False)
    for app_id, count in by_app.items():
        if count > 0:
            pipe.hset(quota_key(app_id), node_id, count)
            pipe.sadd(node_registrations_key(node_id), quota_key(app_id))
        else:
            pipe.hdel(quota_key(app_id), node_id)
            pipe.srem(node_registrations_key(node_id), quota_key(app_id))
    await pipe.execute()


async def app_connections(app_id: int) -> int:
    return sum(int(v) for v in await async_client().hvals(quota_key(app_id)))
