"""FETCH_MISSING_MESSAGES: a recipient's undelivered messages, oldest first, in mailbox order."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from messaging.protocol import delivery_frame


@dataclass(frozen=True)
class FetchedItem:
    delivery_id: int
    message_id: int
    frame: str


@dataclass(frozen=True)
class FetchResult:
    items: list[FetchedItem]
    left: int


def missing_fetch(*, app_id: int, user_id: str, count: int, skip_ids: list[int], acks: bool) -> FetchResult:
    """Up to `count` undelivered messages of `user_id`, and how many remain after them.

    `skip_ids` are deliveries this connection already wrote whose "delivered" mark is still on its
    way to the database: they are neither sent twice nor counted as missing. For an ACK-mode
    connection the batch becomes `sent` (its ack timer starts); otherwise the caller marks it
    delivered once the frames are written.
    """
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            """
            SELECT d.id, d.seq, m.id, m.sender, m.kind, m.content, m.reference
              FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
             WHERE d.app_id = %s AND d.recipient = %s AND d.state IN ('pending', 'sent', 'retrying')
               AND NOT (d.id = ANY(%s))
             ORDER BY d.seq
             LIMIT %s
             FOR UPDATE OF d SKIP LOCKED
            """,
            [app_id, user_id, skip_ids, count],
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
            """
            SELECT count(*) FROM messaging_delivery
             WHERE app_id = %s AND recipient = %s AND state IN ('pending', 'sent', 'retrying')
               AND seq > %s AND NOT (id = ANY(%s))
            """,
            [app_id, user_id, last_seq, skip_ids],
        )
        left = cur.fetchone()[0]
        if acks and items:
            cur.execute(
                """
                UPDATE messaging_delivery SET state = 'sent', sent_at = now(), attempts = attempts + 1,
                       next_attempt_at = now() + make_interval(secs => %s)
                 WHERE id = ANY(%s)
                """,
                [settings.DELIVERY_ACK_TIMEOUT, [i.delivery_id for i in items]],
            )
    return FetchResult(items=items, left=left)
