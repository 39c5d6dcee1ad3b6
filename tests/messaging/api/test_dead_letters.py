"""Dead letters through the API: list newest first, re-queue, discard; one app's own only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging.models import Delivery

pytestmark = pytest.mark.django_db


def _dead(api, recipients: list[str], content: str = "x") -> list[int]:
    """Messages whose deliveries used up their attempts, one second apart, oldest first."""
    sent = api.send(recipients, content)
    rows = list(Delivery.objects.filter(message_id=int(sent["id"])).order_by("recipient"))
    base = timezone.now() - timedelta(hours=1)
    for row in rows:
        Delivery.objects.filter(pk=row.pk).update(state="dead", attempts=3, last_error="not confirmed in time",
                                                  dead_at=base + timedelta(seconds=row.pk))
    return [row.pk for row in rows]


def test_dead_letters_are_listed_newest_first_with_their_record(api):
    ids = _dead(api, ["ANZ-1", "ANZ-2", "ANZ-3"])
    listed = list(api.dead_letters(limit=2))
    assert [d["id"] for d in listed] == ids[::-1]
    newest = listed[0]
    assert (newest["recipient"], newest["from"], newest["attempts"], newest["last_error"], newest["kind"]) == (
        "ANZ-3", "ANZ-123223", 3, "not confirmed in time", "group")


def test_requeued_dead_letters_get_fresh_attempts(api):
    ids = _dead(api, ["ANZ-1", "ANZ-2"])
    assert api.requeue(ids[:1]) == 1
    assert api.requeue(ids[:1]) == 0  # no longer dead
    row = Delivery.objects.get(pk=ids[0])
    assert (row.state, row.attempts, row.dead_at) == ("pending", 0, None)
    assert [d["id"] for d in api.dead_letters()] == ids[1:]


def test_discarded_dead_letters_leave_the_queue_as_expired(api):
    ids = _dead(api, ["ANZ-1"])
    assert api.discard(ids) == 1
    assert Delivery.objects.get(pk=ids[0]).state == "expired"
    assert list(api.dead_letters()) == []


def test_a_page_of_dead_letters_costs_one_query(http, api, django_assert_max_num_queries):
    _dead(api, [f"ANZ-{i}" for i in range(1, 6)])
    with django_assert_max_num_queries(1):
        assert len(http.get("/api/v1/dead-letters").json()["results"]) == 5


def test_another_apps_dead_letters_are_out_of_reach(api, bnz_api):
    ids = _dead(api, ["ANZ-1", "ANZ-2"])
    assert list(bnz_api.dead_letters()) == []
    assert bnz_api.requeue(ids) == 0 and bnz_api.discard(ids) == 0
    assert set(Delivery.objects.values_list("state", flat=True)) == {"dead"}


@pytest.mark.parametrize("body", [{}, {"ids": []}, {"ids": ["x"]}, {"ids": [0]}, {"ids": [2**63]},
                                  {"ids": list(range(1, 1002))}])
def test_ids_must_be_a_short_list_of_ids(http, body):
    response = http.post("/api/v1/dead-letters/requeue", json=body)
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"
