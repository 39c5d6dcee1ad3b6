"""What the queue intake did, counted where it happened (the workers, which are not scraped) in a
Redis hash per app, and read by any web node's /metrics (intake.stream.metrics):
entries consumed (stored or pushed), dead-lettered, repeats of an entry already stored, and the
times the app's writer was refused (its gate closed: full, or full of unread entries while no
consumer was alive). A refused XADD is answered by Redis itself and is not counted one by one."""

from __future__ import annotations

import redis

from foundation.transport.queue_names import stats_key


def stats_add(pipe: redis.client.Pipeline, app_name: str, **counts: int) -> None:
    """Queue the counts' increments on `pipe` (run with the batch's acknowledgement)."""
    for name, n in counts.items():
        if n:
            pipe.hincrby(stats_key(app_name), name, n)
