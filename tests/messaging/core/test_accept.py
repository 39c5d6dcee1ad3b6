"""What a sender may send (messaging.core.accept): one rule for a client on /ws and an app's server, each
told in its own words."""

from __future__ import annotations

import pytest

from apps_registry.models import UserDistribution
from apps_registry.selectors import app_snapshot, app_snapshots_clear
from messaging.core.accept import SendRefused, content_require, recipients_require, user_require
from messaging.gateway.connection.handlers import _refused
from tests.factories import make_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def anz():
    make_app(max_group_recipients=3, max_content_bytes=10)
    make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    return app_snapshot("ANZ")


@pytest.mark.parametrize(("name", "problem", "ws_reason"), [
    ("BNZ-5", "other_app", "recipient 'BNZ-5' belongs to another app"),
    ("ANZ-05", "not_user_id", "recipient 'ANZ-05' is not a user id (<appName>-<digits>, no leading zero)"),
    ("", "not_text", "missing or invalid recipient in 'to' (a user id string)"),
    (7, "not_text", "missing or invalid recipient in 'to' (a user id string)"),
])
def test_a_name_that_is_not_a_user_of_the_app_is_refused_alike_and_worded_per_transport(anz, name, problem, ws_reason):
    with pytest.raises(SendRefused) as refused:
        user_require(anz, name, role="recipient")
    assert (refused.value.code, refused.value.problem) == ("unknown_user", problem)
    assert refused.value.detail.endswith("is not a user of app ANZ")  # an app's server learns nothing more
    assert _refused(refused.value, {"to": name}).reason == ws_reason


def test_a_user_no_distribution_covers_is_unknown(anz):
    UserDistribution.objects.filter(app__app_name="ANZ").update(range_to=99)
    app_snapshots_clear()
    with pytest.raises(SendRefused) as refused:
        user_require(app_snapshot("ANZ"), "ANZ-100")
    assert refused.value.problem == "not_distributed"


def test_a_recipient_named_twice_counts_and_gets_the_message_once(anz):
    assert recipients_require(anz, ["ANZ-1", "ANZ-2", "ANZ-1", "ANZ-3", "ANZ-2"]) == ["ANZ-1", "ANZ-2", "ANZ-3"]
    with pytest.raises(SendRefused) as refused:
        recipients_require(anz, ["ANZ-1", "ANZ-2", "ANZ-3", "ANZ-4"])
    assert (refused.value.code, refused.value.extra) == ("too_many_recipients", {"limit": 3})
    assert _refused(refused.value, {}).reason == "at most 3 recipients per group message"


def test_a_list_with_something_other_than_names_is_refused_not_crashed_on(anz):
    with pytest.raises(SendRefused) as refused:
        recipients_require(anz, ["ANZ-1", {"not": "a name"}])
    assert refused.value.problem == "not_text"


def test_content_is_text_within_the_apps_limit_in_utf8_bytes(anz):
    assert content_require(anz, "é" * 5) == "é" * 5
    for content, code in [("é" * 6, "content_too_large"), (None, "invalid_content"), ("a\x00b", "invalid_content")]:
        with pytest.raises(SendRefused) as refused:
            content_require(anz, content)
        assert refused.value.code == code
    too_large = SendRefused("content_too_large", "content exceeds 10 bytes", limit=10)
    frame_error = _refused(too_large, {"content": "x" * 11})
    assert (frame_error.reason, frame_error.echo, frame_error.extra) == ("content exceeds 10 bytes", False, {"limit": 10})
