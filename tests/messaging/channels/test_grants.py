"""A channel grant reads channels and nothing else: it never logs anyone in, even when it names its
user in `sub` (grants travel in URLs; a login token must not)."""

from __future__ import annotations

import time

import jwt
import pytest

from apps_registry.selectors import app_snapshot, app_snapshots_clear
from foundation.transport.sockets import run_async
from messaging.channels.names import CHANNEL_GRANT_TYPE, channel_grant_claims, channel_grant_sign
from messaging.gateway.authentication import client_authenticate, token_sign
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "a-token-secret-of-at-least-32-bytes!"


@pytest.fixture(autouse=True)
def signed_token_app():
    app_snapshots_clear()
    make_app(auth_mode="signed_token", token_secret=SECRET)
    yield
    app_snapshots_clear()


def log_in(user: str, token: str):
    return run_async(client_authenticate(app_id="app-id-343", user_id=user, token=token))


def test_a_grant_for_a_user_does_not_log_in_as_that_user():
    grant = channel_grant_sign(secret=SECRET, channels=["news.*"], user_id="ANZ-5")
    outcome = log_in("ANZ-5", grant)
    assert not outcome.ok and outcome.reason == "a channel grant is not a login token"
    assert log_in("ANZ-5", token_sign(secret=SECRET, user_id="ANZ-5")).ok  # the user's login token still is


def test_a_grant_signed_before_grants_were_typed_does_not_log_in_either():
    untyped = jwt.encode({"channels": ["news.*"], "sub": "ANZ-5", "exp": int(time.time()) + 600}, SECRET,
                         algorithm="HS256")
    assert not log_in("ANZ-5", untyped).ok
    assert channel_grant_claims(app_snapshot("ANZ"), untyped)["channels"] == ["news.*"]  # still a grant


def test_a_token_of_any_other_type_does_not_log_in():
    other = jwt.encode({"typ": "password-reset", "sub": "ANZ-5", "exp": int(time.time()) + 600}, SECRET,
                       algorithm="HS256")
    login = jwt.encode({"typ": "login", "sub": "ANZ-5", "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
    assert (log_in("ANZ-5", other).ok, log_in("ANZ-5", login).ok) == (False, True)


def test_grants_say_what_they_are():
    grant = channel_grant_sign(secret=SECRET, channels=["news.*"])
    assert channel_grant_claims(app_snapshot("ANZ"), grant)["typ"] == CHANNEL_GRANT_TYPE
