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


@dataclass(frozen=True)
class EndpointFigures:
    """One endpoint's requests made in a window (the console's summary)."""

    app_name: str
    endpoint: str  # "" for the server's own requests of its clients
    waiting: int
    resolved: int
    rejected: int
    timed_out: int
    failed: int
    p50_ms: float | None  # request to outcome, of those answered
    p99_ms: float | None

    @property
    def total(self) -> int:
        return self.waiting + self.resolved + self.rejected + self.timed_out + self.failed


def endpoint_figures(*, window_seconds: int) -> list[EndpointFigures]:
    """Per app and endpoint, the requests made in the last `window_seconds` by state, and the
    request-to-outcome latency of the answered ones (request_recent serves the window)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT a.app_name, r.endpoint,
                   count(*) FILTER (WHERE r.state = 'waiting'), count(*) FILTER (WHERE r.state = 'resolved'),
                   count(*) FILTER (WHERE r.state = 'rejected'), count(*) FILTER (WHERE r.state = 'timed_out'),
                   count(*) FILTER (WHERE r.state = 'failed'),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.answered_at - r.created_at))
                       FILTER (WHERE r.answered_at IS NOT NULL AND r.state IN ('resolved', 'rejected')),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM r.answered_at - r.created_at))
                       FILTER (WHERE r.answered_at IS NOT NULL AND r.state IN ('resolved', 'rejected'))
              FROM messaging_request r JOIN apps_registry_clientapp a ON a.id = r.app_id
             WHERE r.created_at > now() - make_interval(secs => %s)
             GROUP BY a.app_name, r.endpoint ORDER BY a.app_name, r.endpoint
            """, [window_seconds])
        rows = cur.fetchall()
    return [EndpointFigures(app, endpoint, *counts, *(None if v is None else round(v * 1000, 1) for v in (p50, p99)))
            for app, endpoint, *counts, p50, p99 in rows]
