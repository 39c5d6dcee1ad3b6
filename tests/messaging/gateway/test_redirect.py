"""AUTH_CLIENT for a user homed in another domain: refused, with that domain's WebSocket URL."""

from __future__ import annotations

import json

import pytest

from apps_registry.models import Domain
from apps_registry.selectors import app_snapshots_clear
from foundation.transport.sockets import run_async
from messaging.core.protocol import Frame
from messaging.gateway.connection.handlers import on_auth_client
from messaging.gateway.connection.life import ConnectionLife
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db(transaction=True)


class FakeConnection:
    """What on_auth_client writes to and closes, without a socket."""

    def __init__(self):
        self.scope = {"headers": [], "client": ("127.0.0.1", 5000)}
        self.written: list[dict] = []
        self.closed: tuple[int, str] | None = None
        self.life = ConnectionLife(channel_name="test.redirect", close=self.close_with)

    async def write(self, text: str) -> bool:
        self.written.append(json.loads(text))
        return True

    async def close_with(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)


def _auth_client(user_id: str) -> FakeConnection:
    conn = FakeConnection()
    data = {"appId": "app-id-343", "userId": user_id, "token": "x"}
    frame = Frame(type="AUTH_CLIENT", data=data, reference=None, feature="RELIABLE", confirmation_enabled=True,
                  raw={"type": "AUTH_CLIENT", "data": data})
    run_async(on_auth_client(conn, frame))
    return conn


@pytest.fixture
def anz_on_two_domains():
    app = make_app(range_to=8999999)  # ANZ 0-8999999 here (domain-01)
    from apps_registry.services import distribution_create

    elsewhere = make_domain("domain-09")
    elsewhere.urls = ["tcp://10.0.0.9:9089", "wss://domain-09.example/ws", "ws://10.0.0.9:8000/ws"]
    elsewhere.save()
    distribution_create(app=app, domain=elsewhere, range_from=9000000, range_to=None)
    return app


def test_a_user_homed_elsewhere_is_refused_with_the_home_domains_websocket_url(anz_on_two_domains):
    conn = _auth_client("ANZ-9000001")
    assert conn.written == [{"type": "AUTH_CLIENT_REPLY", "data": {
        "appId": "app-id-343", "userId": "ANZ-9000001", "isAuthenticated": False,
        "redirect": "wss://domain-09.example/ws"}}]  # the first ws:// or wss:// URL the domain lists
    code, reason = conn.closed
    assert code == 1008 and reason == "user lives in domain-09; connect to that domain"


def test_no_redirect_when_the_home_domain_lists_no_websocket_url(anz_on_two_domains):
    Domain.objects.filter(name="domain-09").update(urls=["tcp://10.0.0.9:9089"])
    conn = _auth_client("ANZ-9000001")
    assert conn.written[0]["data"] == {"appId": "app-id-343", "userId": "ANZ-9000001", "isAuthenticated": False}


def test_no_redirect_for_a_user_without_a_home_nor_for_other_refusals(anz_on_two_domains):
    anz_on_two_domains.distributions.filter(range_from=9000000).delete()
    assert "redirect" not in _auth_client("ANZ-9000001").written[0]["data"]  # homed nowhere
    assert "redirect" not in _auth_client("ANZ-x").written[0]["data"]  # not a user id


@pytest.mark.parametrize(("listed", "redirect"), [
    ("ws://10.0.0.9:8002", "ws://10.0.0.9:8002/ws"),  # as the linker seed lists domains
    ("wss://domain-09.example/", "wss://domain-09.example/ws"),
    ("wss://domain-09.example/?region=eu", "wss://domain-09.example/ws?region=eu"),
    ("ws://10.0.0.9:8000/switchboard/ws", "ws://10.0.0.9:8000/switchboard/ws"),  # a path of its own is kept
])
def test_a_redirect_from_a_domain_url_without_a_path_points_at_the_ws_endpoint(anz_on_two_domains, listed, redirect):
    Domain.objects.filter(name="domain-09").update(urls=[listed])
    app_snapshots_clear()
    assert _auth_client("ANZ-9000001").written[0]["data"]["redirect"] == redirect
