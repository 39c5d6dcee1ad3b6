"""Writing a reliable message: the message row, a mailbox sequence and a delivery row per
recipient, in one transaction (one statement), before anything is acknowledged. Routing is
queued on commit."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from messaging.dispatch import routing_enqueue
from messaging.models import MessageKind


@dataclass(frozen=True)
class SendResult:
    message_id: int
    delivery_ids: tuple[int, ...]
    duplicate: bool  # the clientMessageId was seen before: nothing new was stored or routed


def message_send(
    *,
    app_id: int,
    sender: str,
    recipients: list[str],
    content: str,
    kind: str = MessageKind.DIRECT,
    reference: str = "",
    confirmation_requested: bool = False,
    client_message_id: str | None = None,
    origin_domain: str = "",
) -> SendResult:
    now = timezone.now()
    # Sorted, de-duplicated recipients: mailbox rows are locked in one global order, so two
    # group messages to overlapping recipient sets cannot deadlock.
    recipients = sorted(set(recipients))
    # One statement, so one round trip and its own transaction: the message, the mailbox
    # sequences (each upsert holds its mailbox row lock until commit, so sequences are gap-free)
    # and the delivery rows commit together or not at all. A repeated clientMessageId inserts no
    # message, and then nothing else either.
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH m AS (
                INSERT INTO messaging_message
                    (app_id, sender, kind, content, reference, confirmation_requested, client_message_id,
                     origin_domain, created_at)
                VALUES (%(app)s, %(sender)s, %(kind)s, %(content)s, %(reference)s, %(confirm)s, %(cmid)s,
                        %(origin)s, %(now)s)
                ON CONFLICT (app_id, sender, client_message_id) WHERE client_message_id IS NOT NULL DO NOTHING
                RETURNING id
            ), mb AS (
                INSERT INTO messaging_mailbox (app_id, user_id, last_seq)
                SELECT %(app)s, r, 1 FROM unnest(%(recipients)s::text[]) AS r WHERE EXISTS (SELECT 1 FROM m)
                ON CONFLICT (app_id, user_id) DO UPDATE SET last_seq = messaging_mailbox.last_seq + 1
                RETURNING user_id, last_seq
            ), d AS (
                INSERT INTO messaging_delivery
                    (message_id, app_id, recipient, seq, state, attempts, last_error, created_at)
                SELECT m.id, %(app)s, mb.user_id, mb.last_seq, 'pending', 0, '', %(now)s FROM m, mb
                RETURNING id
            )
            SELECT (SELECT id FROM m), ARRAY(SELECT id FROM d ORDER BY id)
            """,
            {"app": app_id, "sender": sender, "kind": kind, "content": content, "reference": reference or "",
             "confirm": confirmation_requested, "cmid": client_message_id, "origin": origin_domain, "now": now,
             "recipients": recipients},
        )
        message_id, delivery_ids = cur.fetchone()
        if message_id is None:
            cur.execute(
                "SELECT id FROM messaging_message WHERE app_id = %s AND sender = %s AND client_message_id = %s",
                [app_id, sender, client_message_id],
            )
            return SendResult(message_id=cur.fetchone()[0], delivery_ids=(), duplicate=True)
    delivery_ids = tuple(delivery_ids)
    # Inside a caller's transaction this waits for its commit; otherwise the statement has
    # already committed and routing is queued right away.
    transaction.on_commit(lambda: routing_enqueue(delivery_ids))
    return SendResult(message_id=message_id, delivery_ids=delivery_ids, duplicate=False)


def confirmations_create(*, deliveries: list[tuple[int, int, str, str, str]]) -> list[int]:
    """MESSAGE_CONFIRMATION messages for delivered ones.

    `deliveries` are (message_id, app_id, recipient, original sender, reference). A confirmation
    is itself a reliable message to the original sender; its clientMessageId makes it idempotent
    (a delivery reported twice confirms once).
    """
    created: list[int] = []
    for message_id, app_id, recipient, sender, reference in deliveries:
        result = message_send(
            app_id=app_id, sender=recipient, recipients=[sender], content="", kind=MessageKind.CONFIRMATION,
            reference=reference, client_message_id=f"~confirm:{message_id}",
        )
        created.extend(result.delivery_ids)
    return created
