"""The Pusher door's live figures per app, cluster-wide, for the console (analytics' dashboard): kept
in Redis, since every figure on /metrics is one node's.

- **Connections:** each web node writes its Pusher connections per app whole at every heartbeat
  (`sb:pusher:conns:<node>`, a hash {app id: count} living PUSHER_FIGURES_TTL_SECONDS, and the node
  in `sb:pusher:nodes` scored by the time of that write), so a node that dies stops counting within
  the TTL, and a reader reads only the nodes seen within it.
- **Occupied channels:** the channel registry's `pusher.X` keys with at least one reader (what the
  HTTP API's `GET /channels` reads: a SCAN, whose cost grows with the Redis database's keys).
- **Events published:** every publish (the HTTP API's, one per channel, and client events) counts
  into its app's 10-second bucket (`sb:pusher:pub:<app>:<bucket>`), kept two minutes; the last
  minute is the six newest buckets (50 to 60 seconds, the current one partly).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from django.conf import settings
from redis.exceptions import RedisError

from foundation.transport.redis_clients import async_client, sync_client
from messaging.channels import registry
from messaging.gateway.pusher import protocol as p

log = logging.getLogger(__name__)
NODES = "sb:pusher:nodes"
NODE = "sb:pusher:conns:{node_id}"
PUBLISHED = "sb:pusher:pub:{app_id}:{bucket}"
BUCKET_SECONDS = 10
BUCKETS_PER_MINUTE = 6
BUCKET_TTL_SECONDS = 120


@dataclass(frozen=True)
class PusherFigures:
    connections: int = 0
    occupied_channels: int = 0
    published_last_minute: int = 0


def _bucket(now: float) -> int:
    return int(now // BUCKET_SECONDS)


def _published_counted(pipe, app_id: int, count: int) -> None:
    key = PUBLISHED.format(app_id=app_id, bucket=_bucket(time.time()))
    pipe.incrby(key, count)
    pipe.expire(key, BUCKET_TTL_SECONDS)


def published_count(*, app_id: int, count: int) -> None:
    """Count `count` events published for the app (the HTTP API's views, on their thread). A figure:
    Redis away loses the count, never the publish (stored already)."""
    pipe = sync_client().pipeline(transaction=False)
    _published_counted(pipe, app_id, count)
    try:
        pipe.execute()
    except RedisError:
        log.warning("the Pusher events published of app %s were not counted: Redis is away", app_id)


async def published_count_async(*, app_id: int, count: int = 1) -> None:
    pipe = async_client().pipeline(transaction=False)
    _published_counted(pipe, app_id, count)
    try:
        await pipe.execute()
    except RedisError:
        log.warning("the Pusher events published of app %s were not counted: Redis is away", app_id)


async def node_connections_write(*, node_id: str, by_app: dict[int, int]) -> None:
    """This node's Pusher connections per app, whole (the node's heartbeat)."""
    key = NODE.format(node_id=node_id)
    pipe = async_client().pipeline(transaction=True)
    pipe.delete(key)
    if by_app:
        pipe.hset(key, mapping={str(app): count for app, count in by_app.items()})
        pipe.expire(key, settings.PUSHER_FIGURES_TTL_SECONDS)
    now = time.time()
    pipe.zadd(NODES, {node_id: now})
    pipe.zremrangebyscore(NODES, 0, now - settings.PUSHER_FIGURES_TTL_SECONDS)  # nodes gone (restarts' old ids)
    await pipe.execute()


def figures_read(app_ids: list[int]) -> dict[int, PusherFigures]:
    """The figures of these apps (database ids): one read of the live nodes' hashes, one SCAN of the
    channel registry, one MGET of the buckets."""
    client = sync_client()
    now = time.time()
    client.zremrangebyscore(NODES, 0, now - settings.PUSHER_FIGURES_TTL_SECONDS)
    nodes = client.zrange(NODES, 0, -1)
    connections: Counter[int] = Counter()
    pipe = client.pipeline(transaction=False)
    for node in nodes:
        pipe.hgetall(NODE.format(node_id=node.decode() if isinstance(node, bytes) else node))
    for counts in pipe.execute() if nodes else []:
        for app, count in counts.items():
            connections[int(app)] += int(count)
    channels = _occupied_channels(client)
    published = _published_read(client, app_ids, now)
    return {app: PusherFigures(connections=connections[app], occupied_channels=channels[app],
                               published_last_minute=published[app]) for app in app_ids}


def _occupied_channels(client) -> Counter[int]:
    match = registry.KEY.format(app_id="*", channel=p.PREFIX) + "*"
    keys = list(client.scan_iter(match=match, count=1000))
    occupied: Counter[int] = Counter()
    if not keys:
        return occupied
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hvals(key)
    for key, values in zip(keys, pipe.execute(), strict=True):
        if sum(int(v) for v in values) > 0:
            occupied[int((key.decode() if isinstance(key, bytes) else key).split(":")[2])] += 1
    return occupied


def _published_read(client, app_ids: list[int], now: float) -> Counter[int]:
    buckets = [_bucket(now) - i for i in range(BUCKETS_PER_MINUTE)]
    keys = [(app, PUBLISHED.format(app_id=app, bucket=b)) for app in app_ids for b in buckets]
    published: Counter[int] = Counter()
    if keys:
        for (app, _), value in zip(keys, client.mget([k for _, k in keys]), strict=True):
            published[app] += int(value or 0)
    return published
