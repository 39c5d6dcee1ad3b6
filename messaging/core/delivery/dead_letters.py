"""Where a delivery is dead-lettered, and what an operator does with the dead-letter queue.

A delivery dies when a failed attempt (messaging.core.delivery.retry) uses up its app's
max_delivery_attempts: `DIES_AT` is that rule, written once, for the statements that count an
attempt. A dead delivery keeps its row (visible in the console and the API) and is announced to
the app's webhooks (`message.dead_lettered`) once the transition has committed.

An operator may re-queue dead letters (a fresh set of attempts, routed again) or discard them (they
leave the queue as expired and stay on record). A late confirmation of a dead letter (its frame
was written, or ACKed, after all) still marks it delivered (messaging.models.DELIVERABLE_STATES).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction

from foundation.handoff import routing_enqueue
from foundation.outbound import out_of_attempts
from messaging.core.delivery.receipt_queue import receipts_queue
from messaging.core.delivery.sql import DEAD, EXPIRED, PENDING
from messaging.models import WebhookEvent
from messaging.webhooks.services import WebhookNotice, webhooks_record

# SQL: true when a delivery whose failed attempts now number `{attempts}` is out of attempts (the
# statement joins the row's app as `a`): the outbound skeleton's one give-up rule.
DIES_AT = out_of_attempts("{attempts}", "a.max_delivery_attempts")


def dead_letters_announce(rows: list[tuple], *, receipts: bool = True) -> None:
    """`message.dead_lettered` for the apps' webhooks, recorded once the transition is committed,
    in one statement for the batch. A failure there is logged, never undoes the transition.
    `rows` are messaging.core.delivery.sql.MOVED_COLUMNS of the deliveries that died.

    With `receipts`, those of messages that came from another domain are reported to their origin
    too: their receipts are queued in the caller's transaction (messaging.core.delivery.receipt_queue)."""
    if not rows:
        return
    if receipts:
        receipts_queue(delivery_ids=[row[0] for row in rows])
    notices = [WebhookNotice(app_id=app_id, event=WebhookEvent.MESSAGE_DEAD_LETTERED.value, data={
        "messageId": str(message_id), "deliveryId": str(delivery_id), "recipient": recipient,
        "attempts": attempts, "lastError": last_error,
    }) for delivery_id, _, app_id, message_id, recipient, attempts, last_error in rows]
    transaction.on_commit(lambda: webhooks_record(notices=notices), robust=True)


def dead_letters_requeue(*, delivery_ids: list[int], app_id: int | None = None) -> int:
    """Give dead deliveries a fresh set of attempts and route them again (`app_id` confines the
    action to one app's rows: the REST API's caller). One that died at another domain is revived
    there too: its row carries `revive` to the next hop, which does the same (messaging.federation)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_delivery SET state = {PENDING}, attempts = 0, dead_at = NULL,
                   claim = NULL, next_attempt_at = now() + make_interval(secs => %s),
                   last_error = 're-queued by an operator', revive = true
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
            UPDATE messaging_delivery SET state = {EXPIRED}, expired_at = now(),
                   last_error = 'discarded by an operator'
             WHERE id = ANY(%s) AND state = {DEAD} AND (%s::bigint IS NULL OR app_id = %s)
            """,
            [list(delivery_ids), app_id, app_id],
        )
        return cur.rowcount
