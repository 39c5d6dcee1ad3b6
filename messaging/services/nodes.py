"""What messaging does when presence reports that a node died: the pushes that were in flight to
its connections go back to routing, so they reach the users wherever they reconnect."""

from __future__ import annotations

import logging

from django.db import transaction

from messaging.dispatch import routing_enqueue
from presence.liveness import ReapedNode

from .deliveries import deliveries_requeue_for_users

log = logging.getLogger(__name__)


def dead_nodes_settle(*, reaped: list[ReapedNode]) -> int:
    """Re-queue the in-flight deliveries of the reaped nodes' users; returns how many."""
    users = sorted({user for node in reaped for user in node.users})
    if not users:
        return 0
    with transaction.atomic():
        requeued = deliveries_requeue_for_users(users=users)
        transaction.on_commit(lambda: routing_enqueue(requeued))
    if requeued:
        log.warning("re-queued %d in-flight deliveries of %d users of dead nodes %s", len(requeued), len(users),
                    ", ".join(n.node_id for n in reaped))
    return len(requeued)
