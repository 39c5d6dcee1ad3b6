"""Idempotency-Key: a retried send is answered the same and sends nothing again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from switchboard_client import ApiError

from messaging.core.idempotency import idempotency_keys_expire
from messaging.models import ChannelMessage, IdempotencyKey, Message
from tests.messaging.api.fixtures import received

pytestmark = pytest.mark.django_db


def _send(http, key: str, body: dict, path: str = "/api/v1/messages"):
    return http.post(path, json=body, headers={"Idempotency-Key": key})


def test_a_retry_with_the_same_key_and_body_gets_the_same_answer_and_no_second_message(http):
    body = {"to": "ANZ-1", "content": "charge card 4242", "reference": "inv-9"}
    first = _send(http, "inv-9-attempt", body)
    again = _send(http, "inv-9-attempt", {"reference": "inv-9", "content": "charge card 4242", "to": "ANZ-1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert Message.objects.count() == 1


def test_the_same_key_with_another_body_is_a_409(http):
    assert _send(http, "k-1", {"to": "ANZ-1", "content": "a"}).status_code == 201
    conflict = _send(http, "k-1", {"to": "ANZ-1", "content": "b"})
    assert conflict.status_code == 409 and conflict.json()["error"] == "idempotency_key_reused"
    elsewhere = _send(http, "k-1", {"content": "a"}, path="/api/v1/channels/news/messages")
    assert elsewhere.status_code == 409
    assert Message.objects.count() == 1 and not ChannelMessage.objects.exists()


def test_a_send_that_failed_leaves_its_key_unused(http):
    assert _send(http, "k-2", {"to": "BNZ-1", "content": "a"}).status_code == 404
    assert not IdempotencyKey.objects.exists()
    assert _send(http, "k-2", {"to": "ANZ-2", "content": "a"}).status_code == 201


def test_keys_belong_to_one_app(api, bnz_api):
    ours = api.send("ANZ-1", "x", idempotency_key="shared-key")
    theirs = bnz_api.send("BNZ-1", "x", idempotency_key="shared-key")
    assert ours["id"] != theirs["id"] and Message.objects.count() == 2


def test_a_channel_publish_and_a_fast_send_are_idempotent_too(api, live_connection):
    assert api.publish("news", "once", idempotency_key="p-1") == api.publish("news", "once", idempotency_key="p-1")
    assert ChannelMessage.objects.count() == 1
    channel = live_connection("ANZ-6001")
    first = api.send("ANZ-6001", "blink", feature="FAST", idempotency_key="f-1")
    again = api.send("ANZ-6001", "blink", feature="FAST", idempotency_key="f-1")
    assert first == again and first["connections"] == 1
    received(channel)
    with pytest.raises(TimeoutError):
        received(channel, timeout=0.5)  # pushed once


def test_a_push_publish_is_idempotent(http):
    body = {"channel": "qwerty", "message": "m"}
    assert _send(http, "push-1", body, "/messages").json() == _send(http, "push-1", body, "/messages").json()
    assert ChannelMessage.objects.count() == 1


@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "tab\there"])
def test_a_key_a_header_cannot_carry_safely_is_refused(http, key):
    response = _send(http, key, {"to": "ANZ-1", "content": "x"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_request"
    assert not Message.objects.exists()


def test_a_keyed_send_costs_a_claim_and_an_answer_beside_the_send(http, django_assert_max_num_queries):
    http.get("/api/v1/users/ANZ-1/presence")
    with django_assert_max_num_queries(5):  # savepoint, claim, send, answer, release
        assert _send(http, "q-1", {"to": "ANZ-1", "content": "x"}).status_code == 201


def test_keys_are_dropped_after_their_lifetime(http, anz):
    _send(http, "old", {"to": "ANZ-1", "content": "x"})
    _send(http, "new", {"to": "ANZ-1", "content": "y"})
    IdempotencyKey.objects.filter(key="old").update(
        created_at=timezone.now() - timedelta(hours=settings.API_IDEMPOTENCY_HOURS, minutes=1))
    assert idempotency_keys_expire() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]
    # Once dropped, the key is free: the same request sends again.
    assert _send(http, "old", {"to": "ANZ-1", "content": "x"}).status_code == 201
    assert Message.objects.count() == 3


def test_beat_drops_expired_keys_every_hour():
    entry = settings.CELERY_BEAT_SCHEDULE["expire-idempotency-keys"]
    assert entry == {"task": "messaging.tasks.expire_idempotency_keys", "schedule": 3600.0}


def test_the_client_makes_up_a_key_per_send(api):
    api.send("ANZ-1", "x")
    api.send("ANZ-1", "x")
    assert IdempotencyKey.objects.count() == 2 and Message.objects.count() == 2


def test_errors_do_not_hide_behind_a_replay(api):
    with pytest.raises(ApiError):
        api.send("ANZ-1", "x", sender="BNZ-1", idempotency_key="e-1")
    assert api.send("ANZ-1", "x", idempotency_key="e-1")["deliveries"] == 1
