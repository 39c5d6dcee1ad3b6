"""The one door to the sockets: every event type reaches a real channel over Redis intact."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from foundation.transport import sockets


@pytest.mark.parametrize("event", [
    sockets.message_deliver_event([{"delivery_id": 1, "message_id": 2, "frame": '{"type":"MESSAGE"}',
                                    "stored_at": 1.5, "claim": 9}]),
    sockets.message_fast_event('{"type":"MESSAGE"}'),
    sockets.presence_event('{"type":"USER_CONNECTED","data":{"userId":"ANZ-1"}}', user_id="ANZ-1", online=True),
    sockets.connection_close_event(1000, "bye"),
])
def test_each_event_type_travels_through_the_redis_channel_layer(event):
    async def roundtrip():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        assert await sockets.send_many([(channel, event)]) == []
        return await asyncio.wait_for(layer.receive(channel), 5)

    assert sockets.run_async(roundtrip()) == event


def test_worker_code_sends_from_sync_code_on_one_long_lived_loop():
    async def new_channel():
        return await get_channel_layer().new_channel()

    channel = sockets.run_async(new_channel())
    assert sockets.send_many_sync([(channel, sockets.message_fast_event("x"))]) == []
    received = sockets.run_async(get_channel_layer().receive(channel))
    assert received == sockets.message_fast_event("x")


def _publishes() -> int:
    from foundation.transport.redis_clients import sync_client

    return int(sync_client().info("commandstats").get("cmdstat_publish", {}).get("calls", 0))


def test_a_send_to_a_channel_read_in_this_process_reaches_it_without_a_trip_through_redis():
    event = sockets.message_fast_event('{"type":"MESSAGE","data":{"content":"here"}}')

    async def local_send():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        before = _publishes()
        assert await sockets.send_many([(channel, event)]) == []
        published = _publishes() - before
        return published, await asyncio.wait_for(layer.receive(channel), 5)

    published, received = sockets.run_async(local_send())
    assert (published, received) == (0, event)


def test_a_send_to_a_channel_of_another_process_is_published_and_one_nobody_reads_is_reported():
    async def channel_elsewhere():
        return await get_channel_layer().new_channel()

    channel = sockets.run_async(channel_elsewhere())  # read on the worker-side loop, not this test's

    async def send_from_another_loop():
        before = _publishes()
        failures = await sockets.send_many([(channel, sockets.message_fast_event("x")),
                                            ("specific.nobody!here", sockets.message_fast_event("y"))])
        return _publishes() - before, [c for c, _ in failures]

    published, failed = asyncio.run(send_from_another_loop())
    assert (published, failed) == (2, ["specific.nobody!here"])
    assert sockets.run_async(get_channel_layer().receive(channel)) == sockets.message_fast_event("x")
