"""The node's intake stores a server's sends under their idempotency keys in the same transaction as
the batch's messages (messaging.intake.group_commit.KeyedSend), and the REST send on the event loop takes its
rate-limit tokens for a whole turn of the loop at once (messaging.intake.throttling)."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from django.db import OperationalError

from messaging.core.idempotency import IdempotencyConflict
from messaging.core.store import OutgoingMessage, SendResult
from messaging.intake import group_commit
from messaging.intake.group_commit import Intake, KeyedSend, Replayed
from messaging.intake.throttling import KEY, Bucket, rate_limit_take_many
from messaging.models import IdempotencyKey, Message

pytestmark = pytest.mark.django_db


def _message(app, content: str, to: str = "ANZ-5001") -> OutgoingMessage:
    return OutgoingMessage(app_id=app.pk, sender=app.master_user_id, recipients=(to,), content=content)


def _keyed(app, key: str, content: str) -> KeyedSend:
    return KeyedSend(_message(app, content), key, f"fingerprint of {content}",
                     {"feature": "RELIABLE", "from": app.master_user_id, "recipients": ["ANZ-5001"], "deliveries": 1})


@pytest.fixture
def intake():
    routed: list[int] = []
    intake = Intake(route=routed.extend)
    intake.routed = routed
    return intake


def test_a_batch_of_keyed_and_plain_sends_stores_each_once_and_keeps_the_answers(anz, intake):
    results = intake._store([_keyed(anz, "k-1", "one"), _message(anz, "plain"), _keyed(anz, "k-2", "two")])
    assert all(isinstance(r, SendResult) for r in results)
    stored = IdempotencyKey.objects.get(app=anz, key="k-1")
    assert stored.status_code == 201 and stored.response["id"] == str(results[0].message_id)
    assert stored.response["recipients"] == ["ANZ-5001"]
    assert Message.objects.filter(app=anz).count() == 3


def test_a_key_seen_before_replays_its_answer_and_stores_nothing(anz, intake):
    first = intake._store([_keyed(anz, "k-1", "one")])[0]
    again = intake._store([_keyed(anz, "k-1", "one")])[0]
    assert isinstance(again, Replayed) and again.status == 201
    assert again.body["id"] == str(first.message_id)
    assert Message.objects.filter(app=anz).count() == 1


def test_a_key_used_for_another_request_is_a_conflict_for_that_send_only(anz, intake):
    intake._store([_keyed(anz, "k-1", "one")])
    conflict, fine = intake._store([_keyed(anz, "k-1", "other"), _keyed(anz, "k-3", "three")])
    assert isinstance(conflict, IdempotencyConflict) and conflict.code == "idempotency_key_reused"
    assert isinstance(fine, SendResult)
    assert sorted(Message.objects.filter(app=anz).values_list("content", flat=True)) == ["one", "three"]


def test_one_key_twice_in_a_batch_is_one_message_and_the_second_place_replays_it(anz, intake):
    first, second, other = intake._store([_keyed(anz, "k-1", "one"), _keyed(anz, "k-1", "one"),
                                          _keyed(anz, "k-1", "not the same")])
    assert isinstance(first, SendResult)
    assert isinstance(second, Replayed) and second.body["id"] == str(first.message_id)
    assert isinstance(other, IdempotencyConflict)
    assert Message.objects.filter(app=anz).count() == 1


def test_the_same_key_in_two_apps_is_two_keys(anz, bnz, intake):
    a = intake._store([_keyed(anz, "k-1", "one")])[0]
    b = intake._store([KeyedSend(_message(bnz, "one", to="BNZ-7"), "k-1", "fingerprint of one", {})])[0]
    assert isinstance(a, SendResult) and isinstance(b, SendResult)


def test_rate_limit_tokens_for_a_turn_of_the_loop_go_to_the_first_requests(redis_client):
    buckets = [Bucket(987650, 1.0, 3)] * 5 + [Bucket(987651, 1.0, 10)]
    waits = asyncio.run(rate_limit_take_many(buckets))
    assert waits[:3] == [0.0, 0.0, 0.0] and all(0 < w <= 1.0 for w in waits[3:5]) and waits[5] == 0.0
    redis_client.delete(KEY.format(app_pk=987650), KEY.format(app_pk=987651))


@pytest.mark.django_db(transaction=True)
def test_a_batch_on_a_connection_postgres_dropped_while_it_was_idle_is_stored(anz, intake):
    """A restarted Postgres leaves the pooled threads' idle connections dead: the next batch on one
    checks it first (it was idle past INTAKE_IDLE_CHECK_SECONDS) and connects again, instead of
    failing every sender in the batch."""
    from django.db import connection

    from messaging.intake import group_commit as intake_module

    intake._store([_message(anz, "before")])
    backend = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    intake_module._thread.used = time.monotonic() - 60  # idle a minute
    result = intake._store([_message(anz, "after")])[0]
    assert isinstance(result, SendResult)
    assert connection.connection.info.backend_pid != backend
    assert sorted(Message.objects.filter(app=anz).values_list("content", flat=True)) == ["after", "before"]


def test_a_batch_that_a_deadlock_ended_is_stored_again_whole_and_once(anz, intake, monkeypatch, caplog):
    real, calls = group_commit.messages_store, []

    def store_once_a_deadlocks_victim(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:  # as Postgres ends a deadlock: the statement rolled back, nothing stored
            raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected("deadlock detected")
        return real(**kwargs)

    monkeypatch.setattr(group_commit, "messages_store", store_once_a_deadlocks_victim)
    results = intake._store([_message(anz, "first"), _message(anz, "second")])
    assert [type(r) for r in results] == [SendResult, SendResult]  # no GENERAL_ERROR for either sender
    assert sorted(Message.objects.filter(app=anz).values_list("content", flat=True)) == ["first", "second"]
    assert len(calls) == 2 and "deadlock" in caplog.text


def test_a_batch_that_fails_for_another_operational_reason_is_not_stored_again(anz, intake, monkeypatch):
    calls = []

    def store_with_the_server_gone(**kwargs):
        calls.append(kwargs)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(group_commit, "messages_store", store_with_the_server_gone)
    with pytest.raises(OperationalError):
        intake._store([_message(anz, "lost connection")])
    assert len(calls) == 1
