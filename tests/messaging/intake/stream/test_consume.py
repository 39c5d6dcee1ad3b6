"""Entries of an app's intake stream consumed: stored for their recipients once, however often they
are processed; a malformed one dead-lettered with the reason a REST send would answer."""

from __future__ import annotations

import json
import time

import pytest
from django.conf import settings

from apps_registry.selectors import app_snapshots_clear
from foundation.transport.queue_names import GROUP, dead_key, intake_key, queue_redis_url
from foundation.transport.redis_clients import sync_client
from messaging.intake.stream.consume import queue_entries_consume
from messaging.intake.stream.reader import EntryReader
from messaging.intake.stream.runner import groups_ensure
from messaging.intake.throttling import KEY, rate_limit_take
from messaging.models import Delivery, Message
from tests.messaging.intake.stream.conftest import writer_for

pytestmark = pytest.mark.django_db


def read(client, app_name: str, consumer: str = "test", pending: bool = False):
    """What a consumer reads next (its own pending entries with `pending`), as the runner reads it."""
    groups_ensure(client, [app_name])
    reader = EntryReader(queue_redis_url())
    try:
        answer = reader.read(group=GROUP, consumer=consumer, streams=[(intake_key(app_name), "0" if pending else ">")],
                             count=1000)
    finally:
        reader.close()
    return [entry for _, entries in answer for entry in entries]


def consume(client, app_name: str, entries, capture):
    with capture(execute=True):
        return queue_entries_consume(client=client, app_name=app_name, entries=entries)


def test_a_send_put_on_the_stream_is_stored_for_its_recipient(anz, credential, queue_redis, handoff,
                                                              django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "your order shipped", "reference": "order-7781"})
    writer.xadd(intake_key("ANZ"), {"to": json.dumps(["ANZ-1003", "ANZ-1004"]), "content": "sale", "sender": "ANZ-9"})
    done = consume(queue_redis, "ANZ", read(queue_redis, "ANZ"), django_capture_on_commit_callbacks)
    assert (done.stored, done.dead, done.repeated) == (2, 0, 0)
    one = Delivery.objects.select_related("message").get(recipient="ANZ-1002")
    assert (one.message.content, one.message.reference, one.message.sender) == ("your order shipped", "order-7781",
                                                                                  "ANZ-123223")
    group = Message.objects.get(content="sale")
    assert (group.kind, group.sender) == ("group", "ANZ-9")
    assert sorted(group.deliveries.values_list("recipient", flat=True)) == ["ANZ-1003", "ANZ-1004"]
    assert len(handoff.tasks("messaging.tasks.route_deliveries")) == 1  # handed to routing once committed
    assert queue_redis.xlen(intake_key("ANZ")) == 0  # acknowledged and deleted
    assert queue_redis.xpending(intake_key("ANZ"), GROUP)["pending"] == 0


def test_an_entry_processed_twice_is_stored_and_routed_once(anz, credential, queue_redis, handoff,
                                                            django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    entry_id = writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "once"})
    entries = read(queue_redis, "ANZ")
    first = consume(queue_redis, "ANZ", entries, django_capture_on_commit_callbacks)
    # Named by its domain too: a message forwarded from another domain's queue (whose Redis gives
    # entry ids of its own) never passes for it.
    assert Message.objects.get(content="once").client_message_id == f"sbq:{settings.DOMAIN_NAME}:{entry_id.decode()}"
    handoff.clear()
    again = consume(queue_redis, "ANZ", entries, django_capture_on_commit_callbacks)  # as after a crash before XACK
    assert (first.stored, again.stored, again.repeated) == (1, 0, 1)
    assert Message.objects.filter(content="once").count() == 1
    assert Delivery.objects.filter(recipient="ANZ-1002").count() == 1
    assert handoff.tasks() == []  # nothing routed again


@pytest.mark.parametrize(("fields", "reason"), [
    ({"to": "ANZ-x", "content": "x"}, "unknown_user: recipient 'ANZ-x' is not a user of app ANZ"),
    ({"to": "BNZ-1", "content": "x"}, "unknown_user: recipient 'BNZ-1' is not a user of app ANZ"),
    ({"to": "ANZ-1002", "content": "x" * 70_000}, "content_too_large: "),
    ({"to": "ANZ-1002"}, "invalid_content: content must be a string"),
    ({"content": "x"}, "invalid_request: 'to' must be a user id or a non-empty JSON list of user ids"),
    ({"to": "[\"ANZ-1002\"", "content": "x"}, "invalid_request: 'to' must be"),
    ({"to": "[]", "content": "x"}, "invalid_request: 'to' must be"),
    ({"to": "ANZ-1002", "content": "x", "feature": "SLOW"}, "invalid_request: feature must be RELIABLE or FAST"),
    ({"to": "ANZ-1002", "content": "x", "sender": "BNZ-1"}, "unknown_user: sender 'BNZ-1'"),
    ({"to": "ANZ-1002", "content": "x", "priority": "high"}, "invalid_request: unknown field 'priority'"),
    ({"to": "ANZ-1002", "content": b"\xff\xfe"}, "invalid_request: fields must be UTF-8 text"),
    ({"to": json.dumps([f"ANZ-{n}" for n in range(6)]), "content": "x"}, "too_many_recipients: at most 5"),
])
def test_a_malformed_entry_is_dead_lettered_with_its_reason(anz, credential, queue_redis, fields, reason,
                                                           django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    entry_id = writer.xadd(intake_key("ANZ"), fields)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "the good one"})
    done = consume(queue_redis, "ANZ", read(queue_redis, "ANZ"), django_capture_on_commit_callbacks)
    assert (done.stored, done.dead) == (1, 1)
    [(_, dead)] = queue_redis.xrange(dead_key("ANZ"))
    assert dead[b"reason"].decode().startswith(reason)
    assert dead[b"entry"] == entry_id
    for name, value in fields.items():  # the original fields: whole where they fit a dead letter, else their start
        value = value if isinstance(value, bytes) else value.encode()
        assert value.startswith(dead[name.encode()]) and len(dead[name.encode()]) >= min(len(value), 3500)
    assert (b"truncated" in dead) == (len(fields.get("content", "")) > 4096)
    assert queue_redis.xlen(intake_key("ANZ")) == 0
    assert Message.objects.get().content == "the good one"


