"""EVENT frames for /ws users, in-process: stand-in sockets (channels of the Redis channel layer
registered as users' connections) receive what events_to_ws pushes after a committed batch."""

from __future__ import annotations

import json

import pytest

from messaging.exchange.models import Follow
from messaging.exchange.ws_bridge import events_to_ws, ws_listeners, ws_listeners_forget
from tests.messaging.api.fixtures import live_connection, received  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_answers(redis_client):
    redis_client.flushdb()  # no presence left by an earlier test's connections: who is online is this test's
    ws_listeners_forget()
    yield
    ws_listeners_forget()


def frames(channel: str, count: int) -> list[tuple[int, str, int | None, int | None]]:
    out = []
    for _ in range(count):
        event = received(channel)
        assert event["type"] == "exchange.events"
        for text in event["frames"]:
            frame = json.loads(text)
            assert frame["type"] == "EVENT"
            data = frame["data"]
            out.append((data["seq"], data["kind"], data["from"], data["to"]))
    return out


def nothing_for(channel: str) -> bool:
    try:
        received(channel, timeout=0.3)
    except TimeoutError:
        return True
    return False


def test_each_connected_user_gets_what_concerns_it_in_order(anz, live_connection):  # noqa: F811
    one, two, three = live_connection("ANZ-1"), live_connection("ANZ-2"), live_connection("ANZ-3")
    Follow.objects.create(app=anz, follower=1, followee=5)
    Follow.objects.create(app=anz, follower=3, followee=5)
    batch = [(1, "F", 2, 1), (2, "U", 1, 2), (3, "B", None, None), (4, "P", 1, 2), (5, "S", 5, None),
             (6, "P", 7, 99), (7, "S", 6, None)]
    assert events_to_ws(anz.pk, batch) == 7
    assert frames(one, 1) == [(1, "F", 2, 1), (3, "B", None, None), (5, "S", 5, None)]
    assert frames(two, 1) == [(3, "B", None, None), (4, "P", 1, 2)]
    assert frames(three, 1) == [(3, "B", None, None), (5, "S", 5, None)]


def test_a_status_goes_to_the_followers_as_of_that_event_within_the_batch(anz, live_connection):  # noqa: F811
    one, two = live_connection("ANZ-1"), live_connection("ANZ-2")
    Follow.objects.create(app=anz, follower=2, followee=5)  # the graph after the batch: only 2 follows 5
    batch = [(1, "S", 5, None), (2, "F", 2, 5), (3, "F", 1, 5), (4, "S", 5, None), (5, "U", 1, 5),
             (6, "S", 5, None)]
    events_to_ws(anz.pk, batch)
    assert frames(one, 1) == [(4, "S", 5, None)]
    assert frames(two, 1) == [(4, "S", 5, None), (6, "S", 5, None)]


def test_every_connection_of_a_user_gets_its_frames_and_other_apps_users_none(anz, bnz, live_connection):  # noqa: F811
    first, second, other = live_connection("ANZ-4"), live_connection("ANZ-4"), live_connection("BNZ-4")
    events_to_ws(anz.pk, [(10, "P", 1, 4), (11, "B", None, None)])
    expected = [(10, "P", 1, 4), (11, "B", None, None)]
    assert frames(first, 1) == expected and frames(second, 1) == expected
    assert nothing_for(other)


def test_an_unfollow_and_events_for_absent_users_reach_nobody(anz, live_connection):  # noqa: F811
    one = live_connection("ANZ-1")
    assert events_to_ws(anz.pk, [(1, "U", 2, 1), (2, "P", 1, 8), (3, "S", 9, None)]) == 0
    assert nothing_for(one)


def test_listeners_are_the_apps_connected_users_and_the_answer_is_reused_briefly(anz, bnz, live_connection,  # noqa: F811
                                                                                settings, django_assert_num_queries):
    settings.EXCHANGE_WS_LISTENERS_TTL_SECONDS = 60
    live_connection("BNZ-1")
    assert ws_listeners(anz.pk) is False and ws_listeners(bnz.pk) is True
    live_connection("ANZ-1")
    with django_assert_num_queries(0):
        assert ws_listeners(anz.pk) is False  # cached: no query, no Redis call, until the TTL
    settings.EXCHANGE_WS_LISTENERS_TTL_SECONDS = 0
    assert ws_listeners(anz.pk) is True
