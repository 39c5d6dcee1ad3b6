"""An app's dead-letter stream is bounded in bytes: a dead letter keeps a bounded copy of its entry
(saying what it left out), and the stream trims its oldest letters rather than pass its cap."""

from __future__ import annotations

import pytest

from foundation.transport.queue_names import dead_key, intake_key
from messaging.intake.stream.dead_letters import dead_letters_maxlen
from tests.messaging.intake.stream.conftest import writer_for
from tests.messaging.intake.stream.test_consume import consume, read

pytestmark = pytest.mark.django_db


def test_an_entry_of_thousands_of_fields_leaves_a_dead_letter_of_a_few_kilobytes(
        anz, credential, queue_redis, settings, django_capture_on_commit_callbacks):
    settings.QUEUE_INTAKE_ENTRY_MAX_BYTES = 16 * 1024 * 1024  # read whole: refused for its fields, not its size
    writer = writer_for("ANZ", credential(anz))
    fields = {"to": "ANZ-1002", "content": "x", **{f"extra-{n:04}": "y" * 2048 for n in range(3000)}}
    entry_id = writer.xadd(intake_key("ANZ"), fields)  # some 6 MB
    done = consume(queue_redis, "ANZ", read(queue_redis, "ANZ"), django_capture_on_commit_callbacks)
    assert done.dead == 1
    [(_, dead)] = queue_redis.xrange(dead_key("ANZ"))
    assert dead[b"entry"] == entry_id
    assert dead[b"reason"] == b"invalid_request: unknown field 'extra-0000' (fields: content, feature, reference, " \
                              b"sender, to)"
    assert (dead[b"to"], dead[b"content"], dead[b"extra-0000"]) == (b"ANZ-1002", b"x", b"y" * 2048)
    assert dead[b"truncated"].startswith(b"kept 4 of 3002 fields, 4096 of ")  # the fourth cut
    assert sum(len(k) + len(v) for k, v in dead.items()) <= settings.QUEUE_DEAD_LETTER_BYTES + 200
    assert queue_redis.memory_usage(dead_key("ANZ"), samples=0) < 16 * 1024


def test_a_full_dead_letter_stream_trims_its_oldest_letters_and_stays_under_its_bytes(
        anz, credential, queue_redis, settings, django_capture_on_commit_callbacks):
    settings.QUEUE_DEAD_MAX_BYTES = 64 * 1024
    writer = writer_for("ANZ", credential(anz))
    pipe = writer.pipeline(transaction=False)
    for n in range(40):  # each refused, each as large as a dead letter can be
        pipe.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": f"{n}", **{f"f{i}": "z" * 2048 for i in range(20)}})
    ids = pipe.execute()
    consume(queue_redis, "ANZ", read(queue_redis, "ANZ"), django_capture_on_commit_callbacks)
    kept = [fields[b"entry"] for _, fields in queue_redis.xrange(dead_key("ANZ"))]
    assert kept == ids[-dead_letters_maxlen():] and 0 < len(kept) < 40  # the newest, in order
    assert queue_redis.memory_usage(dead_key("ANZ"), samples=0) <= 64 * 1024
