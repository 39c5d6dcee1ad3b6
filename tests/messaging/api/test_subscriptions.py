"""Subscriptions a server manages: user to channel and user to user, per app."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

from messaging.models import Subscription
from tests.messaging.api.fixtures import received

pytestmark = pytest.mark.django_db


def test_a_user_is_subscribed_once_and_listed_both_ways(api):
    assert api.subscribe("news", "ANZ-1") == {"user_id": "ANZ-1", "channel": "news", "created": True}
    assert api.subscribe("news", "ANZ-1")["created"] is False
    api.subscribe("news", "ANZ-2")
    api.subscribe("sports", "ANZ-1")
    assert [s["channel"] for s in api.subscriptions("ANZ-1")] == ["news", "sports"]
    assert [s["user_id"] for s in api.subscribers("news")] == ["ANZ-1", "ANZ-2"]


def test_unsubscribing_ends_it_and_a_second_time_is_a_404(api):
    api.subscribe("news", "ANZ-1")
    api.unsubscribe("news", "ANZ-1")
    assert list(api.subscribers("news")) == []
    with pytest.raises(ApiError) as refused:
        api.unsubscribe("news", "ANZ-1")
    assert refused.value.status == 404


def test_following_a_user_is_subscribing_to_its_own_channel(api):
    assert api.follow("ANZ-1", "ANZ-2") == {"user_id": "ANZ-1", "channel": "@ANZ-2", "created": True}
    assert [s["user_id"] for s in api.subscribers("@ANZ-2")] == ["ANZ-1"]
    api.unfollow("ANZ-1", "ANZ-2")
    assert not Subscription.objects.exists()


def test_lists_page_with_cursors_without_skipping_or_repeating(api, http):
    for i in range(1, 8):
        api.subscribe("news", f"ANZ-{i}")
    first = http.get("/api/v1/channels/news/subscribers", params={"limit": 3}).json()
    assert [s["user_id"] for s in first["results"]] == ["ANZ-1", "ANZ-2", "ANZ-3"] and first["previous"] is None
    api.unsubscribe("news", "ANZ-2")  # rows going away between pages do not shift the next one
    second = http.get(first["next"]).json()
    assert [s["user_id"] for s in second["results"]] == ["ANZ-4", "ANZ-5", "ANZ-6"]
    assert [s["user_id"] for s in api.subscribers("news", limit=2)] == ["ANZ-1", "ANZ-3", "ANZ-4", "ANZ-5", "ANZ-6",
                                                                          "ANZ-7"]


def test_a_page_of_subscriptions_costs_one_query(http, api, django_assert_max_num_queries):
    for i in range(1, 30):
        api.subscribe(f"ch{i}", "ANZ-1")
    with django_assert_max_num_queries(1):
        assert len(http.get("/api/v1/users/ANZ-1/subscriptions").json()["results"]) == 29


def test_another_apps_users_and_user_channels_are_out_of_reach(api, bnz_api):
    api.subscribe("news", "ANZ-1")
    for call in (lambda: bnz_api.subscribe("news", "ANZ-1"), lambda: bnz_api.unsubscribe("news", "ANZ-1"),
                 lambda: list(bnz_api.subscriptions("ANZ-1")), lambda: bnz_api.follow("BNZ-1", "ANZ-1"),
                 lambda: bnz_api.follow("ANZ-1", "BNZ-1"), lambda: list(bnz_api.subscribers("@ANZ-1"))):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 404
    # Channel names are the app's own: BNZ's "news" is another channel, with none of ANZ's subscribers.
    assert list(bnz_api.subscribers("news")) == []
    assert [s["user_id"] for s in api.subscribers("news")] == ["ANZ-1"]


def test_subscribing_tells_the_users_live_connections_to_join(api, live_connection,
                                                              django_capture_on_commit_callbacks):
    channel = live_connection("ANZ-7001")
    with django_capture_on_commit_callbacks(execute=True):
        api.subscribe("news", "ANZ-7001")
    assert received(channel) == {"type": "channel.join", "channel": "news"}
    with django_capture_on_commit_callbacks(execute=True):
        api.unsubscribe("news", "ANZ-7001")
    assert received(channel) == {"type": "channel.leave", "channel": "news"}


def test_a_user_homed_in_another_domain_is_refused_by_name_and_nothing_is_kept_here(api, http):
    # ANZ-9000001 lives in domain-09: its subscriptions are kept (and read by its connections) there.
    for method, path in [("PUT", "/api/v1/channels/news/subscribers/ANZ-9000001"),
                         ("DELETE", "/api/v1/channels/news/subscribers/ANZ-9000001"),
                         ("GET", "/api/v1/users/ANZ-9000001/subscriptions"),
                         ("PUT", "/api/v1/users/ANZ-9000001/follows/ANZ-2"),
                         ("DELETE", "/api/v1/users/ANZ-9000001/follows/ANZ-2")]:
        answer = http.request(method, path)
        assert answer.status_code == 421, (method, path, answer.text)
        assert answer.json()["error"] == "homed_elsewhere" and answer.json()["domain"] == "domain-09"
        assert "ANZ-9000001 lives in domain-09" in answer.json()["detail"]
    assert not Subscription.objects.exists()
    # Following a user homed elsewhere is the follower's business, kept at the follower's home: fine.
    assert api.follow("ANZ-1", "ANZ-9000001")["created"] is True
