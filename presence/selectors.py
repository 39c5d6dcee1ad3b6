"""Read-side queries of presence."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from .models import Node, Session


def nodes_silent_for(seconds: int) -> list[Node]:
    """Nodes that stopped heartbeating but were never cleaned up."""
    cutoff = timezone.now() - timedelta(seconds=seconds)
    return list(Node.objects.filter(stopped_at__isnull=True, heartbeat_at__lt=cutoff))


def live_sessions_of_node(node_id: str) -> list[Session]:
    """Served by the partial index session_live_by_node."""
    return list(Session.objects.filter(node_id=node_id, disconnected_at__isnull=True).select_related("app"))
