"""Minimal settings for the baseline relays: Channels over Redis and nothing else.

Deliberately independent of the platform's settings so the baseline measures plain Channels, not
Switchboard's middleware, database or apps. RELAY_CHANNEL_LAYER picks the channel layer:

- `core` (default): `channels_redis.core.RedisChannelLayer`, Channels' documented default. At its
  default capacity it drops messages silently once daphne falls behind: an easy baseline.
- `pubsub`: `channels_redis.pubsub.RedisPubSubChannelLayer`, what a user who read past the
  defaults would pick. Redis PUBLISH straight to the subscribed process: no per-channel lists,
  no BZPOPMIN polling, no capacity (an in-process queue instead), so nothing is dropped.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

REDIS_URL = os.environ.get("REDIS_URL", "")
if not REDIS_URL:
    # No silent default: this machine may run other Redis servers, and benchmarking against the
    # wrong one would mix our traffic into someone else's.
    raise ImproperlyConfigured("bench.relay.settings needs REDIS_URL, e.g. redis://127.0.0.1:6380/0")

SECRET_KEY = "bench-relay-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True

INSTALLED_APPS = ["channels"]
ASGI_APPLICATION = "bench.relay.asgi.application"

# The relay stores nothing.
DATABASES: dict[str, dict[str, str]] = {}

RELAY_CHANNEL_LAYER = os.environ.get("RELAY_CHANNEL_LAYER", "core")
_BACKENDS = {
    "core": "channels_redis.core.RedisChannelLayer",
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
}
if RELAY_CHANNEL_LAYER not in _BACKENDS:
    raise ImproperlyConfigured(f"RELAY_CHANNEL_LAYER must be one of {sorted(_BACKENDS)}, not {RELAY_CHANNEL_LAYER!r}")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": _BACKENDS[RELAY_CHANNEL_LAYER],
        "CONFIG": {
            # The same Redis settings for both layers, so they differ only in how they use Redis.
            # redis-py's default pool ceiling (100) fails under a few hundred busy connections;
            # match the platform's REDIS_MAX_CONNECTIONS default so the comparison is fair (the
            # pub/sub layer holds one connection per shard and never nears it).
            # socket_timeout: redis-py 8 defaults it to 5 s, which races channels_redis's 5 s
            # BZPOPMIN and kills consumers with TimeoutError (django/channels_redis#422); None is
            # the pre-8.0 default channels_redis was written for, and what the pub/sub layer's
            # subscriber connection needs, since it waits as long as nothing is published.
            # The core layer's capacity stays at Channels' default (100 per process channel), as a
            # hand-built app would have it: under overload group_send then drops messages (logged
            # at INFO only).
            "hosts": [{"address": REDIS_URL, "max_connections": 2000, "socket_timeout": None}],
        },
    }
}
