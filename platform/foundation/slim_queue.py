"""A queue for one reader, costing a few hundred bytes until something is put in it.

asyncio.Queue allocates four deques up front (items, getters, putters, and its `join` Event's
waiters), about 2.5 KB, and a WebSocket connection held three of them (daphne's input queue, the
channel layer's queue of its channel, the channel-reader inbox): some 8 KB of a held connection's
cost on a web node, most of them never holding more than a few items (issue 17). A connection's
queues have exactly one reader (the consumer's dispatch loop) and writers that never wait
(`put_nowait`), so the getters' and putters' bookkeeping is not needed: one deque, made at the first
put, and one future while the reader waits.

It offers the part of asyncio.Queue those users call: `get`, `get_nowait`, `put_nowait` (QueueFull
past `maxsize`), `qsize`, `empty`, and the `_put`/`_get` hooks through which every put and get go
(foundation.daphne_adapter counts bytes with them). A second concurrent reader is a bug, and is
refused with RuntimeError rather than left to hang. A writer that must not run ahead of the reader
(messaging.gateway.socketio.engine hands a client's packets over in bounded pieces) waits with
`below(n)` until fewer than n items wait; `clear()` drops what waits.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any


class SlimQueue:
    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._items: collections.deque | None = None
        self._waiter: asyncio.Future | None = None
        self._space: asyncio.Future | None = None  # writers waiting in below(): woken by the next get
        # Called after each put: lets one reader wait on several queues with a single future
        # (messaging.gateway.connection.inbox), instead of a task blocked in get() per queue.
        self.on_put: Callable[[], None] | None = None

    def qsize(self) -> int:
        return len(self._items) if self._items else 0

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= self.qsize()

    def _put(self, item: Any) -> None:
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)

    def _get(self) -> Any:
        item = self._items.popleft()
        space = self._space
        if space is not None:
            self._space = None
            if not space.done():
                space.set_result(None)
        return item

    async def below(self, count: int) -> None:
        """Return once fewer than `count` items wait (at once if they already do)."""
        while self.qsize() >= count:
            if self._space is None:
                self._space = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._space)  # (shared by every waiting writer: one's cancellation is not all's)

    def clear(self) -> None:
        """Drop every waiting item (writers waiting for space are let go)."""
        if self._items:
            self._items.clear()
        space, self._space = self._space, None
        if space is not None and not space.done():
            space.set_result(None)

    def put_nowait(self, item: Any) -> None:
        if self.full():
            raise asyncio.QueueFull
        self._put(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.on_put is not None:
            self.on_put()

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._get()

    async def get(self) -> Any:
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("SlimQueue has one reader; a second get() is waiting")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._get()
