"""Where a delivery becomes delivered: its frame has left the node (linker clients) or its client
ACKed it (ACK mode), and the sender's MESSAGE_CONFIRMATION is stored in the same statement.

Marks come from web nodes in batches (messaging.gateway.runtime's delivered batcher, fed by each
connection's ledger), or from an ACK the connection did not hold in flight (after a reconnect).
"""

from __future__ import annotations

from django.db import transaction

from foundation.db import hot_cursor
from foundation.handoff import Route, routing_enqueue
from messaging.core.delivery.receipt_queue import receipts_queue
from messaging.core.delivery.sql import DELIVERABLE, DELIVERED, lock_sql
from messaging.core.store import mailbox_append_sql
from messaging.models import MessageKind


def deliveries_mark_delivered(*, delivery_ids: list[int] | None = None, message_ids: list[int] | None = None,
                              recipient: str | None = None, route: Route = routing_enqueue) -> int:
    """-> delivered (by delivery id, or by message id for one recipient: an ACK), and store the
    MESSAGE_CONFIRMATIONs that were asked for, all in one statement; the confirmations go to `route`
    once committed. Returns how many rows changed.

    A delivery reported twice confirms once: only the statement that moves it writes a confirmation
    (and `confirms` is unique besides).
    """
    if delivery_ids:
        lock = lock_sql("id = ANY(%(ids)s::bigint[])")
        params: dict = {"ids": sorted(set(delivery_ids))}
    elif message_ids and recipient:
        # Served by the message_id foreign-key index; only the recipient's own rows.
        lock = lock_sql("message_id = ANY(%(mids)s::bigint[]) AND recipient = %(recipient)s")
        params = {"mids": sorted(set(message_ids)), "recipient": recipient}
    else:
        return 0
    direct, confirmation = MessageKind.DIRECT.value, MessageKind.CONFIRMATION.value
    # One statement in autocommit: it commits by itself, and on_commit runs right after it (or when
    # a caller's transaction commits).
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock}),
            done AS (
                UPDATE messaging_delivery d
                   SET state = {DELIVERED}, delivered_at = now(), next_attempt_at = NULL, claim = NULL
                  FROM locked l
                 WHERE d.id = l.id AND d.state IN {DELIVERABLE}
                RETURNING d.id, d.message_id, d.app_id, d.recipient, d.seq
            ), conf AS MATERIALIZED (
                -- Each sender's confirmations in the order of its messages in the recipient's
                -- mailbox, not of their ids: a message keeps the id of the domain that stored it
                -- first, so one sender's ids jump between blocks across a takeover.
                SELECT (row_number() OVER (ORDER BY m.app_id, m.sender, done.recipient, done.seq))::int AS ord,
                       m.app_id,
                       done.recipient AS sender, '{confirmation}'::text AS kind, ''::text AS content, m.reference,
                       false AS confirm, NULL::text AS cmid, ''::text AS origin, m.id AS confirms, m.sender AS to_user
                  FROM done JOIN messaging_message m ON m.id = done.message_id
                  JOIN apps_registry_clientapp a ON a.id = done.app_id
                 WHERE m.kind = '{direct}' AND m.confirmation_requested AND m.reference <> ''
                   AND a.confirmation_enabled
            ), conf_rcpt AS (
                SELECT ord, to_user AS recipient FROM conf
            ), {mailbox_append_sql("conf", "conf_rcpt")}
            SELECT (SELECT count(*) FROM done), ARRAY(SELECT id FROM new_deliveries ORDER BY id),
                   ARRAY(SELECT done.id FROM done JOIN messaging_message m ON m.id = done.message_id
                          WHERE m.origin_message_id IS NOT NULL)
            """,
            params,
        )
        changed, confirmation_ids, forwarded_ids = cur.fetchone()
        if confirmation_ids:
            ids = list(confirmation_ids)
            transaction.on_commit(lambda: route(ids))
        if forwarded_ids:
            # Messages that came from another domain: their origin learns (messaging.federation.senders.receipts).
            receipts_queue(delivery_ids=forwarded_ids)
    return int(changed)
