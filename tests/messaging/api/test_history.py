"""A channel's history from an offset, paged by offset."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

pytestmark = pytest.mark.django_db


def test_history_is_read_in_offset_order_from_after_an_offset(api):
    for i in range(1, 8):
        api.publish("news", f"n{i}")
    assert [(h["offset"], h["content"]) for h in api.history("news", after=4)] == [(5, "n5"), (6, "n6"), (7, "n7")]
    assert [h["offset"] for h in api.history("news", limit=3)] == list(range(1, 8))  # three pages


def test_a_page_links_the_next_one_by_offset(http, api):
    for i in range(1, 6):
        api.publish("news", f"n{i}")
    page = http.get("/api/v1/channels/news/messages", params={"after": 1, "limit": 2}).json()
    assert page["channel"] == "news" and [h["offset"] for h in page["results"]] == [2, 3]
    assert page["next"].endswith("/api/v1/channels/news/messages?after=3&limit=2")
    last = http.get("/api/v1/channels/news/messages", params={"after": 3, "limit": 5}).json()
    assert [h["offset"] for h in last["results"]] == [4, 5] and last["next"] is None


def test_a_channel_never_published_to_has_an_empty_history(api):
    assert list(api.history("quiet")) == []


@pytest.mark.parametrize("params", [{"after": "-1"}, {"after": "x"}, {"limit": "0"}, {"limit": "1001"},
                                    {"after": "9" * 30}])
def test_bad_offsets_and_limits_are_a_400(http, params):
    response = http.get("/api/v1/channels/news/messages", params=params)
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"


def test_another_apps_history_is_out_of_reach(api, bnz_api):
    api.publish("news", "ANZ only")
    api.publish("@ANZ-1", "ANZ-1's news")
    assert list(bnz_api.history("news")) == []
    with pytest.raises(ApiError) as refused:
        list(bnz_api.history("@ANZ-1"))
    assert refused.value.status == 404
