"""Clients made for one event loop are never handed to another: each `asyncio.run` makes a new
loop, and a later loop may be given the address (the id) of one already collected."""

from __future__ import annotations

import asyncio

from foundation.loop_local import loop_local
from foundation.transport.redis_clients import async_client


def test_what_one_loop_kept_is_not_found_by_a_later_loop():
    async def keep_and_look() -> bool:
        made: list[bool] = []
        loop_local("kept", lambda: made.append(True))
        return not made  # True: something kept by an earlier loop was found

    for _ in range(20):  # a collected loop's id is soon given to a later one
        assert asyncio.run(keep_and_look()) is False


def test_redis_answers_on_every_one_of_many_short_lived_loops():
    async def ping() -> bool:
        return await asyncio.wait_for(async_client().ping(), 5)

    for _ in range(20):
        assert asyncio.run(ping()) is True
