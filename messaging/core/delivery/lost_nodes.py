"""What messaging does when presence reports that a node died: the pushes that were in flight to
its connections go back to routing, so they reach the users wherever they reconnect, and the users
whose last connection died with it are announced to the apps' webhooks (user.disconnected; the
master users were told by presence)."""

from __future__ import annotations

import logging

from django.db import transaction

from foundation.db import hot_cursor
from foundation.handoff import Route, routing_enqueue
from messaging.core.delivery.sql import RETRYING, SENT
from messaging.core.presence_notices import user_presence_notice
from messaging.webhooks.services import webhooks_record
from presence.lost_nodes import ReapedNode

log = logging.getLogger(__name__)


def deliveries_requeue_for_users(*, users: list[tuple[int, str]]) -> list[int]:
    """In-flight pushes to users whose connections died with a node: retrying, due now, no attempt
    counted (the node died, not the delivery). The users' mailbox index serves the lookup."""
    if not users:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH u AS (SELECT * FROM unnest(%s::bigint[], %s::text[]) AS t(app_id, user_id)),
            locked AS MATERIALIZED (
                SELECT d.id FROM messaging_delivery d JOIN u ON d.app_id = u.app_id AND d.recipient = u.user_id
                 WHERE d.state = {SENT} ORDER BY d.id FOR UPDATE
            )
            UPDATE messaging_delivery d SET state = {RETRYING}, next_attempt_at = now(), claim = NULL,
                   last_error = 'the node holding the connection died before confirming'
              FROM locked l WHERE d.id = l.id AND d.state = {SENT}
            RETURNING d.id
            """,
            [[u[0] for u in users], [u[1] for u in users]],
        )
        return sorted(row[0] for row in cur.fetchall())


def lost_nodes_settle(*, reaped: list[ReapedNode], route: Route = routing_enqueue) -> int:
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
        transaction.on_commit(lambda: route(requeued))
    if requeued:
        log.warning("re-queued %d in-flight deliveries of %d users of dead nodes %s", len(requeued), len(users),
                    ", ".join(n.node_id for n in reaped))
    return len(requeued)
