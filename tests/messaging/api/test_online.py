"""The app's online users through the API: `GET /api/v1/presence/online`, paged by a cursor."""

from __future__ import annotations

import base64

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_presence(redis_client):
    redis_client.flushdb()


def test_the_users_connected_now_are_listed_in_user_id_order(api, live_connection):
    for user in ("ANZ-8503", "ANZ-8501", "ANZ-8502", "ANZ-8502"):
        live_connection(user)
    assert api.online_users() == ["ANZ-8501", "ANZ-8502", "ANZ-8503"]


def test_a_walk_through_small_pages_lists_each_user_once_and_ends(http, live_connection):
    for i in range(7):
        live_connection(f"ANZ-86{i:02d}")
    page = http.get("/api/v1/presence/online", params={"limit": 3}).json()
    users = list(page["results"])
    assert page["count"] == 7 and len(users) == 3 and page["previous"] is None
    while page["next"]:
        page = http.get(page["next"]).json()
        users += page["results"]
    assert users == [f"ANZ-86{i:02d}" for i in range(7)]


def test_nobody_online_is_an_empty_last_page(http):
    assert http.get("/api/v1/presence/online").json() == {"count": 0, "results": [], "next": None, "previous": None}


def test_another_apps_users_are_not_listed(api, bnz_api, live_connection):
    live_connection("ANZ-8701")
    live_connection("BNZ-8701")
    assert api.online_users() == ["ANZ-8701"]
    assert bnz_api.online_users() == ["BNZ-8701"]


def _cursor(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": "1001"}, {"limit": "ten"}, {"limit": "1e3"}, {"limit": "9" * 5000},
    {"cursor": "not base64!"}, {"cursor": "@@@"}, {"cursor": _cursor("BNZ-1")}, {"cursor": _cursor("ANZ-01")},
    {"cursor": _cursor("ANZ")}, {"cursor": base64.b64encode(b"\xff\xfe").decode()}, {"cursor": "QU5aLTE"},
])
def test_a_bad_cursor_or_limit_is_a_400_never_a_500(http, params):
    answer = http.get("/api/v1/presence/online", params=params)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request"


def test_a_cursor_of_a_user_who_went_offline_still_continues_after_it(http, live_connection):
    for user in ("ANZ-1", "ANZ-2", "ANZ-3"):
        live_connection(user)
    page = http.get("/api/v1/presence/online", params={"cursor": _cursor("ANZ-15")}).json()
    assert page["results"] == ["ANZ-2", "ANZ-3"] and page["next"] is None
