"""An app's intake stream is bounded in bytes: past its cap the writer's XADD is refused (NOPERM),
and accepted again once the consumers have drained it; with no consumer alive the cap is smaller."""

from __future__ import annotations

import pytest
import redis

from foundation.transport.queue_names import intake_key
from messaging.intake.stream.consume import queue_entries_consume
from messaging.intake.stream.gate import consumer_alive_say, consumer_gone_say, queue_gates_enforce
from messaging.intake.stream.metrics import QUEUE_STATS
from tests.messaging.intake.stream.conftest import writer_for
from tests.messaging.intake.stream.test_consume import read

pytestmark = pytest.mark.django_db


def test_a_full_intake_refuses_and_accepts_again_once_consumed(anz, credential, queue_redis, settings,
                                                               django_capture_on_commit_callbacks):
    settings.QUEUE_INTAKE_MAX_BYTES = 64 * 1024
    consumer_alive_say(queue_redis, "alive")
    writer = writer_for("ANZ", credential(anz))
    while (queue_redis.memory_usage(intake_key("ANZ")) or 0) < 64 * 1024:
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * 1024})
    [gate] = queue_gates_enforce(client=queue_redis, app_names=["ANZ"])
    assert (gate.writable, gate.changed, gate.cap) == (False, True, 64 * 1024)
    with pytest.raises(redis.exceptions.NoPermissionError):  # the open connection is refused at once
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "one more"})

    with django_capture_on_commit_callbacks(execute=True):
        queue_entries_consume(client=queue_redis, app_name="ANZ", entries=read(queue_redis, "ANZ"))
    [gate] = queue_gates_enforce(client=queue_redis, app_names=["ANZ"])
    assert (gate.writable, gate.changed) == (True, True)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "one more"})
    [entries] = [f for f in QUEUE_STATS.collect() if f.name == "switchboard_queue_intake_closed"]
    assert {(s.labels["reason"], s.value) for s in entries.samples if s.name.endswith("_total")} == {
        ("full", 1), ("unread", 0)}


def test_with_no_consumer_alive_the_smaller_cap_applies(anz, credential, queue_redis, settings):
    settings.QUEUE_INTAKE_MAX_BYTES, settings.QUEUE_INTAKE_UNREAD_BYTES = 1024 * 1024, 16 * 1024
    consumer_alive_say(queue_redis, "alive")
    writer = writer_for("ANZ", credential(anz))
    while (queue_redis.memory_usage(intake_key("ANZ")) or 0) < 16 * 1024:
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * 1024})
    assert queue_gates_enforce(client=queue_redis, app_names=["ANZ"])[0].writable  # a consumer reads it
    consumer_gone_say(queue_redis, "alive")
    [gate] = queue_gates_enforce(client=queue_redis, app_names=["ANZ"])
    assert (gate.writable, gate.cap) == (False, 16 * 1024)
    with pytest.raises(redis.exceptions.NoPermissionError):
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "nobody reads"})


def test_a_closed_gate_opens_only_under_half_its_cap(anz, credential, queue_redis, settings):
    settings.QUEUE_INTAKE_MAX_BYTES = 32 * 1024
    consumer_alive_say(queue_redis, "alive")
    writer = writer_for("ANZ", credential(anz))
    ids = []
    while (queue_redis.memory_usage(intake_key("ANZ")) or 0) < 32 * 1024:
        ids.append(writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * 1024}))
    assert not queue_gates_enforce(client=queue_redis, app_names=["ANZ"])[0].writable
    queue_redis.xdel(intake_key("ANZ"), *ids[: len(ids) // 4])  # a quarter consumed: still over half
    assert not queue_gates_enforce(client=queue_redis, app_names=["ANZ"])[0].writable
    queue_redis.xdel(intake_key("ANZ"), *ids)
    assert queue_gates_enforce(client=queue_redis, app_names=["ANZ"])[0].writable


def test_a_large_entry_hidden_between_small_ones_is_measured_and_closes_the_gate(anz, credential, queue_redis,
                                                                                 settings):
    settings.QUEUE_INTAKE_MAX_BYTES = 1024 * 1024
    consumer_alive_say(queue_redis, "alive")
    writer = writer_for("ANZ", credential(anz))
    pipe = writer.pipeline(transaction=False)
    for _ in range(600):  # a few dozen small nodes first: what Redis's sampled MEMORY USAGE looks at
        pipe.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * 100})
    pipe.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * (8 * 1024 * 1024)})  # a node of its own
    for _ in range(600):
        pipe.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "x" * 100})
    pipe.execute()
    assert queue_redis.memory_usage(intake_key("ANZ")) < 1024 * 1024  # what the default sampling sees
    [gate] = queue_gates_enforce(client=queue_redis, app_names=["ANZ"])
    assert gate.used > 8 * 1024 * 1024
    assert (gate.writable, gate.changed) == (False, True)
    with pytest.raises(redis.exceptions.NoPermissionError):
        writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "one more"})
