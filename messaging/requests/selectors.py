"""Reading requests: one for its app's server (GET /api/v1/requests/{id}), and an outcome to send
again to a client that repeats its request."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from messaging.core.protocol import delivery_frame
from messaging.requests.models import Request


def request_of_app(*, app_pk: int, request_id: int) -> Request | None:
    return Request.objects.filter(app_id=app_pk, pk=request_id).first()


@dataclass(frozen=True)
class StoredOutcome:
    message_id: int
    frame: str


def outcome_stored(*, message_id: int, user_id: str) -> StoredOutcome | None:
    """The outcome message `message_id` as its requester's frame, from the requester's mailbox here
    (None where it is not: forwarded to the requester's home domain, or ended by retention)."""
    with connection.cursor() as cur:
        cur.execute("SELECT d.seq, m.sender, m.kind, m.content, m.reference FROM messaging_delivery d "
                    "JOIN messaging_message m ON m.id = d.message_id WHERE d.message_id = %s AND d.recipient = %s",
                    [message_id, user_id])
        row = cur.fetchone()
    if row is None:
        return None
    seq, sender, kind, content, reference = row
    return StoredOutcome(message_id=message_id, frame=delivery_frame(kind=kind, sender=sender, content=content,
                                                                     reference=reference, message_id=message_id,
                                                                     seq=seq))
