"""The process's Redis clients (presence cache, rate counters, leases, pub/sub publishes).

One async client per event loop (web nodes) and one sync client per process (workers, beat, the
admin). Pools are sized for hundreds of concurrent consumers: redis-py's asyncio pool raises
"Too many connections" past max_connections.
"""

from __future__ import annotations

import os

import redis
import redis.asyncio as aioredis
from django.conf import settings

from foundation.loop_local import loop_local

_pubsub_namespace: tuple[str, str] | None = None
_sync_client: tuple[int, redis.Redis] | None = None


def async_client() -> aioredis.Redis:
    return loop_local("redis", lambda: aioredis.Redis.from_url(
        settings.REDIS_URL, max_connections=settings.REDIS_MAX_CONNECTIONS, socket_timeout=5,
        socket_connect_timeout=5, retry_on_timeout=True, health_check_interval=30,
    ))


def sync_client() -> redis.Redis:
    global _sync_client
    # Celery's prefork children inherit the parent's client; a socket shared across a fork would
    # interleave two processes' replies, so each process makes its own.
    if _sync_client is None or _sync_client[0] != os.getpid():
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5,
                                      retry_on_timeout=True, health_check_interval=30)
        _sync_client = (os.getpid(), client)
    return _sync_client[1]


def pubsub_namespace() -> str:
    """What names this Redis database among the server's: Redis pub/sub ignores the database number
    (a PUBLISH on db 2 reaches a subscriber on db 3), so processes of different domains sharing one
    server (`make network`, the test ring beside the suite) prefix their own pub/sub channel names
    with it, as kombu does for Celery's. Keys need no prefix: they live in the database."""
    global _pubsub_namespace
    if _pubsub_namespace is None or _pubsub_namespace[0] != settings.REDIS_URL:
        db = redis.connection.parse_url(settings.REDIS_URL).get("db", 0)
        _pubsub_namespace = (settings.REDIS_URL, f"/{db}.")
    return _pubsub_namespace[1]
