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


@pytest.fixture(scope="session", autouse=True)
def _clean_test_redis():
    """The test Redis database starts empty: no presence or queued tasks from an earlier run."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture(scope="session", autouse=True)
def _pool_connections_closed_at_the_end(django_db_setup):
    """Services called through messaging.asyncdb.run_db in this process hold a connection per pool
    thread; the test database can only be dropped once they are closed."""
    yield
    from messaging.asyncdb import pool_connections_close

    pool_connections_close()


from tests.messaging.api_fixtures import (  # noqa: E402,F401  (fixtures of the server API tests)
    anonymous_http,
    anz,
    anz_key,
    api,
    bnz,
    bnz_api,
    bnz_key,
    http,
    live_connection,
    wsgi_app,
)
from tests.processes import demo_network, module_processes, node, private_redis, processes  # noqa: E402,F401  (fixtures)
