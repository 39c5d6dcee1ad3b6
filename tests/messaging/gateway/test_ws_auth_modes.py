"""The three app auth modes over /ws, against a web node in this process (tests/inprocess.py) and a
real HTTP auth service."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from apps_registry.models import ClientApp, Domain
from apps_registry.selectors import app_snapshots_clear
from messaging.gateway.authentication import token_sign

# Every test of the module with the database (pytest-django runs them together, with the node's module).
pytestmark = pytest.mark.django_db


class AuthService(BaseHTTPRequestHandler):
    """Admits token 'good', refuses 'bad', answers garbage for 'garbage', hangs for 'slow'."""

    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        AuthService.requests.append(body)
        token = body.get("token")
        if token == "slow":
            time.sleep(3)
        if token == "garbage":
            payload = b"not json"
        else:
            payload = json.dumps({"appId": body["appId"], "userId": body["userId"],
                                  "isAuthenticated": token == "good"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def auth_service():
    server = HTTPServer(("127.0.0.1", 0), AuthService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/auth"
    server.shutdown()


@pytest.fixture(scope="module")
def apps(demo_network, auth_service, django_db_blocker):
    with django_db_blocker.unblock():
        ClientApp.objects.filter(app_name="BNZ").update(
            auth_mode="auth_url", auth_url=auth_service, auth_enabled=True, auth_timeout_ms=1000)
        ClientApp.objects.filter(app_name="ANZ").update(auth_mode="signed_token", token_secret="anz-signing-secret-0123456789abcdef")
        dead = ClientApp.objects.create(app_name="CNZ", app_id="app-id-cnz", master_user_id="CNZ-1",
                                        auth_mode="auth_url", auth_url="http://127.0.0.1:9/auth", auth_enabled=True)
        dead.distributions.create(domain=Domain.objects.get(name="domain-01"), range_from=0)
        app_snapshots_clear()
    return demo_network


def _auth(node, user_id: str, app_id: str, token: str) -> bool:
    with node.client() as client:
        reply = client.auth(user_id, app_id=app_id, token=token)
        admitted = reply["data"]["isAuthenticated"]
        if not admitted:
            assert client.wait_closed() == 1008
        return admitted


def test_the_auth_url_is_asked_with_app_user_and_token_and_its_yes_admits(apps, node):
    AuthService.requests.clear()
    assert _auth(node, "BNZ-31", "app-id-bnz", "good") is True
    assert AuthService.requests == [{"appId": "app-id-bnz", "userId": "BNZ-31", "token": "good"}]


@pytest.mark.parametrize("token", ["bad", "garbage", "slow"])
def test_a_negative_malformed_or_late_answer_refuses(apps, node, token):
    assert _auth(node, "BNZ-32", "app-id-bnz", token) is False


def test_an_unreachable_auth_url_refuses(apps, node):
    assert _auth(node, "CNZ-33", "app-id-cnz", "good") is False


def test_a_signed_token_for_the_user_admits(apps, node):
    assert _auth(node, "ANZ-41", "app-id-343", token_sign(secret="anz-signing-secret-0123456789abcdef", user_id="ANZ-41")) is True


@pytest.mark.parametrize("token", [
    token_sign(secret="anz-signing-secret-0123456789abcdef", user_id="ANZ-41", ttl_seconds=-10),  # expired
    token_sign(secret="wrong-signing-secret-0123456789abcdef", user_id="ANZ-41"),                  # forged
    token_sign(secret="anz-signing-secret-0123456789abcdef", user_id="ANZ-99"),                    # someone else's
    "not-a-token",
])
def test_expired_forged_or_foreign_tokens_refuse(apps, node, token):
    assert _auth(node, "ANZ-41", "app-id-343", token) is False
