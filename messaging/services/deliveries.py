"""The delivery state machine: pending -> sent -> delivered, with retrying / dead / expired.

Every transition is one conditional UPDATE whose WHERE clause names the states it may leave, so
two actors racing (a worker claiming while a fetch delivers, a duplicate task after a worker
crash) cannot move a row backwards: the loser's UPDATE simply matches nothing.

Batch transitions lock their rows by primary key first (`_lock`), decide which may move, then
update by primary key. A single UPDATE with both `id = ANY(ids)` and a state condition let
Postgres drive the plan from a state index whenever its statistics said "few undelivered rows",
and under a backlog that meant scanning every undelivered row to find a handful of ids: latency
grew with the backlog (seen in the benchmark). Primary-key-only predicates have one plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from messaging.services.persist import confirmations_create


def _lock(cur, ids: list[int], states: tuple[str, ...]) -> list[int]:
    """Lock the rows `ids` (in id order: no deadlock between two batches) and return those in `states`."""
    cur.execute("SELECT id, state FROM messaging_delivery WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                [sorted(set(ids))])
    return [row_id for row_id, state in cur.fetchall() if state in states]


@dataclass(frozen=True)
class ClaimedRow:
    delivery_id: int
    recipient: str
    seq: int
    message_id: int
    sender: str
    kind: str
    content: str
    reference: str
    stored_at: float  # epoch seconds


def deliveries_claim(*, delivery_ids: list[int]) -> list[ClaimedRow]:
    """pending/retrying -> sent (one attempt counted) for the rows this caller wins; returns them
    with what is needed to build their frames.

    One statement: rows are locked by primary key in id order (two overlapping batches cannot
    deadlock, and a duplicate task after a worker crash finds them already `sent`), then updated.
    """
    if not delivery_ids:
        return []
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH locked AS MATERIALIZED (
                SELECT id, state FROM messaging_delivery WHERE id = ANY(%s) ORDER BY id FOR UPDATE
            ), claimed AS (
                UPDATE messaging_delivery d
                   SET state = 'sent', attempts = d.attempts + 1, sent_at = now(),
                       next_attempt_at = now() + make_interval(secs => %s)
                  FROM locked l
                 WHERE d.id = l.id AND l.state IN ('pending', 'retrying')
                RETURNING d.id, d.recipient, d.seq, d.message_id
            )
            SELECT c.id, c.recipient, c.seq, m.id, m.sender, m.kind, m.content, m.reference,
                   extract(epoch FROM m.created_at)::float8
              FROM claimed c JOIN messaging_message m ON m.id = c.message_id
            """,
            [sorted(set(delivery_ids)), settings.DELIVERY_ACK_TIMEOUT],
        )
        return [ClaimedRow(*row) for row in cur.fetchall()]


DELIVERABLE = ("pending", "sent", "retrying", "dead")


def deliveries_mark_delivered(*, delivery_ids: list[int] | None = None, message_ids: list[int] | None = None,
                              recipient: str | None = None) -> int:
    """-> delivered (by delivery id, or by message id for one recipient: an ACK), and send the
    MESSAGE_CONFIRMATIONs that were asked for. Returns how many rows changed."""
    with transaction.atomic(), connection.cursor() as cur:
        if delivery_ids:
            ids = _lock(cur, list(delivery_ids), DELIVERABLE)
        elif message_ids and recipient:
            # Served by the message_id foreign-key index; only the recipient's own rows.
            cur.execute(
                "SELECT id, state FROM messaging_delivery WHERE message_id = ANY(%s) AND recipient = %s "
                "ORDER BY id FOR UPDATE",
                [list(message_ids), recipient],
            )
            ids = [row_id for row_id, state in cur.fetchall() if state in DELIVERABLE]
        else:
            return 0
        if not ids:
            return 0
        cur.execute(
            """
            UPDATE messaging_delivery d
               SET state = 'delivered', delivered_at = now(), next_attempt_at = NULL
              FROM messaging_message m, apps_registry_clientapp a
             WHERE d.id = ANY(%s) AND m.id = d.message_id AND a.id = d.app_id
            RETURNING m.id, d.app_id, d.recipient, m.sender, m.reference,
                      (m.kind = 'direct' AND m.confirmation_requested AND m.reference <> '' AND a.confirmation_enabled)
            """,
            [ids],
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
    with transaction.atomic(), connection.cursor() as cur:
        ids = _lock(cur, list(delivery_ids), ("sent", "retrying", "pending"))
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
             WHERE d.id = ANY(%s) AND a.id = d.app_id
            """,
            [settings.RETRY_MAX_SECONDS, settings.RETRY_BASE_SECONDS, error, ids],
        )


def deliveries_park(*, delivery_ids: list[int]) -> None:
    """The recipient is offline: the row waits in its mailbox for a fetch. The attempt the claim
    counted is given back: being offline is not a failed delivery."""
    if not delivery_ids:
        return
    with transaction.atomic(), connection.cursor() as cur:
        ids = _lock(cur, list(delivery_ids), ("retrying", "sent"))
        cur.execute(
            "UPDATE messaging_delivery SET state = 'pending', next_attempt_at = NULL, attempts = greatest(attempts - 1, 0) "
            "WHERE id = ANY(%s)",
            [ids],
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
        timed_out = _due_ids(cur, "sent", limit)
        deliveries_retry(delivery_ids=timed_out, error="not confirmed within the ack timeout")
        due = _due_ids(cur, "retrying", limit)
    return SweepResult(timed_out=len(timed_out), due=due)


def _due_ids(cur, state: str, limit: int) -> list[int]:
    """Rows in `state` whose timer ran out, oldest first (served by delivery_retry_due)."""
    cur.execute(
        """
        SELECT id FROM messaging_delivery
         WHERE state = %s AND next_attempt_at <= now()
         ORDER BY next_attempt_at LIMIT %s FOR UPDATE SKIP LOCKED
        """,
        [state, limit],
    )
    return [row[0] for row in cur.fetchall()]


def deliveries_pending_for_online(*, users: list[tuple[int, str]], older_than: timedelta) -> list[int]:
    """Pending rows of connected users whose routing task never ran (lost with a crashed process).

    `users` are (app id, user id) pairs; each is looked up through its mailbox index, so the cost
    follows the connected users, not the size of every offline mailbox.
    """
    if not users:
        return []
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT d.id FROM unnest(%s::bigint[], %s::text[]) AS o(app_id, user_id)
              JOIN messaging_delivery d ON d.app_id = o.app_id AND d.recipient = o.user_id
             WHERE d.state = 'pending' AND d.created_at < %s
             ORDER BY d.id LIMIT 5000
            """,
            [[u[0] for u in users], [u[1] for u in users], timezone.now() - older_than],
        )
        return [row[0] for row in cur.fetchall()]


def deliveries_requeue_for_users(*, users: list[tuple[int, str]]) -> list[int]:
    """In-flight pushes to users whose connections died with a node go back to retrying, due now
    (the users' mailbox index serves the lookup)."""
    if not users:
        return []
    with connection.cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_delivery d SET state = 'retrying', next_attempt_at = now(),
                   last_error = 'the node holding the connection died before confirming'
              FROM unnest(%s::bigint[], %s::text[]) AS u(app_id, user_id)
             WHERE d.app_id = u.app_id AND d.recipient = u.user_id AND d.state = 'sent'
            RETURNING d.id
            """,
            [[u[0] for u in users], [u[1] for u in users]],
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
