"""The web node's heap kept out of the garbage collector's full passes.

A full (generation 2) collection walks every container object the process holds, on whichever
thread triggered it, holding the GIL: on a web node that is the event loop, stalled for as long as
the walk takes. Most of what it walks lives as long as the process (modules, classes, settings,
Django's and Twisted's machinery, the apps' caches), so every full pass pays for it again, and the
pause grows with the heap (a web node's full collection held its loop 125 ms after a minute of
traffic: foundation.loop_watch's stall log; issue 47).

`heap_freeze` collects once and then moves everything alive into the permanent generation
(gc.freeze): later full passes walk only what was made since. It runs before the node listens
(config.web: the imports, settings and the ASGI application, about 170,000 objects and 100 ms), and
again, much shorter, when the node's runtime starts with its first connection (what the first
requests made: the URL resolver, caches, the runtime itself). What is frozen is never collected, so
it is not run on a timer: garbage in a cycle made after that is collected as before.

What is made after the freeze is a node's connections (about 160 tracked objects each, with 750
references to follow: 200 connections make a full pass of 10 to 25 ms) and what its traffic has in
flight. Python collects the young generation whenever 700 more containers were made than freed: a
node at 1,000 messages a second did so 25 times a second, and each pass promoted what was in flight
at that instant (a frame being parsed, a send's futures), short-lived objects counted towards the
next full pass as if they were long-lived: one every five seconds, 10 to 25 ms each.
`gc_thresholds` sets the node's own (WEB_GC_THRESHOLDS, 10000, 7, 0): a message's objects are
freed by their reference counts long before 10,000 more accumulate, so under the same traffic the
node made one young pass in 20 s, of 4 to 7 ms, and no other (measured with 10000,10,10 and
10000,7,1). A generation is collected once its count is over its threshold: the middle one every 8th
young pass, and a full pass is then considered each time (threshold 0), every 80,000 allocations,
about as often as with Python's own thresholds (701 x 11 x 11, 85,000), so the garbage that closed
connections leave in cycles (about 125 objects each) is collected as often as before. Those full
passes, 50 to 150 ms with a round of 200 closed connections' garbage to free, were what still held
the loop longest.

**A closed connection is freed by reference counting** (since issue 47's second pass): its consumer
lets go of its state when it ends (messaging.gateway.connection.inbox), and the daphne side breaks
the cycles daphne, autobahn and the node's own wrappers make (foundation.patches.daphne). A storm of
200 clients dropped and back six times left no cyclic garbage (it left about 167 objects per closed
connection before). So a full pass no longer frees anything worth its walk: what it costs is walking
what is alive, about 127 objects per held connection, 80-140 ms with 1,000 held connections and
16-27 ms with 200 on the bench machine.

`survivors_freeze` (WEB_GC_FREEZE_SURVIVORS, on by default) therefore freezes what a full pass
leaves alive, at its end: the next pass walks only what was made and kept since. Python runs a full
pass once what was promoted since the last one is a quarter of what that one left, so the passes
walk a few thousand objects each, not every held connection again. What is frozen is still freed by
its reference count; only garbage in a cycle that includes an object frozen earlier is never
collected. Such a leak shows as `switchboard_heap_allocated_blocks` on /metrics growing while the
node's connections do not. The frozen count itself is not served: CPython counts the permanent
generation by walking it (gc.get_freeze_count, 19 ms for a web node's 2 million objects, in one C
call that holds the GIL), and a scrape that asked for it stalled the loop for as long (issue 47,
session 22). `heap_freeze` counts what it freezes as it freezes it, from the generations it empties.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def heap_freeze() -> int:
    """Collect, then freeze what is left; returns how many objects this froze (what the collector's
    generations held, listed: the frozen ones are not walked again to count them)."""
    started = time.perf_counter()
    gc.collect()
    frozen = len(gc.get_objects())
    gc.freeze()
    log.info("heap frozen: %d more objects out of the collector's full passes (%.0f ms)", frozen,
             (time.perf_counter() - started) * 1000)
    return frozen


def gc_thresholds(thresholds: tuple[int, ...]) -> None:
    """The collector's thresholds (gc.set_threshold's); empty: Python's own stay."""
    if thresholds:
        gc.set_threshold(*thresholds)


def _freeze_after_full_pass(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def survivors_freeze(on: bool = True) -> None:
    """After every full collection, freeze what it left alive (on), or stop doing so (off)."""
    if _freeze_after_full_pass in gc.callbacks:
        gc.callbacks.remove(_freeze_after_full_pass)
    if on:
        gc.callbacks.append(_freeze_after_full_pass)
