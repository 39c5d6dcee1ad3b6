"""The REST intake's Redis stream read into the same sequence as the TCP source."""

from __future__ import annotations

import asyncio
import contextlib

from foundation.transport.redis_clients import sync_client
from messaging.exchange.event_lines_reader import intake_loop
from messaging.exchange.streams import intake_stream_key
from tests.messaging.exchange.test_adapter import Harness, read_lines


def test_intake_entries_join_the_tcp_stream_and_are_trimmed_once_committed():
    key = intake_stream_key(4242)
    redis = sync_client()
    redis.delete(key)

    async def scenario():
        async with Harness() as h:
            h.ex.app_id = 4242
            reader = asyncio.create_task(intake_loop(h.ex, block_ms=50))
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|B\n")
            await asyncio.to_thread(redis.xadd, key, {"lines": "3|P|2|1\n2|B"})
            src.write(b"4|B\n")
            assert await read_lines(alice, 4) == [b"1|B\n", b"2|B\n", b"3|P|2|1\n", b"4|B\n"]
            await h.until(lambda: h.ex.intake_committed is not None)
            await asyncio.to_thread(redis.xadd, key, {"lines": "5|B"})
            assert await read_lines(alice, 1) == [b"5|B\n"]
            await h.until(lambda: redis.xlen(key) == 1)  # consumed entries trimmed; the last stays
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        redis.delete(key)


def test_stopping_the_reader_ends_it_even_when_a_cancellation_is_swallowed_on_the_way():
    from messaging.exchange.service import task_stop

    reads = []

    async def reader_that_swallows_one_cancellation() -> None:
        swallowed = False
        while True:
            try:
                await asyncio.sleep(0.05)  # a Redis read with `block`
                reads.append(1)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed = True  # what a library's timeout may do with a cancellation that races it

    async def scenario() -> bool:
        task = asyncio.create_task(reader_that_swallows_one_cancellation())
        await asyncio.sleep(0.1)
        await asyncio.wait_for(task_stop(task, again_after=0.2), 5)
        return task.cancelled()

    assert asyncio.run(scenario())
