"""Per-process micro-batching for web nodes.

A `Batcher` collects items from any thread and hands them to a flush function in a DB thread, so
the event loop keeps serving sockets. It batches adaptively, the way group commit does: an item
arriving while no flush runs is flushed at once (after `linger`, a fraction of a millisecond), and
items arriving while a flush runs wait for it and go together in the next one. Light load pays no
batching delay; heavy load gets big batches and one Celery task or one UPDATE per batch.

Used for "route these committed deliveries" and "these deliveries were written to their sockets".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from messaging.asyncdb import run_db

log = logging.getLogger(__name__)


class Batcher:
    def __init__(self, name: str, flush: Callable[[list], None], *, linger: float = 0.0005, max_size: int = 500):
        self.name = name
        self._flush = flush
        self.linger = linger
        self.max_size = max_size
        self._items: list = []
        self._lock = threading.Lock()
        self._wakeup_pending = False
        self._running: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _append(self, items: Sequence) -> bool:
        """Queue items; True when the caller must wake the drain (none is pending)."""
        with self._lock:
            self._items.extend(items)
            if self._wakeup_pending:
                return False
            self._wakeup_pending = True
            return True

    def add_threadsafe(self, items: Sequence) -> None:
        """Callable from any thread (e.g. a transaction's on_commit in a DB thread)."""
        if self._append(items):
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._wake)

    def add(self, items: Sequence) -> None:
        """Callable from the event loop thread."""
        if self._append(items):
            self._wake()

    def _wake(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._drain())
        # else: the running drain picks the new items up when its flush returns

    async def _drain(self) -> None:
        await asyncio.sleep(self.linger)
        while True:
            with self._lock:
                items, self._items = self._items[: self.max_size], self._items[self.max_size:]
                if not items:
                    self._wakeup_pending = False
                    return
                if not self._items:
                    self._wakeup_pending = False
            try:
                await run_db(self._flush, items)
            except Exception:
                # What failed here is recovered by the retry sweep (deliveries stay pending or
                # sent, and are found again); a batch must never take the node down.
                log.exception("%s: flushing %d items failed", self.name, len(items))