def test_an_entry_deleted_while_pending_is_only_acknowledged(anz, credential, queue_redis,
                                                             django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "gone"})
    read(queue_redis, "ANZ", consumer="died")
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "trims"}, maxlen=0, approximate=False)  # its own
    queue_redis.execute_command("XAUTOCLAIM", intake_key("ANZ"), GROUP, "test", 0, "0-0", "JUSTID")  # as the runner
    entries = read(queue_redis, "ANZ", consumer="test", pending=True)
    assert [fields for _, fields in entries] == [None]
    done = consume(queue_redis, "ANZ", entries, django_capture_on_commit_callbacks)
    assert done == type(done)()
    assert queue_redis.xpending(intake_key("ANZ"), GROUP)["pending"] == 0


def test_a_fast_entry_is_pushed_once_however_often_it_is_processed_and_leaves_no_key(
        anz, credential, queue_redis, django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    for n in range(3):
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": f"typing {n}", "feature": "FAST"})
    first = read(queue_redis, "ANZ", consumer="slow")
    # The slow consumer seems dead: another claims its entries and processes them.
    queue_redis.execute_command("XAUTOCLAIM", intake_key("ANZ"), GROUP, "other", 0, "0-0", "JUSTID")
    claimed = read(queue_redis, "ANZ", consumer="other", pending=True)
    done = consume(queue_redis, "ANZ", claimed, django_capture_on_commit_callbacks)
    late = consume(queue_redis, "ANZ", first, django_capture_on_commit_callbacks)  # the slow one wakes up
    again = consume(queue_redis, "ANZ", claimed, django_capture_on_commit_callbacks)  # as after a crash
    assert (done.pushed, late.pushed, again.pushed) == (3, 0, 0)
    assert (late.repeated, again.repeated) == (3, 3)
    assert not Message.objects.exists()  # FAST is never stored
    assert queue_redis.xlen(intake_key("ANZ")) == 0
    assert queue_redis.xpending(intake_key("ANZ"), GROUP)["pending"] == 0
    assert sorted(queue_redis.scan_iter(match="sbq:ANZ:*")) == [b"sbq:ANZ:in", b"sbq:ANZ:stats"]  # no marker left


@pytest.fixture
def limited(anz):
    """ANZ with a small API rate limit: 20 requests a second, a burst of 3."""
    anz.api_rate_limit_per_second, anz.api_rate_limit_burst = 20, 3
    anz.save()
    app_snapshots_clear()
    yield anz
    sync_client().delete(KEY.format(app_pk=anz.pk))


def test_entries_over_the_apps_rate_limit_wait_unacknowledged_and_are_stored_once_it_allows(
        limited, credential, queue_redis, django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(limited))
    for n in range(8):
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": f"queued {n}"})
    done = consume(queue_redis, "ANZ", read(queue_redis, "ANZ"), django_capture_on_commit_callbacks)
    assert Message.objects.count() == 3  # its burst
    assert (done.stored, done.waiting, done.dead) == (3, 5, 0)
    assert 0 < done.retry_after <= 1.0
    assert queue_redis.xpending(intake_key("ANZ"), GROUP)["pending"] == 5  # still there, still ours
    assert queue_redis.xlen(intake_key("ANZ")) == 5
    deadline = time.monotonic() + 10
    while Message.objects.count() < 8:
        assert time.monotonic() < deadline
        time.sleep(done.retry_after)
        done = consume(queue_redis, "ANZ", read(queue_redis, "ANZ", pending=True), django_capture_on_commit_callbacks)
    assert sorted(Message.objects.values_list("content", flat=True)) == [f"queued {n}" for n in range(8)]
    assert queue_redis.xlen(intake_key("ANZ")) == 0 and queue_redis.xlen(dead_key("ANZ")) == 0


def test_queued_sends_and_rest_requests_draw_on_one_bucket(limited, credential, queue_redis,
                                                          django_capture_on_commit_callbacks):
    limited.api_rate_limit_per_second = 0.5  # no token comes back during the test
    limited.save()
    app_snapshots_clear()
    writer = writer_for("ANZ", credential(limited))
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "after the API's requests"})
    entries = read(queue_redis, "ANZ")
    for _ in range(3):
        assert rate_limit_take(app_pk=limited.pk, rate=0.5, burst=3) == 0.0  # the REST API takes the burst
    done = consume(queue_redis, "ANZ", entries, django_capture_on_commit_callbacks)
    assert not Message.objects.exists()
    assert (done.stored, done.waiting, done.retry_after) == (0, 1, 1.0)
