"""FETCH_MISSING_MESSAGES_REQUEST: a recipient's undelivered messages, oldest first, in exact mailbox order."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from foundation.db import hot_cursor
from messaging.core.delivery.sql import SENT, UNDELIVERED
from messaging.core.protocol import delivery_frame


@dataclass(frozen=True)
class FetchedItem:
    delivery_id: int
    message_id: int
    frame: str


@dataclass(frozen=True)
class FetchResult:
    items: list[FetchedItem]
    left: int


def missing_fetch(*, app_id: int, user_id: str, count: int, skip_ids: list[int], claim: int | None = None,
                  max_bytes: int | None = None) -> FetchResult:
    """Up to `count` undelivered messages of `user_id` in mailbox order (and at most about
    `max_bytes` of content, at least one message), and exactly how many remain after them.

    `skip_ids` are deliveries this connection already holds (written, or in flight to it): they are
    neither sent twice nor counted as missing. Nothing is skipped for being locked: a row a worker
    is claiming right now is waited for, so the answer has no holes.

    With `claim` (an ACK-mode connection) the batch becomes `sent` under that claim and its ACK
    timer starts; no attempt is counted (only a failure counts). Without it the rows are read as
    they are, and the caller marks them delivered once their frames have left the node.
    """
    max_bytes = max_bytes or settings.FETCH_MAX_BYTES
    lock = "FOR UPDATE OF d" if claim is not None else ""
    with transaction.atomic(), hot_cursor() as cur:
        # The running total of content sizes bounds the batch's memory before any content is read
        # (octet_length comes from the TOAST header, not the value).
        cur.execute(
            f"""
            WITH head AS (
                SELECT d.id, d.seq, sum(octet_length(m.content)) OVER (ORDER BY d.seq) AS upto,
                       octet_length(m.content) AS size
                  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
                 WHERE d.app_id = %(app)s AND d.recipient = %(user)s AND d.state IN {UNDELIVERED}
                   AND NOT (d.id = ANY(%(skip)s::bigint[]))
                 ORDER BY d.seq LIMIT %(count)s
            )
            SELECT d.id, d.seq FROM messaging_delivery d JOIN head h ON h.id = d.id
             WHERE h.upto - h.size < %(max_bytes)s
             ORDER BY d.seq {lock}
            """,
            {"app": app_id, "user": user_id, "skip": skip_ids, "count": count, "max_bytes": max_bytes},
        )
        picked = [row[0] for row in cur.fetchall()]
        if claim is not None and picked:
            cur.execute(
                f"""
                UPDATE messaging_delivery SET state = {SENT}, claim = %s, sent_at = now(),
                       next_attempt_at = now() + make_interval(secs => %s)
                 WHERE id = ANY(%s::bigint[]) AND state IN {UNDELIVERED}
                RETURNING id
                """,
                [claim, float(settings.DELIVERY_ACK_TIMEOUT), picked],
            )
            picked = sorted(row[0] for row in cur.fetchall())
        rows = []
        if picked:
            cur.execute(
                """
                SELECT d.id, d.seq, m.id, m.sender, m.kind, m.content, m.reference
                  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
                 WHERE d.id = ANY(%s::bigint[]) ORDER BY d.seq
                """,
                [picked],
            )
            rows = cur.fetchall()
        items = [
            FetchedItem(delivery_id=r[0], message_id=r[2],
                        frame=delivery_frame(kind=r[4], sender=r[3], content=r[5], reference=r[6],
                                             message_id=r[2], seq=r[1]))
            for r in rows
        ]
        last_seq = rows[-1][1] if rows else -1
        cur.execute(
            f"""
            SELECT count(*) FROM messaging_delivery
             WHERE app_id = %s AND recipient = %s AND state IN {UNDELIVERED} AND seq > %s AND NOT (id = ANY(%s::bigint[]))
            """,
            [app_id, user_id, last_seq, skip_ids],
        )
        left = cur.fetchone()[0]
    return FetchResult(items=items, left=left)
