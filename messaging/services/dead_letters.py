"""Operator actions on the dead-letter queue (used by the admin and the API)."""

from __future__ import annotations

from django.db import connection, transaction

from messaging.dispatch import routing_enqueue


def dead_letters_requeue(*, delivery_ids: list[int]) -> int:
    """Give dead deliveries a fresh set of attempts and route them again."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery SET state = 'pending', attempts = 0, dead_at = NULL, next_attempt_at = NULL,
                   last_error = 're-queued by an operator'
             WHERE id = ANY(%s) AND state = 'dead'
            RETURNING id
            """,
            [list(delivery_ids)],
        )
        ids = [row[0] for row in cur.fetchall()]
        transaction.on_commit(lambda: routing_enqueue(ids))
    return len(ids)


def dead_letters_discard(*, delivery_ids: list[int]) -> int:
    """Give up on dead deliveries for good: they leave the queue as expired (kept for the record)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery SET state = 'expired', expired_at = now(), last_error = 'discarded by an operator'
             WHERE id = ANY(%s) AND state = 'dead'
            """,
            [list(delivery_ids)],
        )
        return cur.rowcount
