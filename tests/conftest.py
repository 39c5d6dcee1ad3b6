"""Shared fixtures. Every test runs on real Postgres and Redis (embedded unless the env says)."""

from __future__ import annotations

import pytest
from django.conf import settings


@pytest.fixture
def redis_client():
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()
