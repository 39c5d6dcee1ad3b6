"""Developer machine / `make run`: Postgres and Redis from DATABASE_URL / REDIS_URL.

Importing these settings never starts a process. `make run`, `manage.py` and the test session
start the embedded services when no URL is set and hand their URLs over (devstack.embedded); any
other process (a worker or web node started by hand beside them) finds the ones they started.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from devstack.embedded import running_services

from .base import *  # noqa: F403
from .base import env_bool, env_str, outgoing_allowed_networks, service_settings, webhooks_allow_http

DEBUG = env_bool("DEBUG", True)
WEBHOOKS_ALLOW_HTTP = webhooks_allow_http(DEBUG)
OUTGOING_ALLOWED_NETWORKS = outgoing_allowed_networks(DEBUG)  # loopback and private networks under DEBUG


def _urls() -> tuple[str, str]:
    database_url, redis_url = env_str("DATABASE_URL", ""), env_str("REDIS_URL", "")
    if not database_url or not redis_url:
        embedded = running_services()
        if embedded is None:
            raise ImproperlyConfigured(
                "DATABASE_URL and REDIS_URL are not set and no embedded services were started here: run "
                "`make run` (or `manage.py`, or `python -m devstack.embedded start`), or set both URLs.")
        database_url = database_url or embedded.database_url
        redis_url = redis_url or embedded.redis_url
    return database_url, redis_url


globals().update(service_settings(*_urls()))
