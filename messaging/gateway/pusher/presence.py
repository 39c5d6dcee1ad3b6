"""Presence channels' members, cluster-wide, in Redis.

`sb:pp:<app>:<channel>` (the Switchboard channel's name) is a hash with a field per web node: the
JSON object `{user_id: user_info}` of the users that node has at least one subscribed connection
of. A node writes its own field whole (never an increment), under a lock per channel (`PresenceNode`),
so what Redis holds is what the node holds, and a write repeated or reordered by a heartbeat heals
rather than drifts. The script that writes answers whether the user was a member of the channel
(on any node) before the write and after it: member_added is told when a user's first connection
in the cluster joins, member_removed when its last one leaves, and two nodes changing at once cannot
both tell, since scripts run one at a time.

A node lists these hashes among its registrations (presence.cache.node_registrations_key), so when
it is declared dead (the reaper) or drains its field goes, and with it the members only it held;
the nodes that are left find them gone at their next heartbeat (`PresenceNode.reconcile`) and tell
their own subscribers member_removed. Their heartbeats also re-assert their own fields (a restarted
Redis is whole again within a beat).
"""

from __future__ import annotations

import json
from typing import Any

from foundation.transport.redis_clients import async_client, sync_client
from messaging.channels import registry
from presence.cache import node_registrations_key

KEY = "sb:pp:{app_id}:{channel}"

# KEYS: the channel's hash, the node's registrations. ARGV: node, user, the node's field ('' = none).
# -> {the user was a member before (0/1), is one after (0/1), members after}
_WRITE = """
local function members()
  local seen, count, has = {}, 0, false
  for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
    for user, _ in pairs(cjson.decode(v)) do
      if not seen[user] then seen[user] = true; count = count + 1 end
    end
  end
  return seen, count
end
local before = members()[ARGV[2]] and 1 or 0
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[2], KEYS[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  redis.call('SADD', KEYS[2], KEYS[1])
end
local seen, count = members()
return {before, seen[ARGV[2]] and 1 or 0, count}
"""


def presence_key(app_id: int, channel: str) -> str:
    return KEY.format(app_id=app_id, channel=channel)


async def node_members_write(*, app_id: int, channel: str, node_id: str, user_id: str,
                             members: dict[str, Any]) -> tuple[bool, bool]:
    """Write this node's members of the channel; (was `user_id` a member before, is it after)."""
    value = json.dumps(members, separators=(",", ":")) if members else ""
    before, after, _ = await async_client().eval(_WRITE, 2, presence_key(app_id, channel),
                                                 node_registrations_key(node_id), node_id, user_id, value)
    return bool(int(before)), bool(int(after))


def _merge(values) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for value in values:
        for user_id, info in json.loads(value).items():
            members.setdefault(user_id, info)
    return members


async def members_read(app_id: int, channel: str) -> dict[str, Any]:
    """The channel's members, cluster-wide: {user_id: user_info}."""
    return _merge(await async_client().hvals(presence_key(app_id, channel)))


async def members_read_many(keys: list[tuple[int, str]]) -> list[dict[str, Any]]:
    pipe = async_client().pipeline(transaction=False)
    for app_id, channel in keys:
        pipe.hvals(presence_key(app_id, channel))
    return [_merge(values) for values in await pipe.execute()]


def members_read_sync(app_id: int, channel: str) -> dict[str, Any]:
    return _merge(sync_client().hvals(presence_key(app_id, channel)))


async def node_members_reassert(*, node_id: str, fields: dict[tuple[int, str], dict[str, Any]]) -> None:
    if not fields:
        return
    pipe = async_client().pipeline(transaction=False)
    for (app_id, channel), members in fields.items():
        pipe.hset(presence_key(app_id, channel), node_id, json.dumps(members, separators=(",", ":")))
        pipe.sadd(node_registrations_key(node_id), presence_key(app_id, channel))
    await pipe.execute()


async def channel_signal(*, app_id: int, channel: str, data: dict) -> None:
    """Tell every node's readers of the channel something that is not a publish (a member came or
    went): through the channel's pub/sub, handed to each reader's `channel_signal` (messaging.channels.hub)."""
    await async_client().publish(registry.fanout_key(app_id, channel), json.dumps({"s": data}, separators=(",", ":")))
