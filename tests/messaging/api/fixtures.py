"""Fixtures of the server API tests: two apps with keys, and the Python client talking to the
Django app in-process (httpx's WSGI transport), inside the test's transaction."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from channels.layers import get_channel_layer
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from switchboard_client import SwitchboardClient

from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import api_key_create, distribution_create
from foundation.transport.sockets import run_async
from messaging.api.authentication import verified_keys_forget
from presence import cache
from tests.factories import make_app, make_domain

BASE = "http://testserver"


@pytest.fixture
def wsgi_app():
    """The project's WSGI app, sharing the test's database connection: Django's own test client
    does the same (closing "old" connections per request would end the test's transaction)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    app_snapshots_clear()
    verified_keys_forget()
    yield WSGIHandler()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
    app_snapshots_clear()
    verified_keys_forget()


@pytest.fixture
def anz(db):
    """ANZ: users 0-8999999 homed here (domain-01), 9000000 and up in domain-09; master ANZ-123223."""
    app = make_app(app_name="ANZ", app_id="app-id-343", master="ANZ-123223", range_to=8999999, max_group_recipients=5)
    distribution_create(app=app, domain=make_domain("domain-09"), range_from=9000000, range_to=None)
    return app


@pytest.fixture
def bnz(db):
    return make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1", range_to=999999)


@pytest.fixture
def anz_key(anz) -> str:
    return api_key_create(app=anz, name="anz server")[1]


@pytest.fixture
def bnz_key(bnz) -> str:
    return api_key_create(app=bnz, name="bnz server")[1]


def client_for(wsgi_app, key: str) -> SwitchboardClient:
    return SwitchboardClient(BASE, key, retries=0, transport=httpx.WSGITransport(app=wsgi_app))


@pytest.fixture
def api(wsgi_app, anz_key):
    with client_for(wsgi_app, anz_key) as client:
        yield client


@pytest.fixture
def bnz_api(wsgi_app, bnz_key):
    with client_for(wsgi_app, bnz_key) as client:
        yield client


@pytest.fixture
def http(wsgi_app, anz_key):
    """A plain HTTP client with ANZ's key, for what the Python client does not let one get wrong."""
    with httpx.Client(base_url=BASE, transport=httpx.WSGITransport(app=wsgi_app),
                      headers={"Authorization": f"Bearer {anz_key}"}) as client:
        yield client


@pytest.fixture
def anonymous_http(wsgi_app):
    with httpx.Client(base_url=BASE, transport=httpx.WSGITransport(app=wsgi_app)) as client:
        yield client


NODE = "node-api-test"


@pytest.fixture
def live_connection():
    """Stand-ins for sockets: real channels of the Redis channel layer, registered in presence as
    connections of a user on some node; `received(channel)` is what such a socket was sent."""
    made: list[tuple[str, str]] = []

    def connect(user_id: str) -> str:
        channel = run_async(get_channel_layer().new_channel())
        run_async(cache.connection_add(user_id=user_id, channel_name=channel, node_id=NODE, acks=False, limit=10))
        made.append((user_id, channel))
        return channel

    yield connect
    for user_id, channel in made:
        run_async(cache.connection_remove(user_id=user_id, channel_name=channel, node_id=NODE))


def received(channel: str, timeout: float = 5) -> dict:
    return run_async(asyncio.wait_for(get_channel_layer().receive(channel), timeout))
