"""Who may read a channel (messaging.channels.access): one rule for /ws SUBSCRIBE and both streams."""

from __future__ import annotations

import pytest

from apps_registry.selectors import app_snapshot
from messaging.channels.access import ChannelRefused, Grant, channel_name_require, channel_read_check
from messaging.channels.names import channel_grant_sign
from messaging.core.accept import SendRefused
from tests.factories import make_app

pytestmark = pytest.mark.django_db
SECRET = "s" * 32


@pytest.fixture
def anz():
    make_app(token_secret=SECRET, public_channel_patterns=["news.*"])
    make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    return app_snapshot("ANZ")


def _refusal(anz, name: str, **kw) -> str | None:
    try:
        channel_read_check(anz, name, **{"user_id": "ANZ-1", "grant": None, **kw})
    except ChannelRefused as exc:
        return exc.problem
    return None


def test_a_public_channel_is_read_without_a_grant_even_with_a_stale_one(anz):
    assert _refusal(anz, "news.sport") is None
    assert _refusal(anz, "news.sport", grant=Grant(anz, "not-a-token")) is None


def test_a_private_channel_needs_a_grant_naming_it(anz):
    assert _refusal(anz, "team.7") == "not_public"
    assert _refusal(anz, "team.7", grant=Grant(anz, "not-a-token")) == "bad_grant"
    assert _refusal(anz, "team.7", grant=Grant(anz, channel_grant_sign(secret=SECRET, channels=["team.*"]))) is None
    assert _refusal(anz, "ops", grant=Grant(anz, channel_grant_sign(secret=SECRET, channels=["team.*"]))) == "not_granted"


def test_a_grant_with_a_subject_is_good_for_that_user_only(anz):
    token = channel_grant_sign(secret=SECRET, channels=["team.7"], user_id="ANZ-2")
    assert _refusal(anz, "team.7", grant=Grant(anz, token)) == "not_granted"
    assert _refusal(anz, "team.7", user_id="ANZ-2", grant=Grant(anz, token)) is None


def test_a_durable_subscription_reads_any_channel_of_the_app(anz):
    assert _refusal(anz, "team.7", durable=True) is None


def test_a_channel_name_is_checked_against_the_app(anz):
    assert channel_name_require(anz, "@ANZ-7") == "@ANZ-7"
    for name, code in [("@BNZ-1", "unknown_channel"), ("a:b", "invalid_channel"), (None, "invalid_channel")]:
        with pytest.raises(SendRefused) as refused:
            channel_name_require(anz, name)
        assert refused.value.code == code


def test_an_apps_bare_star_opens_its_pusher_public_channels_but_never_the_signed_ones():
    make_app(token_secret=SECRET, public_channel_patterns=["*"])
    everything = app_snapshot("ANZ")
    assert _refusal(everything, "pusher.scores") is None
    for signed in ("pusher.private-orders", "pusher.private-encrypted-dm", "pusher.presence-room", "pusher-user.7"):
        assert _refusal(everything, signed) == "not_public", signed
    assert _refusal(everything, "pusher.private-orders",
                    grant=Grant(everything, channel_grant_sign(secret=SECRET, channels=["pusher.private-*"]))) is None
