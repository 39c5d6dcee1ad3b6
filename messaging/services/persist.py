"""Writing a reliable message: the message row, a mailbox sequence and a delivery row per
recipient, in one transaction, before anything is acknowledged. Routing is queued on commit."""

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
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO messaging_message
                (app_id, sender, kind, content, reference, confirmation_requested, client_message_id,
                 origin_domain, created_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (app_id, sender, client_message_id) WHERE client_message_id IS NOT NULL DO NOTHING
            RETURNING id
            """,
            [app_id, sender, kind, content, reference or "", confirmation_requested, client_message_id,
             origin_domain, now],
        )
        row = cur.fetchone()
        if row is None:
            cur.execute(
                "SELECT id FROM messaging_message WHERE app_id = %s AND sender = %s AND client_message_id = %s",
                [app_id, sender, client_message_id],
            )
            return SendResult(message_id=cur.fetchone()[0], delivery_ids=(), duplicate=True)
        message_id = row[0]
        # The upsert takes each mailbox row's lock until commit: sequences are gap-free.
        cur.execute(
            """
            INSERT INTO messaging_mailbox (app_id, user_id, last_seq)
            SELECT %s, r, 1 FROM unnest(%s::text[]) AS r
            ON CONFLICT (app_id, user_id) DO UPDATE SET last_seq = messaging_mailbox.last_seq + 1
            RETURNING user_id, last_seq
            """,
            [app_id, recipients],
        )
        seqs = cur.fetchall()
        cur.execute(
            """
            INSERT INTO messaging_delivery
                (message_id, app_id, recipient, seq, state, attempts, last_node, last_error, created_at)
            SELECT %s, %s, r.user_id, r.seq, 'pending', 0, '', '', %s
            FROM unnest(%s::text[], %s::bigint[]) AS r(user_id, seq)
            RETURNING id
            """,
            [message_id, app_id, now, [s[0] for s in seqs], [s[1] for s in seqs]],
        )
        delivery_ids = tuple(r[0] for r in cur.fetchall())
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
