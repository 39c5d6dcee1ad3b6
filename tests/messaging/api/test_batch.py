"""POST /api/v1/messages/batch: up to 1,000 messages a call, each accepted or refused on its own,
stored together, and sent once per idempotency key however often the batch is retried."""

from __future__ import annotations

import pytest
from switchboard_client import ApiError

from messaging.models import Delivery, Message

pytestmark = pytest.mark.django_db


def test_a_batch_answers_each_message_in_order_and_refuses_only_the_bad_ones(api):
    results = api.send_batch([
        {"to": "ANZ-2001", "content": "one"},
        {"to": "BNZ-5", "content": "another app's user"},
        {"to": ["ANZ-2002", "ANZ-2003"], "content": "a group"},
        {"content": "no recipient"},
        {"to": "ANZ-2004", "content": "fast", "feature": "FAST"},
        {"to": "ANZ-2005", "content": "x" * 70_000},  # over the app's content limit
    ])
    assert results[0] == {"id": results[0]["id"]} and results[2] == {"id": results[2]["id"]}
    assert results[1]["error"] == "unknown_user"
    assert results[3]["error"] == "invalid_request" and "to" in results[3]["detail"]
    assert results[4] == {"id": None, "feature": "FAST", "connections": 0}
    assert results[5]["error"] == "content_too_large"
    assert Message.objects.get(pk=int(results[0]["id"])).content == "one"
    assert sorted(Delivery.objects.filter(message_id=int(results[2]["id"])).values_list("recipient", flat=True)) == [
        "ANZ-2002", "ANZ-2003"]
    assert Message.objects.count() == 2  # the refused and the FAST ones were not stored


def test_a_batch_retried_with_its_idempotency_keys_sends_nothing_twice(api):
    batch = [{"to": "ANZ-2011", "content": f"m-{i}", "idempotencyKey": f"order-{i}"} for i in range(5)]
    first = api.send_batch(batch)
    again = api.send_batch(batch + [{"to": "ANZ-2011", "content": "m-5", "idempotencyKey": "order-5"}])
    assert again[:5] == first
    assert "id" in again[5] and again[5] not in first
    assert Message.objects.count() == 6


def test_a_key_used_for_another_message_is_refused_for_that_message_only(api):
    api.send_batch([{"to": "ANZ-2021", "content": "first", "idempotencyKey": "k-1"}])
    results = api.send_batch([{"to": "ANZ-2021", "content": "changed", "idempotencyKey": "k-1"},
                              {"to": "ANZ-2021", "content": "fine"}])
    assert results[0]["error"] == "idempotency_key_reused" and "id" in results[1]
    assert sorted(Message.objects.values_list("content", flat=True)) == ["fine", "first"]


def test_one_key_twice_in_a_batch_is_one_message_answered_twice(api):
    same = {"to": "ANZ-2031", "content": "once", "idempotencyKey": "dup"}
    results = api.send_batch([same, same, {**same, "content": "other"}])
    assert results[0] == results[1] and "id" in results[0]
    assert results[2]["error"] == "idempotency_key_reused"
    assert Message.objects.count() == 1


def test_a_batch_of_1000_is_stored_in_one_go_and_1001_is_refused(api):
    results = api.send_batch([{"to": f"ANZ-{3000 + i % 50}", "content": f"n-{i}"} for i in range(1000)])
    assert len(results) == 1000 and all("id" in r for r in results)
    assert len({r["id"] for r in results}) == 1000
    assert Delivery.objects.count() == 1000
    with pytest.raises(ApiError) as refused:
        api.send_batch([{"to": "ANZ-1", "content": "x"}] * 1001)
    assert refused.value.status == 400


def test_each_recipients_messages_of_a_batch_are_in_its_mailbox_in_batch_order(api):
    api.send_batch([{"to": "ANZ-2041", "content": f"n-{i}"} for i in range(20)])
    assert list(Delivery.objects.filter(recipient="ANZ-2041").order_by("seq").values_list(
        "message__content", flat=True)) == [f"n-{i}" for i in range(20)]
