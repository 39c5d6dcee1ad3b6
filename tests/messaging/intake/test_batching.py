"""A Batcher's `flushed()`: what a draining node waits on before it leaves (messaging.gateway.drain)."""

from __future__ import annotations

import asyncio
import threading

from messaging.intake.batching import Batcher


class HeldFlush:
    """A flush function that holds every batch until released; records what it flushed."""

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.batches: list[list] = []
        self.fail = fail

    def __call__(self, items: list) -> None:
        self.started.set()
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("the database is away")
        self.batches.append(list(items))


async def _wait_for(event: threading.Event) -> None:
    await asyncio.get_running_loop().run_in_executor(None, event.wait, 10)


def test_flushed_waits_for_the_running_flush_and_for_items_added_while_it_ran():
    async def scenario() -> tuple[bool, bool, list[list], bool]:
        flush = HeldFlush()
        batcher = Batcher("test", flush, linger=0)
        batcher.bind(asyncio.get_running_loop())
        batcher.add([1, 2])
        await _wait_for(flush.started)  # the first batch is in its flush, held
        batcher.add([3])
        waiter = asyncio.ensure_future(batcher.flushed())
        await asyncio.sleep(0)
        waiting_while_held = not waiter.done()
        flush.gate.set()
        await waiter
        return waiting_while_held, batcher.busy, flush.batches, waiter.done()

    waiting_while_held, busy, batches, done = asyncio.run(scenario())
    assert waiting_while_held
    assert done and not busy
    assert sorted(item for batch in batches for item in batch) == [1, 2, 3]


def test_flushed_returns_at_once_when_nothing_was_added():
    async def scenario() -> bool:
        batcher = Batcher("test", HeldFlush(), linger=0)
        batcher.bind(asyncio.get_running_loop())
        await asyncio.wait_for(batcher.flushed(), 5)
        return batcher.busy

    assert asyncio.run(scenario()) is False


def test_flushed_waits_for_items_handed_over_from_another_thread():
    async def scenario() -> list[list]:
        flush = HeldFlush()
        flush.gate.set()
        batcher = Batcher("test", flush, linger=0)
        batcher.bind(asyncio.get_running_loop())
        thread = threading.Thread(target=batcher.add_threadsafe, args=([7, 8],))  # an on_commit in a DB thread
        thread.start()
        thread.join()
        await batcher.flushed()
        return flush.batches

    assert asyncio.run(scenario()) == [[7, 8]]


def test_a_failed_flush_does_not_leave_flushed_waiting():
    async def scenario() -> bool:
        flush = HeldFlush(fail=True)
        flush.gate.set()
        batcher = Batcher("test", flush, linger=0)
        batcher.bind(asyncio.get_running_loop())
        batcher.add([1])
        await asyncio.wait_for(batcher.flushed(), 5)
        return batcher.busy

    assert asyncio.run(scenario()) is False


class FailingTwice:
    """A flush function whose first two calls fail (a deadlock, a lost connection); records what it flushed."""

    def __init__(self) -> None:
        self.calls = 0
        self.batches: list[list] = []

    def __call__(self, items: list) -> None:
        self.calls += 1
        if self.calls <= 2:
            raise RuntimeError("deadlock detected")
        self.batches.append(list(items))


def test_a_batcher_with_retries_flushes_what_failed_twice_and_caught_up_waits_for_it():
    async def scenario() -> tuple[int, list[list]]:
        flush = FailingTwice()
        batcher = Batcher("delivered", flush, linger=0, retries=3)
        batcher.bind(asyncio.get_running_loop())
        batcher.add([7, 8])
        await asyncio.wait_for(batcher.caught_up(), 5)
        return flush.calls, flush.batches

    calls, batches = asyncio.run(scenario())
    assert calls == 3
    assert batches == [[7, 8]]  # nothing given up: the ACKs' marks are written


def test_a_batcher_without_retries_gives_a_failed_batch_up_once():
    async def scenario() -> tuple[int, list[list], bool]:
        flush = FailingTwice()
        batcher = Batcher("routing", flush, linger=0)
        batcher.bind(asyncio.get_running_loop())
        batcher.add([1])
        await asyncio.wait_for(batcher.caught_up(), 5)
        return flush.calls, flush.batches, batcher.busy

    assert asyncio.run(scenario()) == (1, [], False)


class StepFlush:
    """A flush function that lets one batch through per step; records what it flushed."""

    def __init__(self) -> None:
        self.steps = threading.Semaphore(0)
        self.batches: list[list] = []

    def __call__(self, items: list) -> None:
        self.steps.acquire(timeout=10)
        self.batches.append(list(items))


def test_caught_up_waits_for_what_was_added_before_it_however_busy_the_batcher_stays():
    async def scenario() -> tuple[list[list], bool, bool]:
        flush = StepFlush()
        batcher = Batcher("delivered", flush, linger=0, max_size=2)
        batcher.bind(asyncio.get_running_loop())
        batcher.add([1, 2, 3])  # two batches: [1, 2], [3]
        waiter = asyncio.ensure_future(batcher.caught_up())
        flush.steps.release()  # [1, 2] goes
        while len(flush.batches) < 1:
            await asyncio.sleep(0.01)
        batcher.add([4, 5])  # more keeps coming: it is no concern of the waiter
        await asyncio.sleep(0.05)
        waiting_for_3 = not waiter.done()
        flush.steps.release()  # [3] goes: the last one the waiter waited for
        await asyncio.wait_for(waiter, 5)
        busy_still = batcher.busy  # [4, 5] has not gone yet, and the waiter did not wait for it
        flush.steps.release()
        await batcher.flushed()
        return flush.batches, waiting_for_3, busy_still

    batches, waiting_for_3, busy_still = asyncio.run(scenario())
    assert waiting_for_3 and busy_still
    assert batches == [[1, 2], [3], [4, 5]]


def test_senders_who_all_came_back_end_the_linger_early_while_a_small_batch_lingers_in_full():
    """Closed-loop senders (each waits for its answer before it sends again) come back together: once
    as many wait as the last batch held, the batch goes without the rest of the linger; a batch
    smaller than EARLY_END_MIN (a lightly loaded node) always lingers."""

    async def scenario() -> tuple[float, float, float, list[list]]:
        flushed: list[list] = []
        batcher = Batcher("test", lambda items: flushed.append(list(items)) or items, linger=1.0)
        batcher.bind(asyncio.get_running_loop())
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(*(batcher.submit(n) for n in range(10)))  # the first batch: a full linger
        first = loop.time() - started
        started = loop.time()
        await asyncio.gather(*(batcher.submit(n) for n in range(10, 20)))  # the same ten senders again
        again = loop.time() - started
        small = Batcher("small", lambda items: items, linger=1.0)
        small.bind(loop)
        await asyncio.gather(*(small.submit(n) for n in range(3)))
        started = loop.time()
        await asyncio.gather(*(small.submit(n) for n in range(3)))
        return first, again, loop.time() - started, flushed

    first, again, small_again, flushed = asyncio.run(scenario())
    assert first >= 1.0 and small_again >= 1.0
    assert again < 0.5
    assert flushed == [list(range(10)), list(range(10, 20))]
