"""Closed requests older than REQUEST_RETENTION_DAYS go (beat, hourly), a batch per statement,
oldest first (request_recent). Their outcome messages are the mailbox's, ended by its own retention
(messaging.core.delivery.expiry); a request still waiting is never removed. Ended sessions
(ClosedSession) older than that go too."""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from messaging.requests.models import RequestState


def requests_purge(*, batch: int = 10_000) -> int:
    total = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(
                f"""
                DELETE FROM messaging_request WHERE id IN (
                    SELECT id FROM messaging_request
                     WHERE created_at < now() - make_interval(days => %s) AND state <> '{RequestState.WAITING.value}'
                     ORDER BY created_at LIMIT %s)
                """,
                [settings.REQUEST_RETENTION_DAYS, batch],
            )
            total += cur.rowcount
            if cur.rowcount < batch:
                break
    with connection.cursor() as cur:  # ended sessions: few, one statement
        cur.execute("DELETE FROM messaging_closedsession WHERE closed_at < now() - make_interval(days => %s)",
                    [settings.REQUEST_RETENTION_DAYS])
    return total
