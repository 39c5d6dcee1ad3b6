"""Sends from a server: to one user, to several, FAST, to a channel, and the push seed's publish."""

from __future__ import annotations

import json

import pytest
from switchboard_client import ApiError

from apps_registry.selectors import app_snapshots_clear
from messaging.channels import registry
from messaging.core.protocol import fast_frame
from messaging.models import ChannelMessage, Delivery, Message
from tests.messaging.api.fixtures import received

pytestmark = pytest.mark.django_db


def test_a_reliable_send_to_one_user_is_stored_before_it_is_answered(api):
    sent = api.send("ANZ-1002", "your order shipped", reference="order-7781")
    assert sent == {"id": sent["id"], "feature": "RELIABLE", "from": "ANZ-123223", "recipients": ["ANZ-1002"],
                    "deliveries": 1}
    message = Message.objects.get(pk=int(sent["id"]))
    assert (message.kind, message.sender, message.content, message.reference) == (
        "direct", "ANZ-123223", "your order shipped", "order-7781")
    assert list(message.deliveries.values_list("recipient", "seq", "state")) == [("ANZ-1002", 1, "pending")]


def test_a_send_may_name_its_sender_and_ask_for_a_confirmation(api):
    sent = api.send("ANZ-1002", "hi", sender="ANZ-1001", reference="r-1", confirmation=True)
    message = Message.objects.get(pk=int(sent["id"]))
    assert (sent["from"], message.sender, message.confirmation_requested) == ("ANZ-1001", "ANZ-1001", True)


def test_a_send_to_several_users_is_one_group_message_with_a_delivery_each(api):
    sent = api.send(["ANZ-1", "ANZ-2", "ANZ-1", "ANZ-3"], "hello all")
    assert sent["recipients"] == ["ANZ-1", "ANZ-2", "ANZ-3"] and sent["deliveries"] == 3
    message = Message.objects.get(pk=int(sent["id"]))
    assert message.kind == "group"
    assert sorted(message.deliveries.values_list("recipient", flat=True)) == ["ANZ-1", "ANZ-2", "ANZ-3"]


def test_a_fast_send_reaches_live_connections_and_is_never_stored(api, live_connection):
    first, second = live_connection("ANZ-5001"), live_connection("ANZ-5001")
    sent = api.send(["ANZ-5001", "ANZ-5002"], "typing…", feature="FAST", reference="t-1")
    assert sent == {"feature": "FAST", "from": "ANZ-123223", "recipients": ["ANZ-5001", "ANZ-5002"],
                    "connections": 2}
    frame = fast_frame(sender="ANZ-123223", content="typing…", reference="t-1")
    assert received(first) == received(second) == {"type": "message.fast", "frame": frame}
    assert not Message.objects.exists() and not Delivery.objects.exists()


def test_a_fast_send_to_someone_offline_reaches_nobody(api):
    assert api.send("ANZ-5003", "anyone?", feature="FAST")["connections"] == 0


@pytest.mark.parametrize("to, code, status", [
    ("BNZ-1", "unknown_user", 404),  # another app's user
    ("ANZ-01", "unknown_user", 404),  # not a user id
    ("anz-1", "unknown_user", 404),
    ("ANZ-123456789012345678901", "unknown_user", 404),
    (["ANZ-1", "BNZ-2"], "unknown_user", 404),
    (["ANZ-1", "ANZ-2", "ANZ-3", "ANZ-4", "ANZ-5", "ANZ-6"], "too_many_recipients", 400),  # the app allows 5
    ([], "invalid_request", 400),
])
def test_recipients_are_checked_as_for_a_client(api, bnz, to, code, status):
    with pytest.raises(ApiError) as refused:
        api.send(to, "x")
    assert (refused.value.status, refused.value.code) == (status, code)
    assert not Message.objects.exists()


def test_a_sender_of_another_app_is_refused(api, bnz):
    with pytest.raises(ApiError) as refused:
        api.send("ANZ-1", "x", sender="BNZ-1")
    assert (refused.value.status, refused.value.code) == (404, "unknown_user")


