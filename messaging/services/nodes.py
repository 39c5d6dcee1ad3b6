"""What messaging does when presence reports that a node died: the pushes that were in flight to
its connections go back to routing, so they reach the users wherever they reconnect, and the users
whose last connection died with it are announced to the apps' webhooks (user.disconnected; the
master users were told by presence)."""

from __future__ import annotations

import logging

from django.db import transaction

from messaging.dispatch import routing_enqueue
from messaging.webhooks.services import webhooks_record
from presence.liveness import ReapedNode

from .deliveries import deliveries_requeue_for_users
from .presence import user_presence_notice

log = logging.getLogger(__name__)


def dead_nodes_settle(*, reaped: list[ReapedNode]) -> int:
    """Re-queue the in-flight deliveries of the reaped nodes' users; returns how many."""
    offline = [user_presence_notice(app_id=app_id, user_id=user_id, connected=False)
               for node in reaped for app_id, user_id in node.offline]
    if offline:
        try:
            webhooks_record(notices=offline)
        except Exception:
            # The re-queue below matters more than the announcement: it must still happen.
            log.exception("recording user.disconnected webhooks of %d users of dead nodes failed", len(offline))
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
