"""The delivery states as SQL literals, and the row lock every batch transition takes first.

Batch transitions lock their rows by primary key, in id order, before they update them: two
batches never deadlock on deliveries, and (for a recipient, seq order is id order) a fetch locking
a mailbox in seq order takes the same order. Confirmations are written in the statement that marks
their deliveries delivered, locking the senders' mailboxes in (app, user) order after the
deliveries: every statement that takes both kinds of lock takes them in that one global order.

A single UPDATE with both `id = ANY(ids)` and a state condition let Postgres drive the plan from a
state index whenever its statistics said "few undelivered rows", and under a backlog that meant
scanning every undelivered row to find a handful of ids. Locking by primary key first has one plan.
"""

from __future__ import annotations

from messaging.models import (
    CLAIMABLE_STATES,
    DELIVERABLE_STATES,
    EXPIRABLE_STATES,
    UNDELIVERED_STATES,
    DeliveryState,
    states_sql,
)

PENDING = states_sql(DeliveryState.PENDING)
SENT = states_sql(DeliveryState.SENT)
RETRYING = states_sql(DeliveryState.RETRYING)
DELIVERED = states_sql(DeliveryState.DELIVERED)
DEAD = states_sql(DeliveryState.DEAD)
EXPIRED = states_sql(DeliveryState.EXPIRED)
FORWARDING = states_sql(DeliveryState.FORWARDING)
FORWARDED = states_sql(DeliveryState.FORWARDED)
UNDELIVERED = states_sql(UNDELIVERED_STATES)
CLAIMABLE = states_sql(CLAIMABLE_STATES)
DELIVERABLE = states_sql(DELIVERABLE_STATES)
EXPIRABLE = states_sql(EXPIRABLE_STATES)

# What a transition returns about each row it moved, enough to announce the dead ones.
MOVED_COLUMNS = "d.id, d.state, d.app_id, d.message_id, d.recipient, d.attempts, d.last_error"


def in_mailbox_sql(row: str) -> str:
    """SQL: the message of `row` (a relation with message_id and recipient) has a row in its
    recipient's mailbox here, not only this domain's record of passing it on (`forward_to`)."""
    return (f"EXISTS (SELECT 1 FROM messaging_delivery o WHERE o.message_id = {row}.message_id"
            f" AND o.recipient = {row}.recipient AND o.forward_to = '')")


def lock_sql(where: str) -> str:
    """The rows matching `where`, locked by primary key in id order (the CTE every batch
    transition starts with)."""
    return f"SELECT id FROM messaging_delivery WHERE {where} ORDER BY id FOR UPDATE"
