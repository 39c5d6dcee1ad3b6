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
- `switchboard_event_loop_late_ticks_total{cause}`: each tick more than LOOP_LATE_SECONDS (10 ms)
  late, by what the loop's thread did meanwhile, read at each tick from its CPU clock and, on Linux,
  the kernel's scheduler statistics for it (/proc/self/task/<tid>/schedstat), whichever of these
  took the most time, if at least half the lateness: `not_scheduled` (it was ready to run and waited
  for a core: the machine's other processes had the cores, which a busy two-core machine does for
  10-25 ms at times), `loop` (it ran: a callback, or a collection on it), `other_threads` (the
  process's other threads ran: they held the GIL); `blocked` when none did (a blocking call on the
  loop, a sleep or synchronous I/O). A reading over the time since the previous tick, not a trace;
  it tells the node's own stalls from the machine's.
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
import os
import sys
import threading
import time
import traceback

from django.conf import settings
from prometheus_client import Counter, Gauge, Histogram

from foundation.metrics import REGISTRY

log = logging.getLogger(__name__)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOOP_LAG = Histogram("switchboard_event_loop_lag_seconds",
                     "How late the web node's event loop ran a timer due every LOOP_LAG_INTERVAL_SECONDS",
                     buckets=_BUCKETS, registry=REGISTRY)
GC_PAUSE = Histogram("switchboard_gc_pause_seconds", "Garbage collections of the web node's process, timed",
                     ["generation"], buckets=_BUCKETS, registry=REGISTRY)
LOOP_LATE_SECONDS = 0.01
LOOP_LATE = Counter("switchboard_event_loop_late_ticks",
                    "Ticks of the lag timer more than 10 ms late, by what the process did meanwhile",
                    ["cause"], registry=REGISTRY)
HEAP_BLOCKS = Gauge("switchboard_heap_allocated_blocks",
                    "Memory blocks the web node's Python allocator holds (objects, most of them); growing "
                    "while the node's connections do not is a leak, such as garbage frozen out of the "
                    "collector's passes (foundation.heap)", registry=REGISTRY)
HEAP_BLOCKS.set_function(sys.getallocatedblocks)  # (a walk of the allocator's arenas: well under a millisecond)


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


def late_cause(late: float, own_cpu: float, process_cpu: float, waited: float | None) -> str:
    """Why a tick ran `late` seconds late, from what happened since the previous tick: how long the
    loop's thread waited for a core (`waited`; None where the kernel does not say), the CPU it used
    (`own_cpu`) and the CPU the process's other threads used (`process_cpu` less its own). The
    largest of the three, if it covers at least half the lateness; else the loop's thread was
    blocked (a sleep, synchronous I/O)."""
    shares = {"not_scheduled": waited or 0.0, "loop": own_cpu, "other_threads": process_cpu - own_cpu}
    cause = max(shares, key=shares.__getitem__)
    return cause if shares[cause] >= late / 2 else "blocked"


class _ThreadClock:
    """The calling thread's CPU time and its time waiting for a core, both in seconds (the second
    None off Linux): /proc/self/task/<tid>/schedstat, kept open and read again from its start."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float | None]:
        if self._fd is not None:
            try:
                ran, waited, _ = os.pread(self._fd, 128, 0).split()
                return int(ran) / 1e9, int(waited) / 1e9
            except (OSError, ValueError):
                self._fd = None
        return time.thread_time(), None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
        self._clock: _ThreadClock | None = None  # the loop thread's (made on it, in start)
        self._own_cpu = self._waited = self._process_cpu = 0.0
        self._stopped = threading.Event()

    def start(self) -> None:
        """Called on the loop's thread."""
        gc.callbacks.append(self.gc)
        self._clock = _ThreadClock()
        (self._own_cpu, waited), self._process_cpu = self._clock.read(), time.process_time()
        self._waited = waited or 0.0
        self._due = time.perf_counter() + self.interval
        self.loop.call_later(self.interval, self._tick)
        if self.stall_after > 0:
            threading.Thread(target=self._watch, name="loop-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._clock is not None:
            self._clock.close()
        if self.gc in gc.callbacks:
            gc.callbacks.remove(self.gc)

    def _tick(self) -> None:
        if self._stopped.is_set():
            return
        now = time.perf_counter()
        (own, waited), process = self._clock.read(), time.process_time()
        late = max(0.0, now - self._due)
        LOOP_LAG.observe(late)
        if late > LOOP_LATE_SECONDS:
            LOOP_LATE.labels(late_cause(late, own - self._own_cpu, process - self._process_cpu,
                                        None if waited is None else waited - self._waited)).inc()
        self._own_cpu, self._waited, self._process_cpu = own, waited or 0.0, process
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
