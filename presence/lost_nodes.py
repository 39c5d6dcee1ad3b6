"""Where a node is declared dead, and what presence does then.

A web node heartbeats every PRESENCE_HEARTBEAT_SECONDS (a Redis key with a TTL and its Node row).
The reaper (a beat task, under a cluster-wide Redis lease, foundation.locks, so exactly one worker
does it) takes every node silent for PRESENCE_NODE_TIMEOUT whose Redis key is gone and:

1. tombstones it in Redis and drops every connection it held from the presence cache (one
   script), announcing USER_DISCONNECTED to the master user where that was a user's last one;
2. closes its open session rows and marks the node stopped.

A node that was only paused (a long GC, a frozen VM) and comes back finds the tombstone and its
stopped row at its next heartbeat and closes its sockets with 1012 (messaging.gateway.runtime): its clients
reconnect and fetch, rather than living on as ghosts with closed session rows.

A node that drains (SIGTERM, messaging.gateway.drain) leaves the same way, by itself and without the
tombstone's meaning "you were dead": `node_deregister`, once its connections have ended, takes
whatever is left of it out of Redis and marks its row stopped (the reaper never looks at a stopped
node), closing any session row whose end did not run. The tombstone it leaves refuses a straggling
registration of this process; a node starting again under the id clears it (presence.cache.node_revive).

Presence does not touch deliveries or webhooks (layers point down): `nodes_reap` returns the users
whose connections died, and those whose last connection in the cluster went with them, and the
messaging task that called it re-queues what was in flight to them and announces the latter to
the apps' webhooks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps_registry.selectors import AppSnapshot, app_snapshot, user_id_parse
from foundation.locks import lease

from . import cache
from .events import presence_event_record
from .models import Node, PresenceEventKind, Session
from .selectors import live_sessions_of_node, nodes_silent_for
from .services import master_notify_sync

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReapedNode:
    node_id: str
    sessions: int
    users: list[tuple[int, str]] = field(default_factory=list)  # (app id, user id) whose connections died
    # (app id, user id) whose last connection in the cluster died: USER_DISCONNECTED was announced
    offline: list[tuple[int, str]] = field(default_factory=list)


def nodes_reap() -> list[ReapedNode]:
    """Declare every silent node dead; [] when another worker holds the reaper's lease."""
    with lease("node-reaper", ttl=60) as held:
        if not held:
            return []
        reaped = []
        for node in nodes_silent_for(settings.PRESENCE_NODE_TIMEOUT):
            if cache.node_is_alive(node.node_id):
                continue  # Postgres lagged behind Redis; the node is fine
            reaped.append(node_reap(node=node, reason="node died"))
        return reaped


def node_restart_cleanup(*, node_id: str) -> ReapedNode | None:
    """A node starting under an id that has live sessions crashed before: end them now rather
    than waiting for the reaper (the old sockets are certainly gone)."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is None or not Session.objects.filter(node_id=node_id, disconnected_at__isnull=True).exists():
        return None
    return node_reap(node=node, reason="node restarted")


def _app_of(user_id: str) -> AppSnapshot | None:
    parsed = user_id_parse(user_id)
    return app_snapshot(parsed.app_name) if parsed else None


def node_deregister(*, node_id: str) -> ReapedNode | None:
    """A drained node leaves: its Redis keys go (with any connection still listed, announced where
    it was the user's last), its open session rows close, its row is stopped. None without a row."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        return None
    ended = _node_end(node=node, reason="node drained")
    log.info("node %s deregistered (%d sessions left to close)", node_id, ended.sessions)
    return ended


def node_reap(*, node: Node, reason: str) -> ReapedNode:
    ended = _node_end(node=node, reason=reason)
    log.warning("node %s declared dead (%s): %d sessions closed", node.node_id, reason, ended.sessions)
    return ended


def _node_end(*, node: Node, reason: str) -> ReapedNode:
    offline = []
    for gone in cache.node_forget(node_id=node.node_id):
        if gone.was_last:
            app = _app_of(gone.user_id)
            if app:
                offline.append((app.pk, gone.user_id))
                master_notify_sync(master_user_id=app.master_user_id, event_type="USER_DISCONNECTED",
                                   user_id=gone.user_id)
    sessions = live_sessions_of_node(node.node_id)
    now = timezone.now()
    with transaction.atomic():
        Session.objects.filter(pk__in=[s.pk for s in sessions]).update(disconnected_at=now)
        presence_event_record(kind=PresenceEventKind.DISCONNECT, connection_ids=[s.pk for s in sessions],
                              close_reason=reason)
        Node.objects.filter(pk=node.pk).update(stopped_at=now)
    users = sorted({(s.app_id, s.user_id) for s in sessions})
    return ReapedNode(node_id=node.node_id, sessions=len(sessions), users=users, offline=sorted(set(offline)))
