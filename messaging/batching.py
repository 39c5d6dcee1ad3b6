"""Per-process micro-batching for web nodes.

A `Batcher` collects items from any thread and hands them to a flush function in batches: the
first item starts a short timer (or the batch fills up), and the flush runs in a worker thread so
the event loop keeps serving sockets. Used for "route these deliveries" (one Celery task per
batch) and "these deliveries were written to their sockets" (one UPDATE per batch).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from messaging.asyncdb import run_db

log = logging.getLogger(__name__)


class Batcher:
    def __init__(self, name: str, flush: Callable[[list], None], *, max_delay: float = 0.002, max_size: int = 500):
        self.name = name
        self._flush = flush
        self.max_delay = max_delay
        self.max_size = max_size
        self._items: list = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: set[asyncio.Task] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def add_threadsafe(self, items: Sequence) -> None:
        """Callable from any thread (e.g. a transaction's on_commit in a DB thread)."""
        with self._lock:
            self._items.extend(items)
            if self._scheduled:
                return
            self._scheduled = True
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._schedule)

    def add(self, items: Sequence) -> None:
        """Callable from the event loop thread."""
        with self._lock:
            self._items.extend(items)
            if self._scheduled:
                if len(self._items) >= self.max_size:
                    self._start_flush()
                return
            self._scheduled = True
        self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        self._loop.call_later(self.max_delay, self._start_flush)

    def _start_flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        if not items:
            return
        task = asyncio.ensure_future(self._run(items))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _run(self, items: list) -> None:
        try:
            await run_db(self._flush, items)
        except Exception:
            # What failed here is recovered by the retry sweep (deliveries stay pending/sent);
            # a batch must never take the node down.
            log.exception("%s: flushing %d items failed", self.name, len(items))

    async def drain(self) -> None:
        self._start_flush()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
