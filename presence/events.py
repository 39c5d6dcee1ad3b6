"""Recording connects and disconnects in the append-only PresenceEvent history.

One INSERT ... SELECT per call, reading the session rows just written in the caller's
transaction: the event commits (or rolls back) with the session change it describes, so a
closed session always has its disconnect event. ON CONFLICT makes recording idempotent (the
reaper closing a session that a node had already closed records nothing new).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db import connection

from .models import PresenceEventKind, Transport


def presence_event_record(*, kind: PresenceEventKind, connection_ids: Sequence[uuid.UUID], close_reason: str = "",
                          transport: Transport = Transport.WS) -> int:
    """Record `kind` for the given sessions (a disconnect only for sessions already closed).
    Returns how many events were inserted."""
    if not connection_ids:
        return 0
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO presence_presenceevent
                (kind, at, connection_id, app_id, app_name, user_id, node_id, domain, transport, connected_at,
                 close_reason)
            SELECT %(kind)s::text, CASE WHEN %(kind)s::text = 'connect' THEN s.connected_at ELSE s.disconnected_at END,
                   s.connection_id, s.app_id, a.app_name, s.user_id, s.node_id, n.domain, %(transport)s::text,
                   s.connected_at, left(%(reason)s::text, 200)
              FROM presence_session s
              JOIN presence_node n ON n.node_id = s.node_id
              JOIN apps_registry_clientapp a ON a.id = s.app_id
             WHERE s.connection_id = ANY(%(ids)s) AND (%(kind)s::text = 'connect' OR s.disconnected_at IS NOT NULL)
            ON CONFLICT (connection_id, kind) DO NOTHING
            """,
            {"kind": str(kind), "transport": str(transport), "reason": close_reason,
             "ids": list(connection_ids)},
        )
        return cur.rowcount
