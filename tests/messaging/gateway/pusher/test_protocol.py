"""The Pusher door's pure parts: names, signatures, and events as channel messages and back."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from apps_registry.selectors import AppSnapshot
from messaging.channels.names import channel_name_valid
from messaging.gateway.pusher import protocol as p
from messaging.gateway.pusher.api_auth import api_request_check, string_to_sign
from tests.pusher import channel_auth


@pytest.mark.parametrize(("name", "sb"), [
    ("orders", "pusher.orders"),
    ("private-encrypted-x", "pusher.private-encrypted-x"),
    ("#server-to-user-42", "pusher-user.42"),
    ("presence-room;1", "pusher.presence-room@s1"),
    ("a=b,c@d", "pusher.a@eb@cc@@d"),
    ("@@", "pusher.@@@@"),
    ("x" * 200, "pusher." + "x" * 200),
    (";" * 200, "pusher." + "@s" * 200),
])
def test_a_pusher_channel_is_a_switchboard_channel_of_its_own_namespace_and_back(name, sb):
    assert p.switchboard_channel(name) == sb and p.pusher_channel(sb) == name
    assert p.channel_name_problem(name) is None or name.startswith("#")
    assert channel_name_valid(sb)


@pytest.mark.parametrize("native", ["news.sport", "@ANZ-1", "pusher.a@", "pusher.a@x", "pusher." + "x" * 201])
def test_native_channels_that_escape_no_pusher_name_are_no_pusher_channels(native):
    assert p.pusher_channel(native) is None


def test_a_prefix_of_a_name_escapes_to_a_prefix_of_its_escape_so_filter_by_prefix_finds_it():
    assert p.switchboard_channel("presence-a=b;c").startswith(p.switchboard_channel("presence-a="))
    assert not p.switchboard_channel("presence-a@eb").startswith(p.switchboard_channel("presence-a="))


@pytest.mark.parametrize(("name", "problem"), [
    ("x" * 201, "longer than 200"),
    ("a b", "characters other than"),
    ("a:b", "characters other than"),
    ("a#b", "characters other than"),
    ("", "required"),
])
def test_names_the_protocol_or_switchboard_cannot_carry_are_refused_with_a_reason(name, problem):
    assert problem in p.channel_name_problem(name)


def test_channel_kinds():
    assert p.channel_kind("presence-cache-x") == p.ChannelKind(private=True, presence=True, encrypted=False, cache=True)
    assert not p.channel_kind("private-encrypted-x").client_events and p.channel_kind("private-x").client_events
    assert p.channel_kind("cache-x").cache and not p.channel_kind("cache-x").private


def test_a_channel_authorization_is_the_apps_hmac_of_socket_and_channel_and_data():
    auth = channel_auth("1.2", "presence-r", {"user_id": "u"}, key="k", secret="s")
    assert p.channel_auth_valid(key="k", secret="s", socket_id="1.2", channel="presence-r", auth=auth["auth"],
                                channel_data=auth["channel_data"])
    assert not p.channel_auth_valid(key="k", secret="s", socket_id="1.3", channel="presence-r", auth=auth["auth"],
                                    channel_data=auth["channel_data"])
    assert not p.channel_auth_valid(key="k", secret="other", socket_id="1.2", channel="presence-r",
                                    auth=auth["auth"], channel_data=auth["channel_data"])
    assert not p.channel_auth_valid(key="k", secret="s", socket_id="1.2", channel="presence-r", auth=None)


def test_an_event_round_trips_through_a_channel_message_and_native_content_is_the_message_event():
    content = p.envelope("OrderShipped", '{"id":1}', socket_id="1.2", user_id="u")
    assert p.envelope_read(content) == p.Event(name="OrderShipped", data='{"id":1}', socket_id="1.2", user_id="u")
    assert p.envelope_read('{"event": "e", "data": {"a": 1}}').data == '{"a":1}'
    assert p.envelope_read("hello") == p.Event(name="message", data="hello")
    assert p.envelope_read('{"no": "event"}') == p.Event(name="message", data='{"no": "event"}')


def _app(**fields) -> AppSnapshot:
    base = dict(pk=1, app_name="ANZ", app_id="a", master_user_id="ANZ-1", auth_mode="none", auth_url="",
                auth_enabled=False, auth_timeout_ms=1, token_secret="", confirmation_enabled=True,
                max_content_bytes=1, max_group_recipients=1, rate_limit_per_second=1, rate_limit_burst=1,
                retention_days=1, max_delivery_attempts=1, client_subscriptions_allowed=False,
                deliveries_per_second=1, deliveries_burst=1, max_connections_per_user=1, allowed_origins=(),
                max_token_lifetime_seconds=1, api_rate_limit_per_second=1, api_rate_limit_burst=1,
                public_channel_patterns=(), distributions=(), pusher_key="k", pusher_secret="s", pusher_enabled=True)
    return AppSnapshot(**{**base, **fields})


def _signed(params: dict, method="GET", path="/apps/1/channels", secret="s") -> dict:
    signature = hmac.new(secret.encode(), string_to_sign(method, path, params).encode(), hashlib.sha256).hexdigest()
    return {**params, "auth_signature": signature}


def test_the_api_signature_covers_method_path_and_sorted_query():
    now = time.time()
    params = _signed({"auth_key": "k", "auth_timestamp": str(int(now)), "auth_version": "1.0", "info": "x"})
    assert api_request_check(app=_app(), method="GET", path="/apps/1/channels", params=params, body=b"",
                             grace_seconds=600, now=now) is None
    for changed in ({"method": "POST"}, {"path": "/apps/1/channels/x"}):
        args = {"method": "GET", "path": "/apps/1/channels", **changed}
        assert api_request_check(app=_app(), params=params, body=b"", grace_seconds=600, now=now, **args).status == 401
    assert api_request_check(app=_app(), method="GET", path="/apps/1/channels", params={**params, "info": "y"},
                             body=b"", grace_seconds=600, now=now).status == 401
    assert api_request_check(app=_app(), method="GET", path="/apps/1/channels", params=params, body=b"",
                             grace_seconds=600, now=now + 601).message.startswith("Timestamp expired")
    assert api_request_check(app=None, method="GET", path="/", params=params, body=b"", grace_seconds=600).status == 404
