"""Per-process micro-batching for web nodes (group commit).

A `Batcher` collects items from the event loop (or any thread) and hands them to a flush function
in a DB thread, so the event loop keeps serving sockets. It batches adaptively, the way group
commit does: an item arriving while no flush runs is flushed at once (after `linger`, a fraction of
a millisecond), and items arriving while a flush runs wait for it and go together in the next one.
Light load pays no batching delay; heavy load gets big batches and one statement, one commit and
one Celery task per batch. Senders that each wait for their answer before sending again come back
together: once as many wait as the last batch held (EARLY_END_MIN or more), the linger ends early.

`submit` waits for the item's own result (the intake: a sender is answered after its message is
committed); `add` is fire-and-forget (routing, delivered marks, releases). A batcher with
`max_pending` refuses new items with `BatcherFull` while that many wait: a bounded intake, so a
node whose database falls behind says so to its senders instead of queueing without limit.

`flushed()` waits until nothing is pending or being flushed: what was added before it was called
has been committed (or its failure logged), which is what a draining node waits for before it
leaves (messaging.gateway.drain). `caught_up()` waits only for what was added before it was called, however
busy the batcher stays meanwhile: what a connection waits for before it tells its client to
reconnect elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from foundation.asyncdb import run_db
from foundation.backoff import Backoff

log = logging.getLogger(__name__)


RETRY_BACKOFF = Backoff(0.05, 3.2, jitter=0)  # a failed flush's retries (Batcher.retries): 0.05 s, doubling
EARLY_END_MIN = 8  # a batch at least this large lets the next one end its linger early (Batcher._linger)


class BatcherFull(Exception):
    def __init__(self, name: str, retry_after: float):
        super().__init__(f"{name} is full")
        self.retry_after = retry_after


class Batcher:
    def __init__(self, name: str, flush: Callable[[list], Sequence[Any] | None], *, linger: float = 0.0005,
                 max_size: int = 500, max_pending: int | None = None, retries: int = 0):
        self.name = name
        self._flush = flush
        # A flush that failed is tried again this many times (after RETRY_BACKOFF's waits)
        # before its items are given up: for a flush that is idempotent and whose items nothing else
        # recovers as they are (an ACK's mark: given up, the message comes again after its ACK).
        self.retries = retries
        self.linger = linger
        self.max_size = max_size
        self.max_pending = max_pending
        self._items: list[tuple[Any, asyncio.Future | None]] = []
        self._lock = threading.Lock()
        self._wakeup_pending = False
        self._running: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.last_flush_seconds = 0.0  # how long the latest flush took: the retry hint when full
        self._last_batch = 0  # how many items the latest flush took: the linger's early end
        self._lingering: asyncio.Event | None = None  # set to end the linger early
        # Items are flushed in the order they were added: once `_done` reaches an item's number, it
        # has been flushed (committed, or its failure logged).
        self._added = 0
        self._done = 0
        self._progress: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def pending(self) -> int:
        return len(self._items)

    @property
    def busy(self) -> bool:
        """Items wait, or a flush runs."""
        return bool(self._items) or (self._running is not None and not self._running.done())

    async def caught_up(self) -> None:
        """Wait until every item added before this call has been flushed (or its flush failed)."""
        target = self._added
        while self._done < target:
            if self._progress is None:
                self._progress = asyncio.Event()
            progress = self._progress
            await progress.wait()

    async def flushed(self) -> None:
        """Wait until nothing is pending or being flushed (items added meanwhile are waited for too)."""
        while True:
            running = self._running
            if running is not None and not running.done():
                await asyncio.wait({running})  # not shielded: cancelling the waiter never cancels the flush
            elif self._items:
                # Added from another thread, its wake-up not run yet: give the loop a turn to run it.
                await asyncio.sleep(0)
            else:
                return

    def _append(self, entries: Sequence[tuple[Any, asyncio.Future | None]]) -> bool:
        """Queue entries; True when the caller must wake the drain (none is pending)."""
        with self._lock:
            self._items.extend(entries)
            self._added += len(entries)
            if self._wakeup_pending:
                return False
            self._wakeup_pending = True
            return True

    def add_threadsafe(self, items: Sequence) -> None:
        """Callable from any thread (e.g. a transaction's on_commit in a DB thread)."""
        if items and self._append([(item, None) for item in items]):
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._wake)

    def add(self, items: Sequence) -> None:
        """Callable from the event loop thread."""
        if items and self._append([(item, None) for item in items]):
            self._wake()

    async def submit(self, item: Any) -> Any:
        """Queue one item and wait for its result; BatcherFull when `max_pending` items wait."""
        if self.max_pending is not None and len(self._items) >= self.max_pending:
            raise BatcherFull(self.name, max(0.05, self.last_flush_seconds * 2))
        future = asyncio.get_running_loop().create_future()
        if self._append([(item, future)]):
            self._wake()
        elif self._lingering is not None and len(self._items) >= self._last_batch >= EARLY_END_MIN:
            self._lingering.set()
        return await future

    async def _linger(self) -> None:
        """Wait `linger` for a batch to gather, or less once as many senders wait as the last batch
        held, when that was at least EARLY_END_MIN: senders that each wait for their answer before
        they send again (REST clients, /ws clients that wait for MESSAGE_ACCEPTED) come back
        together, and the time they would wait beyond that is latency and nothing else. Smaller
        batches (a lightly loaded node) linger in full: that is what makes them batches."""
        if self.linger <= 0:
            return
        self._lingering = asyncio.Event()
        if not len(self._items) >= self._last_batch >= EARLY_END_MIN:
            try:
                await asyncio.wait_for(self._lingering.wait(), self.linger)
            except TimeoutError:
                pass
        self._lingering = None

    def _wake(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._drain())
        # else: the running drain picks the new items up when its flush returns

    async def _drain(self) -> None:
        await self._linger()
        while True:
            with self._lock:
                batch, self._items = self._items[: self.max_size], self._items[self.max_size:]
                if not batch:
                    self._wakeup_pending = False
                    return
                if not self._items:
                    self._wakeup_pending = False
            started = time.monotonic()
            self._last_batch = len(batch)
            items = [item for item, _ in batch]
            try:
                results = await self._flush_retried(items)
            except Exception as exc:
                # What failed here is recovered elsewhere (deliveries stay pending or sent and are
                # found again by the sweep); a batch must never take the node down. A waiting
                # sender learns of the failure.
                log.exception("%s: flushing %d items failed", self.name, len(items))
                for _, future in batch:
                    if future is not None and not future.done():
                        future.set_exception(exc)
                continue
            finally:
                self.last_flush_seconds = time.monotonic() - started
                self._flushed_count(len(batch))
            for index, (_, future) in enumerate(batch):
                if future is not None and not future.done():
                    future.set_result(results[index] if results is not None else None)

    async def _flush_retried(self, items: list) -> Sequence[Any] | None:
        """The flush, tried again up to `retries` times while it raises (a deadlock, a connection
        lost under load); meanwhile `caught_up()` and `flushed()` keep waiting for these items."""
        for attempt in range(1, self.retries + 1):
            try:
                return await run_db(self._flush, items)
            except Exception:
                delay = RETRY_BACKOFF.seconds(attempt)
                log.warning("%s: flushing %d items failed (try %d of %d), trying again in %.2f s",
                            self.name, len(items), attempt, self.retries + 1, delay, exc_info=True)
                await asyncio.sleep(delay)
        return await run_db(self._flush, items)  # the last try: what it raises, the caller logs

    def _flushed_count(self, n: int) -> None:
        self._done += n
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.set()


class LoopBatcher:
    """The same adaptive batching for work done on the event loop itself (a Redis pipeline): the
    first item starts a flush on the next turn of the loop, items arriving while a flush is in
    flight go together in the next one. `flush` is a coroutine function returning one result per
    item, in order; a result that is an exception is raised to that item's caller alone, and a flush
    that raises refuses every item of its batch. Every item is waited for (`submit`): nothing is
    left in it that a drain would have to flush.
    """

    def __init__(self, name: str, flush: Callable[[list], Awaitable[Sequence[Any]]], *, max_size: int = 500):
        self.name = name
        self._flush = flush
        self.max_size = max_size
        self._items: list[tuple[Any, asyncio.Future]] = []
        self._running: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        return len(self._items)

    async def submit(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # whatever else this turn of the loop queues comes along
        while self._items:
            batch, self._items = self._items[: self.max_size], self._items[self.max_size:]
            try:
                results = await self._flush([item for item, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue  # its caller was cancelled
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
