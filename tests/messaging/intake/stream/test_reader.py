"""A consumer never holds a huge entry: one over QUEUE_INTAKE_ENTRY_MAX_BYTES is read as a bounded
copy, dead-lettered with its size, and the entries around it flow as usual."""

from __future__ import annotations

import tracemalloc

import pytest
import redis

from foundation.transport.queue_names import GROUP, dead_key, intake_key, queue_redis_url
from messaging.intake.stream.dead_letters import Oversized
from messaging.intake.stream.reader import EntryReader
from messaging.intake.stream.runner import groups_ensure
from messaging.models import Message
from tests.messaging.intake.stream.conftest import writer_for
from tests.messaging.intake.stream.test_consume import consume, read

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


@pytest.mark.parametrize(("fields", "size"), [
    ({"to": "ANZ-1002", "content": "x" * (64 * MB)}, 64 * MB + 2 + 7 + 8 + 2 * 64),  # one huge field
    ({"to": "ANZ-1002", "content": "x", **{f"f{n}": "" for n in range(40_000)}}, None),  # many small ones
], ids=["a 64 MB field", "40,000 empty fields"])
def test_an_entry_over_the_cap_is_read_as_a_bounded_copy_and_dead_lettered(
        anz, credential, queue_redis, fields, size, django_capture_on_commit_callbacks):
    writer = writer_for("ANZ", credential(anz))
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "before"})
    huge = writer.xadd(intake_key("ANZ"), fields)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "after"})
    del fields
    tracemalloc.start()
    try:
        entries = read(queue_redis, "ANZ")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MB  # not the entry: at most what the cap (1 MiB) lets a consumer keep
    [(_, oversized)] = [(entry_id, raw) for entry_id, raw in entries if entry_id == huge]
    assert isinstance(oversized, Oversized) and oversized.size > MB
    assert size is None or oversized.size == size

    done = consume(queue_redis, "ANZ", entries, django_capture_on_commit_callbacks)
    assert (done.stored, done.dead) == (2, 1)
    assert sorted(Message.objects.values_list("content", flat=True)) == ["after", "before"]
    [(_, dead)] = queue_redis.xrange(dead_key("ANZ"))
    assert dead[b"entry"] == huge
    assert dead[b"reason"].startswith(b"request_too_large: the entry holds %d bytes" % oversized.size)
    assert dead[b"to"] == b"ANZ-1002" and b"truncated" in dead  # a copy of its start
    assert queue_redis.memory_usage(dead_key("ANZ"), samples=0) < 16 * 1024
    assert queue_redis.xlen(intake_key("ANZ")) == 0


def test_an_entry_up_to_the_cap_is_read_whole(anz, credential, queue_redis, settings,
                                              django_capture_on_commit_callbacks):
    settings.QUEUE_INTAKE_ENTRY_MAX_BYTES = 256 * 1024
    anz.max_content_bytes = 256 * 1024
    anz.save()
    writer = writer_for("ANZ", credential(anz))
    content = "y" * (256 * 1024 - 200)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": content})
    [(_, fields)] = read(queue_redis, "ANZ")
    assert fields == {b"to": b"ANZ-1002", b"content": content.encode()}


def test_a_refused_read_leaves_the_reader_working_and_a_lost_connection_is_made_again(queue_redis):
    reader = EntryReader(queue_redis_url(), name="sbq-reader-test")
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="NOGROUP"):
            reader.read(group=GROUP, consumer="test", streams=[(intake_key("NOPE"), ">")], count=10)
        groups_ensure(queue_redis, ["ANZ"])
        queue_redis.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "one"})
        [(_, [(_, first)])] = reader.read(group=GROUP, consumer="test", streams=[(intake_key("ANZ"), ">")], count=10)
        assert first == {b"to": b"ANZ-1002", b"content": b"one"}
        [connection] = [c for c in queue_redis.client_list() if c["name"] == "sbq-reader-test"]
        queue_redis.client_kill_filter(_id=connection["id"])  # as a Redis restart would
        with pytest.raises(redis.exceptions.ConnectionError):
            reader.read(group=GROUP, consumer="test", streams=[(intake_key("ANZ"), "0")], count=10)
        [(_, [(_, again)])] = reader.read(group=GROUP, consumer="test", streams=[(intake_key("ANZ"), "0")], count=10)
        assert again == first  # its own pending entry, read again on a new connection
    finally:
        reader.close()
