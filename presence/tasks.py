from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True)
def reap_dead_nodes() -> dict:
    """Beat: clean up after web nodes that stopped heartbeating (see presence.liveness)."""
    from presence.liveness import nodes_reap

    result = nodes_reap()
    return {"nodes": result.nodes, "sessions": result.sessions, "requeued": result.requeued}
