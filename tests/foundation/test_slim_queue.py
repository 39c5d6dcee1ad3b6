"""The one-reader queue a held connection's sources use: asyncio.Queue's behaviour for its one
reader, at a fraction of its memory."""

from __future__ import annotations

import asyncio

import pytest

from foundation.slim_queue import SlimQueue


def test_items_come_out_in_order_and_a_waiting_reader_is_woken_by_a_put():
    async def run() -> list:
        queue = SlimQueue()
        queue.put_nowait("a")
        reader = asyncio.ensure_future(asyncio.gather(queue.get(), queue.get()))
        await asyncio.sleep(0)
        queue.put_nowait("b")
        return await reader

    assert asyncio.run(run()) == ["a", "b"]


def test_a_bounded_queue_refuses_the_item_past_its_size():
    queue = SlimQueue(maxsize=2)
    queue.put_nowait(1)
    queue.put_nowait(2)
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(3)
    assert (queue.qsize(), queue.get_nowait(), queue.qsize()) == (2, 1, 1)


def test_a_second_waiting_reader_is_refused_rather_than_left_to_hang():
    async def run() -> None:
        queue = SlimQueue()
        first = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)
        try:
            with pytest.raises(RuntimeError):
                await queue.get()
        finally:
            first.cancel()

    asyncio.run(run())


def test_a_reader_of_several_queues_hears_of_every_put():
    queue, heard = SlimQueue(), []
    queue.on_put = lambda: heard.append(queue.qsize())
    queue.put_nowait("x")
    queue.put_nowait("y")
    assert heard == [1, 2]
