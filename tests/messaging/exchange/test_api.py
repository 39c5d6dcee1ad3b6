"""The event exchange's server API: the REST intake of event lines and the follow graph's reads."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

from foundation.transport.redis_clients import sync_client
from messaging.exchange.models import Follow
from messaging.exchange.streams import intake_reader_key, intake_stream_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def intake(anz):
    """What the app's intake stream holds: one list of lines per call, oldest first."""
    key = intake_stream_key(anz.pk)
    sync_client().delete(key)

    def read() -> list[list[str]]:
        return [entry[b"lines"].decode().split("\n") for _, entry in sync_client().xrange(key)]

    yield read
    sync_client().delete(key)


def test_a_batch_of_event_lines_is_appended_to_the_apps_intake_stream(api, intake):
    answer = api.events_send(["666|F|60|50", "1|U|12|9", "542532|B", "43|P|32|56", "634|S|32"])
    assert answer["accepted"] == 5 and answer["stream"]
    api.events_send(["2|B"])
    assert intake() == [["666|F|60|50", "1|U|12|9", "542532|B", "43|P|32|56", "634|S|32"], ["2|B"]]


def test_a_retried_call_is_appended_again_and_left_to_the_engine_to_ignore_by_sequence(api, intake):
    api.events_send(["1|B"])
    api.events_send(["1|B"])
    assert intake() == [["1|B"], ["1|B"]]


@pytest.mark.parametrize("line", [
    "0|B", "-1|B", "x|B", "1|X", "1", "1|B|3", "1|F|60", "1|F|60|", "1|S", "1|S|32|1", "1|P|a|2", "1|P|1|2|3",
    "1|B\n", "1|B\r", " 1|B", "١|B", "1|U|" + "9" * 30 + "|1",
])
def test_a_malformed_line_refuses_the_whole_call_naming_its_index(api, intake, line):
    with pytest.raises(ApiError) as refused:
        api.events_send(["1|B", "2|P|1|2", line])
    assert refused.value.status == 400 and "events[2]" in refused.value.detail
    assert refused.value.body["index"] == 2
    assert intake() == []


def test_an_empty_batch_or_one_over_the_limit_is_refused(api, intake):
    for events in ([], ["1|B"] * 10_001):
        with pytest.raises(ApiError) as refused:
            api.events_send(events)
        assert refused.value.status == 400
    assert intake() == []


def test_the_intake_needs_a_key_of_the_app(anonymous_http, bnz_api, intake):
    assert anonymous_http.post("/api/v1/events", json={"events": ["1|B"]}).status_code == 401
    bnz_api.events_send(["1|B"])  # another app's key appends to that app's stream, never this one's
    assert intake() == []


@pytest.fixture
def graph(anz, bnz):
    """In ANZ: 1, 2 and 3 follow 9; 9 follows 1. In BNZ: 4 follows 9."""
    for follower, followee in [(1, 9), (2, 9), (3, 9), (9, 1)]:
        Follow.objects.create(app=anz, follower=follower, followee=followee)
    Follow.objects.create(app=bnz, follower=4, followee=9)


def test_a_users_followers_and_followees_are_listed_by_number(api, graph):
    assert [f["user"] for f in api.exchange_followers(9)] == [1, 2, 3]
    assert [f["user"] for f in api.exchange_followees(9)] == [1]
    assert list(api.exchange_followers(5)) == [] and list(api.exchange_followees(4)) == []


def test_graph_pages_follow_cursors_and_name_their_user(http, graph):
    first = http.get("/api/v1/exchange/users/9/followers", params={"limit": 2}).json()
    assert first["user"] == 9 and [f["user"] for f in first["results"]] == [1, 2] and first["previous"] is None
    second = http.get(first["next"]).json()
    assert [f["user"] for f in second["results"]] == [3] and second["next"] is None


def test_a_user_that_is_no_number_is_refused(http, graph):
    for path in ("/api/v1/exchange/users/ANZ-9/followers", "/api/v1/exchange/users/-1/followees",
                 "/api/v1/exchange/users/99999999999999999999/followers"):
        assert http.get(path).status_code == 400


@pytest.fixture
def small_intake(anz, settings):
    """An intake of 64 KiB while read, 16 KiB while not."""
    settings.EXCHANGE_INTAKE_MAX_BYTES = 64 * 1024
    settings.EXCHANGE_INTAKE_UNREAD_BYTES = 16 * 1024
    reader = intake_reader_key(anz.pk)
    sync_client().delete(reader)
    yield lambda: sync_client().set(reader, b"1", ex=10)
    sync_client().delete(reader)


def _fill(api, first: int) -> tuple[int, ApiError]:
    """Calls of 200 lines until one is refused: how many lines went in, and the refusal."""
    seq = first
    while True:
        try:
            api.events_send([f"{n}|B" for n in range(seq, seq + 200)])
        except ApiError as refused:
            return seq - first, refused
        seq += 200
        assert seq < first + 1_000_000, "never refused"


def test_with_no_eventsource_reading_the_intake_refuses_past_a_small_limit_and_drops_nothing(api, intake,
                                                                                              small_intake):
    taken, refused = _fill(api, 1)
    assert refused.status == 429 and refused.code == "intake_full" and "no eventsource" in refused.detail
    assert refused.retry_after == 30
    assert 0 < taken < 16 * 1024 // 4
    assert sum(len(lines) for lines in intake()) == taken  # every accepted line is still there


def test_with_an_eventsource_reading_the_intake_takes_up_to_its_limit_then_asks_to_wait(api, intake, small_intake):
    small_intake()  # an eventsource reads this app's intake
    taken, refused = _fill(api, 1)
    assert refused.status == 429 and refused.retry_after == 1 and "behind" in refused.detail
    assert taken > 16 * 1024 // 8  # more than while nothing read
    assert sum(len(lines) for lines in intake()) == taken
