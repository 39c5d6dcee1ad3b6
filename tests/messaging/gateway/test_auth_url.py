"""AUTH_CLIENT through an app's auth URL, against real local auth services: a hostile or slow one
costs its own app's logins only, within a deadline, and never more than a small answer's worth."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from apps_registry.selectors import app_snapshots_clear
from foundation.transport.sockets import run_async
from messaging.gateway.authentication import client_authenticate
from tests.factories import make_app
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def _yes(app_id: str, user_id: str, **extra) -> bytes:
    return json.dumps({"appId": app_id, "userId": user_id, "isAuthenticated": True, **extra}).encode()


@pytest.fixture(autouse=True)
def _fresh_snapshots():
    app_snapshots_clear()
    yield
    app_snapshots_clear()


def _auth_url_app(url: str, app_name: str = "ANZ", app_id: str = "app-id-343", timeout_ms: int = 3000):
    return make_app(app_name=app_name, app_id=app_id, master=f"{app_name}-1", auth_mode="auth_url", auth_url=url,
                    auth_enabled=True, auth_timeout_ms=timeout_ms)


def _login(user_id: str = "ANZ-5", app_id: str = "app-id-343"):
    return run_async(client_authenticate(app_id=app_id, user_id=user_id, token="t"), timeout=30)


def test_an_auth_service_that_says_yes_admits():
    with WebhookReceiver(answer=_yes("app-id-343", "ANZ-5")) as service:
        _auth_url_app(service.url)
        assert _login().ok
        assert service.calls[0].json == {"appId": "app-id-343", "userId": "ANZ-5", "token": "t"}


def test_an_answer_over_the_size_cap_is_refused_even_when_it_says_yes(settings):
    settings.AUTH_URL_MAX_ANSWER_BYTES = 16 * 1024
    with WebhookReceiver(answer=_yes("app-id-343", "ANZ-5", padding="x" * 20_000)) as service:
        _auth_url_app(service.url)
        outcome = _login()
    assert (outcome.ok, outcome.reason) == (False, "auth service refused")


def test_a_dripping_auth_service_is_cut_off_at_the_platforms_deadline_whatever_the_apps_timeout(settings):
    settings.AUTH_URL_MAX_SECONDS = 1.0
    with WebhookReceiver(drip=0.1) as dripping:
        _auth_url_app(dripping.url, timeout_ms=60_000)
        started = time.monotonic()
        outcome = _login()
        took = time.monotonic() - started
    assert (outcome.ok, outcome.reason) == (False, "auth service unreachable")
    assert 0.9 <= took < 5


def test_an_auth_service_on_a_network_the_operator_did_not_allow_is_never_asked(settings):
    settings.OUTGOING_ALLOWED_NETWORKS = []
    with WebhookReceiver(answer=_yes("app-id-343", "ANZ-5")) as service:
        _auth_url_app(service.url)
        outcome = _login()
        assert service.calls == []
    assert (outcome.ok, outcome.reason) == (False, "auth service unreachable")


def test_a_slow_auth_service_holds_up_its_own_apps_logins_only(settings):
    settings.AUTH_URL_APP_CONCURRENCY = 1
    settings.AUTH_URL_QUEUE_SECONDS = 0.3
    with WebhookReceiver(answer=_yes("app-id-343", "ANZ-5"), delay=2.0) as slow, \
            WebhookReceiver(answer=_yes("app-id-bnz", "BNZ-5")) as fast:
        _auth_url_app(slow.url)
        _auth_url_app(fast.url, app_name="BNZ", app_id="app-id-bnz")
        finished: list[str] = []

        async def login(user_id: str, app_id: str, delay: float):
            await asyncio.sleep(delay)
            outcome = await client_authenticate(app_id=app_id, user_id=user_id, token="t")
            finished.append(f"{user_id}:{outcome.reason or 'ok'}")

        async def together():
            await asyncio.gather(login("ANZ-5", "app-id-343", 0), login("ANZ-5", "app-id-343", 0.1),
                                 login("BNZ-5", "app-id-bnz", 0.1))

        run_async(together(), timeout=30)
    # ANZ's second login found ANZ's one slot taken and was refused; BNZ's went through at once.
    assert finished == ["ANZ-5:auth service busy", "BNZ-5:ok", "ANZ-5:ok"] or \
        finished == ["BNZ-5:ok", "ANZ-5:auth service busy", "ANZ-5:ok"]
