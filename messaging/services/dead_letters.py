"""Operator actions on the dead-letter queue (used by the admin and the API)."""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction

from messaging.dispatch import routing_enqueue
from messaging.models import DeliveryState, states_sql

DEAD = states_sql(DeliveryState.DEAD)


def dead_letters_requeue(*, delivery_ids: list[int], app_id: int | None = None) -> int:
    """Give dead deliveries a fresh set of attempts and route them again (`app_id` confines the
    action to one app's rows: the REST API's caller)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_delivery SET state = {states_sql(DeliveryState.PENDING)}, attempts = 0, dead_at = NULL,
                   claim = NULL, next_attempt_at = now() + make_interval(secs => %s),
                   last_error = 're-queued by an operator'
             WHERE id = ANY(%s) AND state = {DEAD} AND (%s::bigint IS NULL OR app_id = %s)
            RETURNING id
            """,
            [float(settings.ROUTING_DEADLINE_SECONDS), list(delivery_ids), app_id, app_id],
        )
        ids = [row[0] for row in cur.fetchall()]
        transaction.on_commit(lambda: routing_enqueue(ids))
    return len(ids)


def dead_letters_discard(*, delivery_ids: list[int], app_id: int | None = None) -> int:
    """Give up on dead deliveries for good: they leave the queue as expired (kept for the record)."""
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_delivery SET state = {states_sql(DeliveryState.EXPIRED)}, expired_at = now(),
                   last_error = 'discarded by an operator'
             WHERE id = ANY(%s) AND state = {DEAD} AND (%s::bigint IS NULL OR app_id = %s)
            """,
            [list(delivery_ids), app_id, app_id],
        )
        return cur.rowcount