def test_content_over_the_app_limit_is_refused_with_the_limit(api, anz):
    anz.max_content_bytes = 10
    anz.save()
    app_snapshots_clear()
    assert api.send("ANZ-1", "é" * 5)["deliveries"] == 1  # ten bytes in UTF-8
    with pytest.raises(ApiError) as refused:
        api.send("ANZ-1", "é" * 6)
    assert (refused.value.status, refused.value.code, refused.value.body["limit"]) == (413, "content_too_large", 10)
    with pytest.raises(ApiError) as refused:
        api.publish("news", "x" * 11)
    assert refused.value.code == "content_too_large"


def test_a_reference_longer_than_a_client_may_send_is_refused(http):
    response = http.post("/api/v1/messages", json={"to": "ANZ-1", "content": "x", "reference": "r" * 257})
    assert response.status_code == 400 and "reference" in response.json()["fields"]


def test_a_reliable_send_costs_one_statement(http, django_assert_max_num_queries):
    http.get("/api/v1/users/ANZ-1/presence")  # the key is verified once per process
    with django_assert_max_num_queries(1):
        assert http.post("/api/v1/messages", json={"to": ["ANZ-1", "ANZ-2", "ANZ-3"], "content": "x"}).status_code == 201


def test_a_channel_publish_takes_the_next_offset_and_answers_the_live_readers(api, anz, redis_client,
                                                                               django_capture_on_commit_callbacks):
    redis_client.hset(f"sb:cs:{anz.pk}:news", mapping={"node-a": 2, "node-b": 1})
    try:
        with django_capture_on_commit_callbacks(execute=True):
            first = api.publish("news", "one")
        second = api.publish("news", "two")
    finally:
        redis_client.delete(f"sb:cs:{anz.pk}:news")
    assert first == {"channel": "news", "offset": 1, "subscribers": 3}
    assert second["offset"] == 2
    assert list(ChannelMessage.objects.order_by("offset").values_list("offset", "content")) == [(1, "one"), (2, "two")]


def test_a_publish_fans_out_only_once_committed(api, anz, redis_client, django_capture_on_commit_callbacks):
    pubsub = redis_client.pubsub()
    pubsub.subscribe(registry.fanout_key(anz.pk, "news"))
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        api.publish("news", "later")
    assert pubsub.get_message(timeout=0.2) is None  # not committed: nothing went out
    for callback in callbacks:
        callback()
    published = pubsub.get_message(timeout=2)
    pubsub.close()
    assert json.loads(published["data"]) == {"o": 1, "c": "later"}


@pytest.mark.parametrize("channel, code, status", [
    ("bad name", "invalid_channel", 400),
    ("x" * 129, "invalid_channel", 400),
    ("@BNZ-1", "unknown_channel", 404),  # another app's user channel
    ("@nobody", "unknown_channel", 404),
])
def test_channel_names_are_checked(api, bnz, channel, code, status):
    with pytest.raises(ApiError) as refused:
        api.publish(channel, "x")
    assert (refused.value.status, refused.value.code) == (status, code)


def test_a_user_channel_of_the_app_takes_publishes(api):
    assert api.publish("@ANZ-7", "for ANZ-7's followers")["offset"] == 1


# --- the push seed's POST /messages ----------------------------------------------------------------


def test_push_publish_answers_202_with_the_subscribers_reached(http, anz, redis_client):
    redis_client.hset(f"sb:cs:{anz.pk}:qwerty", "node-a", 4)
    try:
        response = http.post("/messages", json={"channel": "qwerty", "message": "a message to channel qwerty"})
    finally:
        redis_client.delete(f"sb:cs:{anz.pk}:qwerty")
    assert response.status_code == 202 and response.json() == {"subscribers": 4}


def test_push_publish_of_a_non_string_message_delivers_its_json_text(api):
    assert api.push_publish("prices", {"sku": 7, "price": 9.5, "tags": ["a"]}) == 0
    assert api.push_publish("prices", 42) == 0
    assert list(ChannelMessage.objects.order_by("offset").values_list("content", flat=True)) == [
        '{"sku":7,"price":9.5,"tags":["a"]}', "42"]


def test_push_publish_needs_a_channel_and_a_message(http):
    assert http.post("/messages", json={"message": "x"}).json()["error"] == "invalid_request"
    assert http.post("/messages", json={"channel": "qwerty"}).status_code == 400
    assert http.post("/messages", json={"channel": "@BNZ-1", "message": "x"}).status_code == 404
