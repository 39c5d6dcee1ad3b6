"""Presence through the API: who is online and where, a channel's connected members, disconnecting."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

from tests.messaging.api.fixtures import received

pytestmark = pytest.mark.django_db


def test_an_offline_user_is_offline_in_its_home_domain(api):
    assert api.presence("ANZ-8001") == {"user_id": "ANZ-8001", "domain": "domain-01", "online": False,
                                        "connections": 0}


def test_an_online_user_shows_its_connections(api, live_connection):
    live_connection("ANZ-8002")
    live_connection("ANZ-8002")
    assert api.presence("ANZ-8002") == {"user_id": "ANZ-8002", "domain": "domain-01", "online": True,
                                        "connections": 2}


def test_a_user_homed_in_another_domain_is_named_but_not_guessed_at(api):
    assert api.presence("ANZ-9000001") == {"user_id": "ANZ-9000001", "domain": "domain-09", "online": None,
                                           "connections": None}


def test_a_channels_members_are_its_subscribers_who_are_connected(api, anz, live_connection, redis_client):
    for user in ("ANZ-8101", "ANZ-8102", "ANZ-8103"):
        api.subscribe("lobby", user)
    live_connection("ANZ-8101")
    live_connection("ANZ-8103")
    live_connection("ANZ-8103")
    redis_client.hset(f"sb:cs:{anz.pk}:lobby", mapping={"node-a": 3, "node-b": 2})
    try:
        readers, members = api.channel_members("lobby")
    finally:
        redis_client.delete(f"sb:cs:{anz.pk}:lobby")
    assert readers == 5
    assert members == [{"user_id": "ANZ-8101", "connections": 1}, {"user_id": "ANZ-8103", "connections": 2}]


def test_a_page_of_members_costs_one_query(http, api, django_assert_max_num_queries):
    for i in range(20):
        api.subscribe("lobby", f"ANZ-{8200 + i}")
    with django_assert_max_num_queries(1):
        assert http.get("/api/v1/channels/lobby/members").json()["results"] == []


def test_disconnecting_a_user_closes_every_connection_with_1000(api, live_connection):
    first, second = live_connection("ANZ-8301"), live_connection("ANZ-8301")
    assert api.disconnect("ANZ-8301") == 2
    # (for good: a Socket.IO client is told DISCONNECT, and does not come back by itself)
    expected = {"type": "connection.close", "code": 1000, "reason": "closed by the app's server", "final": True}
    assert received(first) == received(second) == expected
    assert api.disconnect("ANZ-8302") == 0


def test_another_apps_users_and_channels_are_out_of_reach(api, bnz_api, live_connection):
    channel = live_connection("ANZ-8401")
    for call in (lambda: bnz_api.presence("ANZ-8401"), lambda: bnz_api.disconnect("ANZ-8401"),
                 lambda: bnz_api.channel_members("@ANZ-8401")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 404 and "connections" not in refused.value.body
    with pytest.raises(TimeoutError):
        received(channel, timeout=0.3)  # still connected, told nothing
    api.subscribe("lobby", "ANZ-8401")
    assert bnz_api.channel_members("lobby") == (0, [])  # BNZ's own "lobby"
