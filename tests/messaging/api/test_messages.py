"""A message's status: its per-recipient delivery record, for the app that sent it only."""

from __future__ import annotations

import pytest
from django.utils import timezone
from switchboard_client import ApiError

from messaging.models import Delivery

pytestmark = pytest.mark.django_db


def test_the_status_shows_each_recipients_delivery_record(api):
    sent = api.send(["ANZ-1", "ANZ-2"], "hello", reference="r")
    Delivery.objects.filter(recipient="ANZ-2").update(state="dead", attempts=3, dead_at=timezone.now(),
                                                      last_error="not confirmed in time")
    status = api.message(sent["id"])
    assert {k: status[k] for k in ("id", "kind", "from", "content", "reference")} == {
        "id": sent["id"], "kind": "group", "from": "ANZ-123223", "content": "hello", "reference": "r"}
    first, second = status["deliveries"]
    assert (first["recipient"], first["seq"], first["state"], first["attempts"]) == ("ANZ-1", 1, "pending", 0)
    assert (second["recipient"], second["state"], second["attempts"], second["last_error"]) == (
        "ANZ-2", "dead", 3, "not confirmed in time")
    assert second["dead_at"] and first["dead_at"] is None and first["created_at"]


def test_the_status_costs_two_queries_whatever_the_recipients(http, api, django_assert_max_num_queries):
    sent = api.send([f"ANZ-{i}" for i in range(1, 6)], "x")
    with django_assert_max_num_queries(2):
        assert len(http.get(f"/api/v1/messages/{sent['id']}").json()["deliveries"]) == 5


@pytest.mark.parametrize("message_id", ["0", "999999999", "9" * 30, "-1", "abc"])
def test_an_unknown_message_is_a_404(api, message_id):
    with pytest.raises(ApiError) as refused:
        api.message(message_id)
    assert (refused.value.status, refused.value.code) == (404, "not_found")


def test_another_apps_message_is_a_404_and_shows_nothing(api, bnz_api):
    theirs = bnz_api.send("BNZ-2", "secret of BNZ")
    with pytest.raises(ApiError) as refused:
        api.message(theirs["id"])
    assert refused.value.status == 404 and "secret" not in str(refused.value.body)
