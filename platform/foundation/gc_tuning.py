"""The web node's cyclic garbage collector, set for a process holding thousands of sockets (issue 17).

CPython frees an object as soon as its last reference goes (reference counting); the cyclic
collector exists only for garbage in reference cycles. By default it runs a young collection every
700 net allocations of container objects and, every hundred of those, a full one that traverses
every tracked object in the process: the modules, Django's and Twisted's machinery, and every held
connection's protocol, consumer, queues and futures. A reconnect storm allocates fast, so full
collections came one after another: in `bench/storm.py` (2,000 clients on one node, three storms)
17 full collections took 5.3 s of the node's 16.7 s of CPU, about a third of it.

`tune()`, called once the reactor runs (config.web), when the application and everything imported
at start-up is loaded:
- collects once, then freezes what is left (`gc.freeze()`): the ~160,000 objects alive at start-up
  live as long as the process and are never traversed again;
- sets the young generation's threshold to GEN0_THRESHOLD (20,000 allocations instead of 700),
  the older two's to 20 and 10: a full collection every 4,000,000 net allocations at most (CPython
  3.11 also waits until the objects that survived since the last one are a quarter of the rest).

What it does not change: an object no cycle holds is freed at once, as before, and the memory a
held connection costs stayed at 34 KB. Nothing a client sees depends on when the collector runs:
sockets are closed by Twisted and timers by their owners, not by finalizers. What it costs: a cycle
waits longer to be freed, so after reconnect storms in a row the node's RSS grew by about 23 KB per
client per storm over three storms (untuned: about 1 KB); whether it levels off is not yet measured
(docs/benchmarks.md, "The web node's garbage collector").
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000
OLDER_THRESHOLDS = (20, 10)


def tune() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *OLDER_THRESHOLDS)
