"""Developer machine / `make run`: embedded Postgres and Redis unless the URLs are set."""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import env_bool, env_str, service_settings, webhooks_allow_http

DEBUG = env_bool("DEBUG", True)
WEBHOOKS_ALLOW_HTTP = webhooks_allow_http(DEBUG)


def _urls() -> tuple[str, str]:
    database_url = env_str("DATABASE_URL", "")
    redis_url = env_str("REDIS_URL", "")
    if not database_url or not redis_url:
        from config.embedded import ensure_running

        embedded = ensure_running(postgres=not database_url, redis=not redis_url)
        database_url = database_url or embedded.database_url
        redis_url = redis_url or embedded.redis_url
    return database_url, redis_url


globals().update(service_settings(*_urls()))
