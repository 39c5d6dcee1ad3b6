"""How late a web node's event loop runs what is due, and what held it when it was very late.

Every client of a node waits on its one event loop: a synchronous call on the loop, a long garbage
collection or a thread holding the GIL delays every frame of every connection by as long. Three
figures show it (served at /metrics with the node's others):

- `switchboard_event_loop_lag_seconds`: a timer due every LOOP_LAG_INTERVAL_SECONDS, and how late it
  ran. A loop that never blocks runs it within a millisecond; a stall of 200 ms is one sample of
  about 200 ms (and the samples it swallowed are not there: the histogram counts stalls, not time).
- `switchboard_gc_pause_seconds{generation}`: every garbage collection of the process, timed
  (gc.callbacks). A collection runs on whichever thread allocated last, the loop's or not, and holds
  the GIL for all of them.
- stalls logged: a watchdog thread looks every LOOP_STALL_SAMPLE_SECONDS, and logs a stall longer
  than LOOP_STALL_LOG_SECONDS once it ends, with its length and the collections that ran in it;
  with LOOP_STALL_STACKS on, also the loop thread's stack seen most often meanwhile (what the loop
  ran). Off by default: reading a running thread's frames from another (sys._current_frames) has
  crashed CPython 3.11 processes (uWSGI's tracebacker, Sentry's profiler), and a web node of a fault
  run died of a segfault in PyCode_Addr2Line off its main thread with it on; turn it on for a
  diagnosis, not in service. The watchdog needs the GIL to look: a stall inside one C call is seen
  only as its end.

Started with the node's runtime (messaging.gateway.runtime), once per process.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import sys
import threading
import time
import traceback

from django.conf import settings
from prometheus_client import Histogram

from foundation.metrics import REGISTRY

log = logging.getLogger(__name__)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOOP_LAG = Histogram("switchboard_event_loop_lag_seconds",
                     "How late the web node's event loop ran a timer due every LOOP_LAG_INTERVAL_SECONDS",
                     buckets=_BUCKETS, registry=REGISTRY)
GC_PAUSE = Histogram("switchboard_gc_pause_seconds", "Garbage collections of the web node's process, timed",
                     ["generation"], buckets=_BUCKETS, registry=REGISTRY)


class _GcTimer:
    """gc.callbacks: each collection's length, by generation, and the last ones (for the stall log)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.recent: collections.deque[tuple[float, int, float]] = collections.deque(maxlen=64)  # (end, gen, s)

    def __call__(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self.started = now
            return
        took = now - self.started
        GC_PAUSE.labels(str(info.get("generation", "?"))).observe(took)
        self.recent.append((now, info.get("generation", -1), took))

    def within(self, start: float, end: float) -> list[tuple[int, float]]:
        return [(gen, took) for at, gen, took in list(self.recent) if start <= at <= end + 0.001]


class LoopWatch:
    """The lag timer on one loop, and the watchdog thread that samples the loop's stack in a stall."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.interval = settings.LOOP_LAG_INTERVAL_SECONDS
        self.stall_after = settings.LOOP_STALL_LOG_SECONDS
        self.thread_id = threading.get_ident()
        self.ticked = time.perf_counter()  # when the loop last ran the timer (read by the watchdog)
        self.gc = _GcTimer()
        self._due = 0.0
        self._stopped = threading.Event()

    def start(self) -> None:
        gc.callbacks.append(self.gc)
        self._due = time.perf_counter() + self.interval
        self.loop.call_later(self.interval, self._tick)
        if self.stall_after > 0:
            threading.Thread(target=self._watch, name="loop-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self.gc in gc.callbacks:
            gc.callbacks.remove(self.gc)

    def _tick(self) -> None:
        if self._stopped.is_set():
            return
        now = time.perf_counter()
        LOOP_LAG.observe(max(0.0, now - self._due))
        self.ticked = now
        self._due = now + self.interval
        self.loop.call_later(self.interval, self._tick)

    def _watch(self) -> None:
        sample_every = settings.LOOP_STALL_SAMPLE_SECONDS
        stall_started: float | None = None
        stacks: collections.Counter[str] = collections.Counter()
        wait = sample_every
        while not self._stopped.wait(wait):
            now = time.perf_counter()
            late = now - self.ticked - self.interval
            # On time: look again only when the loop could first be late enough to log; in a stall, sample.
            wait = sample_every if late > self.stall_after else max(sample_every, self.stall_after - late)
            if late > self.stall_after:
                if stall_started is None:
                    stall_started = self.ticked + self.interval
                if settings.LOOP_STALL_STACKS:
                    frame = sys._current_frames().get(self.thread_id)
                    if frame is not None:
                        stacks["".join(traceback.format_stack(frame, limit=12))] += 1
            elif stall_started is not None:
                self._log_stall(stall_started, self.ticked, stacks)
                stall_started, stacks = None, collections.Counter()

    def _log_stall(self, start: float, end: float, stacks: collections.Counter[str]) -> None:
        collections_in = self.gc.within(start, end)
        gc_part = ", ".join(f"gen {gen} {took * 1000:.0f} ms" for gen, took in collections_in) or "none"
        unseen = ("(not sampled: the GIL was held throughout)\n" if settings.LOOP_STALL_STACKS
                  else "(not sampled: LOOP_STALL_STACKS is off)\n")
        stack, seen = stacks.most_common(1)[0] if stacks else (unseen, 0)
        log.warning("event loop stalled %.0f ms; garbage collections in it: %s; the loop's stack in %d of %d "
                    "samples:\n%s", (end - start) * 1000, gc_part, seen, sum(stacks.values()), stack)


_watch: LoopWatch | None = None


def loop_watch_start() -> LoopWatch:
    """Watch the running loop (once per process: a second call returns the first watch)."""
    global _watch
    if _watch is None:
        _watch = LoopWatch(asyncio.get_running_loop())
        _watch.start()
    return _watch
