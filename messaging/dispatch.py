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


ROUTING_TASK_MAX_IDS = 500  # keeps one task's claim statement and its pushes short


def routing_task_send(delivery_ids: Sequence[int]) -> None:
    """One routing task per ROUTING_TASK_MAX_IDS deliveries."""
    from messaging.tasks import route_deliveries

    ids = list(delivery_ids)
    for start in range(0, len(ids), ROUTING_TASK_MAX_IDS):
        route_deliveries.apply_async(args=[ids[start:start + ROUTING_TASK_MAX_IDS]], queue="routing")
