"""Nodes and their WebSocket sessions: the durable record behind the Redis presence cache.

The hot path (who is online, on which channel) reads Redis (presence.cache); these rows are the
operator's view and the source for cleaning up after a node that died: a node whose heartbeat is
older than PRESENCE_NODE_TIMEOUT has its open sessions closed by presence.services.node_reap.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from apps_registry.models import ClientApp


class Node(models.Model):
    node_id = models.CharField(max_length=128, primary_key=True)
    domain = models.CharField(max_length=64)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return self.node_id


class Session(models.Model):
    connection_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="sessions")
    user_id = models.CharField(max_length=96)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="sessions")
    channel_name = models.CharField(max_length=200)
    acks = models.BooleanField(default=False)
    connected_at = models.DateTimeField()
    # Connect time while open, close time once closed; an open session's liveness is its node's heartbeat.
    last_seen_at = models.DateTimeField()
    disconnected_at = models.DateTimeField(null=True, blank=True)
    remote_addr = models.CharField(max_length=64, blank=True, default="")
    user_agent = models.CharField(max_length=300, blank=True, default="")
    # The client's resumable session (sessionId, docs/protocol.md "Requests"): one spans the
    # connections that presented it, on any node.
    client_session = models.CharField(max_length=40, blank=True, default="", db_default="")

    class Meta:
        indexes = [
            # When a resumable session was last seen (its connections): the session timeout's query.
            models.Index(fields=["client_session"], name="session_client_session",
                         condition=~Q(client_session="")),
            # Live sessions per node: the reaper's query and the admin's node filter.
            models.Index(fields=["node"], name="session_live_by_node", condition=Q(disconnected_at__isnull=True)),
            # A user's sessions, newest first (admin search by user).
            models.Index(fields=["app", "user_id", "-connected_at"], name="session_user_recent"),
            models.Index(fields=["-connected_at"], name="session_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} on {self.node_id}"

    @property
    def is_live(self) -> bool:
        return self.disconnected_at is None


class Transport(models.TextChoices):
    WS = "ws", "WebSocket"
    SSE = "sse", "Server-sent events"
    WS_STREAM = "ws_stream", "WebSocket channel stream"


class PresenceEventKind(models.TextChoices):
    CONNECT = "connect"
    DISCONNECT = "disconnect"


class PresenceEvent(models.Model):
    """The append-only history of connects and disconnects, kept for the presence reports.

    Guarantees:
    - Rows are only ever inserted (presence.events), never updated or deleted: session cleanup,
      node deletion and app deletion leave them alone (no foreign keys that could cascade), so
      reports never depend on Session rows that cleanup has already removed. The export reads
      them by id (analytics.services.export).
    - A connection has at most one connect and one disconnect event (unique constraint; recording
      twice, e.g. the reaper after a normal close, inserts nothing).
    - A disconnect event is self-contained: it carries the session's start (`connected_at`), so
      one row describes a whole closed session.
    """

    kind = models.CharField(max_length=16, choices=PresenceEventKind.choices)
    at = models.DateTimeField()
    connection_id = models.UUIDField()
    app_id = models.BigIntegerField()
    app_name = models.CharField(max_length=64)
    user_id = models.CharField(max_length=96)
    node_id = models.CharField(max_length=128)
    domain = models.CharField(max_length=64)
    transport = models.CharField(max_length=16, choices=Transport.choices, default=Transport.WS)
    connected_at = models.DateTimeField()
    close_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            # Also the index of "the connect event of this connection" (the live-session export).
            models.UniqueConstraint(fields=["connection_id", "kind"], name="presence_event_once_per_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.user_id} on {self.node_id}"
