"""The delivery state machine: pending -> sent -> delivered, with retrying / dead / expired.

Every transition is one conditional UPDATE whose WHERE clause names the states it may leave, so
two actors racing (a worker claiming while a fetch delivers, a duplicate task after a worker
crash) cannot move a row backwards: the loser's UPDATE simply matches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from messaging.services.persist import confirmations_create


@dataclass(frozen=True)
class RoutingRow:
    delivery_id: int
    recipient: str
    state: str
    seq: int
    message_id: int
    sender: str
    kind: str
    content: str
    reference: str
    app_id: int


def deliveries_for_routing(delivery_ids: list[int]) -> list[RoutingRow]:
    """The rows a routing task may push: still pending or due for a retry."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT d.id, d.recipient, d.state, d.seq, m.id, m.sender, m.kind, m.content, m.reference, d.app_id
            FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
            WHERE d.id = ANY(%s) AND d.state IN ('pending', 'retrying')
            """,
            [list(delivery_ids)],
        )
        return [RoutingRow(*row) for row in cur.fetchall()]


def deliveries_claim(*, delivery_ids: list[int], nodes: list[str]) -> set[int]:
    """pending/retrying -> sent, one attempt counted; returns the ids this caller won."""
    if not delivery_ids:
        return set()
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery d
               SET state = 'sent', attempts = d.attempts + 1, sent_at = now(),
                   next_attempt_at = now() + make_interval(secs => %s), last_node = c.node
              FROM unnest(%s::bigint[], %s::text[]) AS c(id, node)
             WHERE d.id = c.id AND d.state IN ('pending', 'retrying')
            RETURNING d.id
            """,
            [settings.DELIVERY_ACK_TIMEOUT, list(delivery_ids), list(nodes)],
        )
        return {row[0] for row in cur.fetchall()}


def deliveries_mark_delivered(*, delivery_ids: list[int] | None = None, message_ids: list[int] | None = None,
                              recipient: str | None = None) -> int:
    """-> delivered (by delivery id, or by message id for one recipient: an ACK), and send the
    MESSAGE_CONFIRMATIONs that were asked for. Returns how many rows changed."""
    if delivery_ids:
        where, params = "d.id = ANY(%s)", [list(delivery_ids)]
    elif message_ids and recipient:
        where, params = "d.message_id = ANY(%s) AND d.recipient = %s", [list(message_ids), recipient]
    else:
        return 0
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_delivery d
               SET state = 'delivered', delivered_at = now(), next_attempt_at = NULL
              FROM messaging_message m, apps_registry_clientapp a
             WHERE {where} AND m.id = d.message_id AND a.id = d.app_id
               AND d.state IN ('pending', 'sent', 'retrying', 'dead')
            RETURNING m.id, d.app_id, d.recipient, m.sender, m.reference,
                      (m.kind = 'direct' AND m.confirmation_requested AND m.reference <> '' AND a.confirmation_enabled)
            """,  # noqa: S608 (the WHERE fragment is one of two constants above)
            params,
        )
        rows = cur.fetchall()
        confirm = [row[:5] for row in rows if row[5]]
        if confirm:
            confirmations_create(deliveries=confirm)
    return len(rows)


def deliveries_retry(*, delivery_ids: list[int], error: str) -> None:
    """A push failed or timed out: retry later with exponential backoff and jitter, or give up
    (dead letter) once the app's max attempts are used."""
    if not delivery_ids:
        return
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery d
               SET state = CASE WHEN d.attempts >= a.max_delivery_attempts THEN 'dead' ELSE 'retrying' END,
                   dead_at = CASE WHEN d.attempts >= a.max_delivery_attempts THEN now() ELSE NULL END,
                   next_attempt_at = CASE WHEN d.attempts >= a.max_delivery_attempts THEN NULL
                       ELSE now() + make_interval(secs => least(%s, %s * power(2, greatest(d.attempts - 1, 0)))
                                                        * (0.5 + random() * 0.5)) END,
                   last_error = left(%s, 500)
              FROM apps_registry_clientapp a
             WHERE d.id = ANY(%s) AND a.id = d.app_id AND d.state IN ('sent', 'retrying', 'pending')
            """,
            [settings.RETRY_MAX_SECONDS, settings.RETRY_BASE_SECONDS, error, list(delivery_ids)],
        )


def deliveries_park(*, delivery_ids: list[int]) -> None:
    """The recipient is offline: the row waits in the mailbox for a fetch (no attempt counted)."""
    if not delivery_ids:
        return
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery SET state = 'pending', next_attempt_at = NULL
             WHERE id = ANY(%s) AND state IN ('retrying', 'sent')
            """,
            [list(delivery_ids)],
        )


@dataclass(frozen=True)
class SweepResult:
    timed_out: int
    due: list[int]


def deliveries_sweep(*, limit: int = 5000) -> SweepResult:
    """Find what is stuck: pushes never confirmed (-> retrying or dead) and retries now due.

    Rows are claimed with SKIP LOCKED so two sweeps (two beat ticks overlapping, or a manual run)
    never handle the same row.
    """
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            """
            SELECT id FROM messaging_delivery
             WHERE state = 'sent' AND next_attempt_at <= now()
             ORDER BY next_attempt_at LIMIT %s FOR UPDATE SKIP LOCKED
            """,
            [limit],
        )
        timed_out = [row[0] for row in cur.fetchall()]
        deliveries_retry(delivery_ids=timed_out, error="not confirmed within the ack timeout")
        cur.execute(
            """
            SELECT id FROM messaging_delivery
             WHERE state = 'retrying' AND next_attempt_at <= now()
             ORDER BY next_attempt_at LIMIT %s FOR UPDATE SKIP LOCKED
            """,
            [limit],
        )
        due = [row[0] for row in cur.fetchall()]
    return SweepResult(timed_out=len(timed_out), due=due)


def deliveries_pending_for_online(*, user_ids: list[str], older_than: timedelta) -> list[int]:
    """Pending rows of connected users whose routing task never ran (lost with a crashed process)."""
    if not user_ids:
        return []
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT id FROM messaging_delivery
             WHERE state = 'pending' AND recipient = ANY(%s) AND created_at < %s
             ORDER BY id LIMIT 5000
            """,
            [user_ids, timezone.now() - older_than],
        )
        return [row[0] for row in cur.fetchall()]


def deliveries_requeue_from_node(*, node_id: str) -> list[int]:
    """In-flight pushes to a node that died go back to retrying, due now."""
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery SET state = 'retrying', next_attempt_at = now(),
                   last_error = 'node ' || %s || ' died before confirming'
             WHERE state = 'sent' AND last_node = %s
            RETURNING id
            """,
            [node_id, node_id],
        )
        return [row[0] for row in cur.fetchall()]


def deliveries_unacked_for(*, app_id: int, user_id: str) -> list[int]:
    """What an ACK-mode user was sent but never acknowledged: redelivered on reconnect."""
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery SET state = 'retrying', next_attempt_at = now()
             WHERE app_id = %s AND recipient = %s AND state IN ('sent', 'retrying')
            RETURNING id
            """,
            [app_id, user_id],
        )
        return [row[0] for row in cur.fetchall()]


def deliveries_expire() -> int:
    """Undelivered rows older than their app's retention become expired."""
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery d SET state = 'expired', expired_at = now(), next_attempt_at = NULL
              FROM apps_registry_clientapp a
             WHERE a.id = d.app_id AND d.state IN ('pending', 'sent', 'retrying')
               AND d.created_at < now() - make_interval(days => a.retention_days)
            """
        )
        return cur.rowcount
