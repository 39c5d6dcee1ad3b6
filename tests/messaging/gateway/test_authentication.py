"""AUTH_CLIENT decisions: token lifetime, allowed origins, strict ids, one HTTP client per loop."""

from __future__ import annotations

import time

import jwt
import pytest
from django.conf import settings

from apps_registry.models import ClientApp
from apps_registry.selectors import app_snapshots_clear
from foundation.transport.sockets import run_async
from messaging.gateway import authentication
from messaging.gateway.authentication import client_authenticate, token_sign
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "a-token-secret-of-at-least-32-bytes!"


@pytest.fixture(autouse=True)
def _fresh_snapshots():
    app_snapshots_clear()
    yield
    app_snapshots_clear()


def _auth(user: str = "ANZ-5", token: str = "", origin: str | None = None, app_id: str = "app-id-343"):
    return run_async(client_authenticate(app_id=app_id, user_id=user, token=token, origin=origin))


def test_a_signed_token_reaching_further_than_the_apps_maximum_lifetime_is_refused():
    make_app(auth_mode="signed_token", token_secret=SECRET, max_token_lifetime_seconds=3600)
    assert _auth(token=token_sign(secret=SECRET, user_id="ANZ-5", ttl_seconds=600)).ok
    far = jwt.encode({"sub": "ANZ-5", "exp": 32503680000}, SECRET, algorithm="HS256")  # the year 3000
    outcome = _auth(token=far)
    assert not outcome.ok and "lifetime" in outcome.reason


def test_expired_forged_and_unsigned_tokens_are_refused():
    make_app(auth_mode="signed_token", token_secret=SECRET)
    expired = jwt.encode({"sub": "ANZ-5", "exp": int(time.time()) - 5}, SECRET, algorithm="HS256")
    forged = token_sign(secret="not-the-secret-but-just-as-long-as-it", user_id="ANZ-5")
    unsigned = jwt.encode({"sub": "ANZ-5", "exp": int(time.time()) + 60}, None, algorithm="none")
    other_user = token_sign(secret=SECRET, user_id="ANZ-6")
    assert [_auth(token=t).reason for t in (expired, forged, unsigned, other_user)] == [
        "token expired", "invalid token", "invalid token", "token is for another user"]


def test_an_app_with_allowed_origins_refuses_other_browser_origins():
    make_app(allowed_origins=["https://app.example.com"])
    assert _auth(origin="https://app.example.com").ok
    assert _auth(origin=None).ok  # not a browser: an Origin header proves nothing there
    refused = _auth(origin="https://evil.example")
    assert not refused.ok and "origin" in refused.reason


def test_only_one_spelling_of_a_user_id_is_admitted():
    make_app()
    assert _auth("ANZ-123").ok
    assert [_auth(u).ok for u in ("ANZ-0123", "ANZ-１２３", "ANZ-١٢٣", "ANZ-123\n")] == [False] * 4


def test_the_auth_url_client_is_made_once_per_event_loop():
    async def twice():
        return authentication._http_client() is authentication._http_client()

    assert run_async(twice())


def test_an_auth_url_app_with_the_url_switched_off_refuses_every_login():
    make_app(auth_mode="auth_url", auth_url="http://127.0.0.1:9/auth", auth_enabled=False)  # saved before the rule
    outcomes = [_auth(token=t) for t in ("", "anything")]
    assert [o.ok for o in outcomes] == [False, False]
    assert "auth URL is switched off" in outcomes[0].reason


def test_a_new_app_admits_nobody_without_a_token_signed_with_its_secret():
    app = ClientApp.objects.create(app_name="KIWI", app_id="kiwi-app", master_user_id="KIWI-1")  # no mode chosen
    app.distributions.create(domain=make_domain(settings.DOMAIN_NAME), range_from=0)
    assert not _auth("KIWI-5", token="t", app_id="kiwi-app").ok
    assert _auth("KIWI-5", token=token_sign(secret=app.token_secret, user_id="KIWI-5"), app_id="kiwi-app").ok


def test_a_token_admitted_before_is_admitted_again_until_it_expires_and_never_under_another_secret(monkeypatch):
    app = make_app(auth_mode="signed_token", token_secret=SECRET)
    token = token_sign(secret=SECRET, user_id="ANZ-5", ttl_seconds=60)
    assert _auth(token=token).ok
    assert _auth(token=token).ok  # a reconnect: remembered, not decoded again

    later = time.time() + 120
    monkeypatch.setattr(authentication.time, "time", lambda: later)
    assert _auth(token=token).reason == "token expired"
    monkeypatch.undo()

    ClientApp.objects.filter(pk=app.pk).update(token_secret="another-secret-of-at-least-32-bytes!!")
    app_snapshots_clear()
    assert _auth(token=token).reason == "invalid token"
