"""Where a node is declared dead, and what happens then.

A web node heartbeats every PRESENCE_HEARTBEAT_SECONDS (a Redis key with a TTL and its Node row).
The reaper (Celery beat, under a cluster-wide Redis lock so exactly one worker does it) takes
every node silent for PRESENCE_NODE_TIMEOUT whose Redis key is gone, and for each of its open
sessions: forgets the connection in the presence cache, announces USER_DISCONNECTED where it was
the user's last connection, closes the session row; then puts the node's in-flight deliveries
back to retrying so they reach the users wherever they reconnect.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from messaging.dispatch import routing_enqueue
from messaging.services import deliveries_requeue_for_users

from . import cache
from .events import presence_event_record
from .models import Node, PresenceEventKind, Session
from .selectors import live_sessions_of_node, nodes_silent_for
from .services import master_notify_sync

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReapResult:
    nodes: list[str]
    sessions: int
    requeued: int


def nodes_reap() -> ReapResult:
    lock = cache.lock_acquire("node-reaper", ttl=60)
    if lock is None:
        return ReapResult([], 0, 0)  # another worker is doing it right now
    try:
        reaped, sessions, requeued = [], 0, 0
        for node in nodes_silent_for(settings.PRESENCE_NODE_TIMEOUT):
            if cache.node_is_alive(node.node_id):
                continue  # Postgres lagged behind Redis; the node is fine
            s, r = _node_reap(node)
            reaped.append(node.node_id)
            sessions += s
            requeued += r
        return ReapResult(reaped, sessions, requeued)
    finally:
        try:
            lock.release()
        except Exception:  # the lock expired under a very slow run; nothing to undo
            log.warning("reaper lock had expired before release")


def node_restart_cleanup(*, node_id: str) -> None:
    """A node starting under an id that has live sessions crashed before: end them now rather
    than waiting for the reaper (the old sockets are certainly gone)."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is not None and Session.objects.filter(node_id=node_id, disconnected_at__isnull=True).exists():
        _node_reap(node)


def _node_reap(node: Node) -> tuple[int, int]:
    sessions = live_sessions_of_node(node.node_id)
    for session in sessions:
        last = cache.connection_remove_sync(user_id=session.user_id, channel_name=session.channel_name)
        if last:
            master_notify_sync(master_user_id=session.app.master_user_id, event_type="USER_DISCONNECTED",
                               user_id=session.user_id)
    now = timezone.now()
    with transaction.atomic():
        Session.objects.filter(pk__in=[s.pk for s in sessions]).update(disconnected_at=now)
        presence_event_record(kind=PresenceEventKind.DISCONNECT, connection_ids=[s.pk for s in sessions],
                              close_reason="node died")
        Node.objects.filter(pk=node.pk).update(stopped_at=now)
        requeued = deliveries_requeue_for_users(users=sorted({(s.app_id, s.user_id) for s in sessions}))
        transaction.on_commit(lambda: routing_enqueue(requeued))
    log.warning("node %s declared dead: %d sessions closed, %d deliveries re-queued",
                node.node_id, len(sessions), len(requeued))
    return len(sessions), len(requeued)
