"""Queueing routing work: the hand-off from "stored" to "on its way".

In a web node, delivery ids committed by many connections within a millisecond or two are
gathered into one Celery task (messaging.batching), which costs the broker and the workers one
task instead of dozens. Anywhere else (workers, the REST API, the admin) each call is one task.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

_batch_sink: Callable[[Sequence[int]], None] | None = None
_sink_lock = threading.Lock()


def routing_batch_sink_install(sink: Callable[[Sequence[int]], None] | None) -> None:
    """A web node installs its batcher here (thread-safe: it is called from DB threads)."""
    global _batch_sink
    with _sink_lock:
        _batch_sink = sink


def routing_enqueue(delivery_ids: Sequence[int]) -> None:
    if not delivery_ids:
        return
    sink = _batch_sink
    if sink is not None:
        sink(delivery_ids)
        return
    routing_task_send(delivery_ids)


def routing_task_send(delivery_ids: Sequence[int], countdown: float | None = None) -> None:
    from messaging.tasks import route_deliveries

    route_deliveries.apply_async(args=[list(delivery_ids)], queue="routing", countdown=countdown)
