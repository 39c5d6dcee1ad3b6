"""The web node's event loop, watched (foundation.loop_watch), and its heap frozen (foundation.heap)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest
from prometheus_client import generate_latest

from foundation.heap import heap_freeze
from foundation.loop_watch import LoopWatch, late_cause
from foundation.metrics import REGISTRY


def _lag_ticks(at_most: str | None = None) -> float:
    if at_most is None:
        return REGISTRY.get_sample_value("switchboard_event_loop_lag_seconds_count") or 0.0
    return REGISTRY.get_sample_value("switchboard_event_loop_lag_seconds_bucket", {"le": at_most}) or 0.0


def _collections(generation: str) -> float:
    return REGISTRY.get_sample_value("switchboard_gc_pause_seconds_count", {"generation": generation}) or 0.0


def _the_loop_blocked_by_a_synchronous_call(seconds: float) -> None:
    time.sleep(seconds)


@pytest.fixture
def watched(settings):
    settings.LOOP_LAG_INTERVAL_SECONDS = 0.01
    settings.LOOP_STALL_LOG_SECONDS = 0.05
    settings.LOOP_STALL_SAMPLE_SECONDS = 0.005


def _run_watched(body) -> None:
    async def main() -> None:
        watch = LoopWatch(asyncio.get_running_loop())
        watch.start()
        try:
            await asyncio.sleep(0.1)  # on time
            body()
            await asyncio.sleep(0.1)  # on time again: the stall has ended, and is logged
        finally:
            watch.stop()

    asyncio.run(main())


def test_a_loop_that_runs_freely_fires_its_timer_on_time(watched):
    ticks, on_time = _lag_ticks(), _lag_ticks("0.01")
    _run_watched(lambda: None)
    fired = _lag_ticks() - ticks
    assert fired >= 10
    assert _lag_ticks("0.01") - on_time >= 0.8 * fired  # (a busy machine may delay one now and then)


def test_a_synchronous_call_on_the_loop_shows_as_lag_and_is_logged_with_the_stack_that_held_it(
        watched, settings, caplog):
    settings.LOOP_STALL_STACKS = True  # (a diagnosis: off in service)
    over_quarter = _lag_ticks() - _lag_ticks("0.25")
    with caplog.at_level(logging.WARNING, logger="foundation.loop_watch"):
        _run_watched(lambda: _the_loop_blocked_by_a_synchronous_call(0.3))
    assert (_lag_ticks() - _lag_ticks("0.25")) - over_quarter >= 1  # the tick due in it, 300 ms late
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert any("_the_loop_blocked_by_a_synchronous_call" in s and "time.sleep(seconds)" in s for s in stalls)


def test_a_stall_is_logged_without_reading_the_loop_threads_frames_unless_stacks_are_asked_for(watched, caplog):
    with caplog.at_level(logging.WARNING, logger="foundation.loop_watch"):
        _run_watched(lambda: _the_loop_blocked_by_a_synchronous_call(0.3))
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert stalls and all("LOOP_STALL_STACKS is off" in s and "time.sleep" not in s for s in stalls)


def _late_ticks(cause: str) -> float:
    return REGISTRY.get_sample_value("switchboard_event_loop_late_ticks_total", {"cause": cause}) or 0.0


def _the_loop_computing_for(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _another_thread_holding_the_gil() -> None:
    done = threading.Event()

    def hold() -> None:
        sum(range(30_000_000))  # one C call: the GIL is not handed back until it ends
        done.set()

    threading.Thread(target=hold).start()
    done.wait(30)


@pytest.mark.parametrize(("stall", "cause"), [
    (lambda: _the_loop_computing_for(0.2), "loop"),
    (lambda: _the_loop_blocked_by_a_synchronous_call(0.2), "blocked"),
])
def test_a_late_tick_is_counted_by_what_held_the_loop(watched, stall, cause):
    before = _late_ticks(cause)
    _run_watched(stall)
    assert _late_ticks(cause) >= before + 1


def test_a_late_tick_while_another_thread_held_the_gil_is_counted_as_the_other_threads(watched):
    before = _late_ticks("other_threads")

    async def main() -> None:
        watch = LoopWatch(asyncio.get_running_loop())
        watch.start()
        try:
            await asyncio.sleep(0.1)
            await asyncio.get_running_loop().run_in_executor(None, _another_thread_holding_the_gil)
            await asyncio.sleep(0.1)
        finally:
            watch.stop()

    asyncio.run(main())
    assert _late_ticks("other_threads") >= before + 1


def test_a_tick_late_while_the_loop_waited_for_a_core_is_the_machines_not_the_nodes():
    # (a core taken by other processes cannot be made on demand here: the reading itself)
    assert late_cause(0.02, own_cpu=0.001, process_cpu=0.002, waited=0.019) == "not_scheduled"
    assert late_cause(0.02, own_cpu=0.025, process_cpu=0.03, waited=0.001) == "loop"
    assert late_cause(0.02, own_cpu=0.001, process_cpu=0.05, waited=None) == "other_threads"
    assert late_cause(0.02, own_cpu=0.001, process_cpu=0.002, waited=0.0) == "blocked"


def test_a_full_garbage_collection_in_a_stall_is_named_in_its_log_and_timed(watched, caplog):
    full = _collections("2")
    garbage = []
    for _ in range(200_000):  # cycles for the collector to walk
        node: list = []
        node.append(node)
        garbage.append(node)

    def collect() -> None:
        garbage.clear()
        gc.collect()
        _the_loop_blocked_by_a_synchronous_call(0.1)  # (the stall long enough to be logged, whatever the machine)

    with caplog.at_level(logging.WARNING, logger="foundation.loop_watch"):
        _run_watched(collect)
    assert _collections("2") >= full + 1
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert any("garbage collections in it: gen 2" in s for s in stalls)


def test_what_a_node_holds_when_its_heap_is_frozen_is_out_of_every_later_collection():
    held = [[index] for index in range(1000)]  # containers alive before the freeze
    try:
        assert heap_freeze() >= len(held)
        walked = {id(obj) for obj in gc.get_objects()}  # what a full collection would walk now
        assert not any(id(obj) in walked for obj in held)
        made_since = [0]
        assert id(made_since) in {id(obj) for obj in gc.get_objects()}  # what is made later is collected as before
    finally:
        gc.unfreeze()


def test_the_nodes_figures_count_its_heap_without_walking_what_is_frozen(monkeypatch):
    # CPython counts the permanent generation by walking it, in one C call holding the GIL: 19 ms for
    # a web node's two million frozen objects, on every scrape, with the event loop waiting.
    def walked(*_):
        raise AssertionError("the frozen heap was walked to be counted")

    before = REGISTRY.get_sample_value("switchboard_heap_allocated_blocks")
    held = [[index] for index in range(1000)]  # two blocks each at least: the list and its items
    monkeypatch.setattr(gc, "get_freeze_count", walked)

    text = generate_latest(REGISTRY).decode()

    assert "switchboard_heap_allocated_blocks " in text
    assert REGISTRY.get_sample_value("switchboard_heap_allocated_blocks") >= before + len(held)
    assert held
