"""Minimal settings for the baseline relay: Channels over Redis and nothing else.

Deliberately independent of the platform's settings so the baseline measures plain Channels, not
Switchboard's middleware, database or apps.
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

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py's default pool ceiling (100) fails under a few hundred busy connections;
            # match the platform's REDIS_MAX_CONNECTIONS default so the comparison is fair.
            # socket_timeout: redis-py 8 defaults it to 5 s, which races channels_redis's 5 s
            # BZPOPMIN and kills consumers with TimeoutError (django/channels_redis#422); None is
            # the pre-8.0 default channels_redis was written for.
            # capacity stays at Channels' default (100 per process channel), as a hand-built app
            # would have it: under overload group_send then drops messages (logged at INFO only).
            "hosts": [{"address": REDIS_URL, "max_connections": 2000, "socket_timeout": None}],
        },
    }
}
