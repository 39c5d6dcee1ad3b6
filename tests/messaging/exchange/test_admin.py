"""The console's read-only pages of the event exchange: the follow graph and each app's state."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from messaging.exchange.models import ExchangeState, Follow
from tests.factories import make_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def graph():
    anz, bnz = make_app(), make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    Follow.objects.create(app=anz, follower=32, followee=56)
    Follow.objects.create(app=anz, follower=56, followee=7)
    Follow.objects.create(app=bnz, follower=4444, followee=32)
    return anz, bnz


def rows(page) -> int:
    return page.content.decode().count('class="field-follower"') if page.status_code == 200 else -1


def test_follows_are_searched_by_a_users_number_either_way_and_filtered_by_app(operator, graph):
    anz, bnz = graph
    assert rows(operator.get("/admin/messaging/follow/")) == 3
    assert rows(operator.get("/admin/messaging/follow/", {"q": "56"})) == 2
    assert rows(operator.get("/admin/messaging/follow/", {"q": "32", "app__id__exact": anz.pk})) == 1
    assert rows(operator.get("/admin/messaging/follow/", {"q": "not a number"})) == 0


def test_an_exchanges_state_shows_its_gap_and_what_it_gave_up(operator, graph):
    anz, _ = graph
    since = timezone.now() - datetime.timedelta(seconds=30)
    ExchangeState.objects.create(app=anz, applied_seq=41, gap_seq=42, gap_since=since, held=7, skipped=3,
                                 malformed=2)
    page = operator.get("/admin/messaging/exchangestate/").content.decode()
    assert ">41<" in page and f"42, since {since:%Y-%m-%d %H:%M:%S}" in page and ">7<" in page


def test_nothing_of_the_exchange_can_be_added_or_changed_in_the_console(operator, graph):
    follow = Follow.objects.first()
    assert operator.get("/admin/messaging/follow/add/").status_code == 403
    operator.post(f"/admin/messaging/follow/{follow.pk}/change/", {"follower": 1, "followee": 2})
    operator.post(f"/admin/messaging/follow/{follow.pk}/delete/", {"post": "yes"})
    follow.refresh_from_db()
    assert (follow.follower, follow.followee) == (32, 56)
