"""Merging copied deliveries into this domain's own mailboxes: what a standby does when it takes a
home's users over (their StandbyCopy rows become messages and deliveries here), what it does with a
copy the home sends while it holds the home's users, and what the home does with the holder's copies
when it gets its users back (messaging.federation.takeover.take).

A message is one message everywhere by where it was stored first and its id there (`origin_domain`,
`origin_message_id`; here, a message stored first here is ('', NULL) and its own id). So a merge is
idempotent, whichever way a message arrived first (a copy, a forwarded message, a copy back):
- a delivery already here for the same message and recipient keeps its place; it takes the copy's
  state only forwards: delivered wins over everything, dead or expired over a state still
  undelivered; nothing is ever undelivered by a copy (an ACK made on one side is never undone);
- a delivery not here yet is appended to the recipient's mailbox (its next seq here, in the order
  of the copies: one sender's messages stay in their order), its message stored once, and it
  takes the copy's state; one still undelivered is routed (pushed, if the user is connected), or
  parked where the user is served elsewhere now (a home merging its holder's changes before the
  hand-back: never forwarded back where it came from);
- each origin's order to each recipient (messaging.federation.order) goes on from the copies: the next
  message from that origin is expected after the last one copied.

A merge feeds nothing on (switchboard.no_copy: the side the copies came from has them already).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings
from django.db import transaction

from foundation.db import hot_cursor
from foundation.handoff import routing_enqueue
from foundation.locks import in_turn
from messaging.core.delivery.sql import DELIVERED, UNDELIVERED
from messaging.core.next_hop import destination
from messaging.core.store import carried_id_sql, deliveries_append_sql
from messaging.federation.order import held_let_go, marks_raise
from messaging.models import DeliveryState

FINAL = (DeliveryState.DELIVERED.value, DeliveryState.DEAD.value, DeliveryState.EXPIRED.value)


@dataclass(frozen=True)
class Copied:
    """One delivery as the other side has it."""

    app_id: int
    recipient: str
    origin_domain: str  # where its message was stored first (never ""), and its id there
    origin_message_id: int
    state: str
    delivered_at: datetime | None = None
    dead_at: datetime | None = None
    expired_at: datetime | None = None
    origin_seq: int | None = None
    message: dict | None = None  # sender, kind, content, reference, confirmation_requested, client_message_id


@dataclass(frozen=True)
class Merged:
    appended: int  # deliveries new here
    states: int  # deliveries that took a copy's final state (the new ones among them)


_IDENTITY_SQL = """
SELECT t.i, m.id
  FROM unnest(%(i)s::int[], %(od)s::text[], %(oid)s::bigint[]) AS t(i, od, oid)
  JOIN messaging_message m ON m.origin_domain = t.od AND m.origin_message_id = t.oid
UNION ALL
SELECT t.i, m.id
  FROM unnest(%(i)s::int[], %(od)s::text[], %(oid)s::bigint[]) AS t(i, od, oid)
  JOIN messaging_message m ON t.od = %(here)s AND m.id = t.oid AND m.origin_message_id IS NULL
"""

# Each keeps its id where it was stored first (carried_id_sql): a message is shown with one id at its
# home, at the standby that took its users over and back home after the hand-back.
_MESSAGES_SQL = f"""
INSERT INTO messaging_message (id, app_id, sender, kind, content, reference, confirmation_requested, client_message_id,
                               origin_domain, origin_message_id, forward_path, confirms_origin, created_at)
SELECT {carried_id_sql("t.oid")}, t.*, '', '', now()
  FROM unnest(%(app)s::bigint[], %(sender)s::text[], %(kind)s::text[], %(content)s::text[], %(ref)s::text[],
              %(confirm)s::bool[], %(cmid)s::text[], %(od)s::text[], %(oid)s::bigint[])
       AS t(app, sender, kind, content, ref, confirm, cmid, od, oid)
ON CONFLICT DO NOTHING
"""

# Mailbox rows (no `forward_to`): a row that is this domain's record of a message it forwarded to
# the recipient's home is not the recipient's mailbox here.
_DELIVERIES_SQL = """
SELECT t.i, d.id, d.state
  FROM unnest(%(i)s::int[], %(mid)s::bigint[], %(rcpt)s::text[]) AS t(i, mid, rcpt)
  JOIN messaging_delivery d ON d.message_id = t.mid AND d.recipient = t.rcpt
 WHERE d.forward_to = ''
"""

_APPEND_SQL = f"""
WITH fan AS (
    SELECT * FROM unnest(%(ord)s::int[], %(mid)s::bigint[], %(app)s::bigint[], %(rcpt)s::text[], %(oseq)s::bigint[])
           AS t(ord, message_id, app_id, recipient, origin_seq)
), {deliveries_append_sql("fan", origin_seq=True)}
SELECT id, message_id FROM new_deliveries
"""

_STATES_SQL = f"""
UPDATE messaging_delivery d
   SET state = t.state, delivered_at = coalesce(t.delivered_at, d.delivered_at), dead_at = t.dead_at,
       expired_at = t.expired_at, next_attempt_at = NULL
  FROM unnest(%(id)s::bigint[], %(state)s::text[], %(delivered_at)s::timestamptz[], %(dead_at)s::timestamptz[],
              %(expired_at)s::timestamptz[]) AS t(id, state, delivered_at, dead_at, expired_at)
 WHERE d.id = t.id AND d.state IS DISTINCT FROM t.state
   AND (t.state = {DELIVERED} OR d.state IN {UNDELIVERED})
"""


_COPIED_SEQS = "SELECT * FROM unnest(%(app)s::bigint[], %(rcpt)s::text[], %(od)s::text[], %(oseq)s::bigint[])"


def _order_marks_raise(copies: list[Copied]) -> list[tuple[int, str, str]]:
    """What the other side put in order (messaging.federation.order) counts as in order here too: the
    next message from each origin to each recipient is expected after the last one copied, not from 1.
    Returns the marks raised that have arrivals held behind them (some may go in now)."""
    return marks_raise(_COPIED_SEQS, {"app": [c.app_id for c in copies], "rcpt": [c.recipient for c in copies],
                                      "od": [c.origin_domain for c in copies], "oseq": [c.origin_seq for c in copies]})


def _folded(copies: list[Copied]) -> list[Copied]:
    """One copy per delivery: a batch may hold a delivery's arrival and its later states (the last
    state is the latest, the message comes from whichever carries it), at its first place."""
    by_key: dict[tuple, Copied] = {}
    for c in copies:
        key = (c.app_id, c.recipient, c.origin_domain, c.origin_message_id)
        first = by_key.get(key)
        by_key[key] = c if first is None else replace(
            c, message=c.message or first.message, origin_seq=c.origin_seq or first.origin_seq)
    return list(by_key.values())


def _message_ids(cur, copies: list[Copied]) -> dict[int, int]:
    cur.execute(_IDENTITY_SQL, {"i": list(range(len(copies))), "od": [c.origin_domain for c in copies],
                                "oid": [c.origin_message_id for c in copies], "here": settings.DOMAIN_NAME})
    return dict(cur.fetchall())


def mailbox_merge(copies: list[Copied]) -> Merged:
    """Merge `copies` (in their order) into the mailboxes here, in the caller's transaction."""
    copies = _folded(copies)
    if not copies:
        return Merged(0, 0)
    with transaction.atomic(), hot_cursor() as cur:
        cur.execute("SELECT set_config('switchboard.no_copy', 'on', true)")
        ids = _message_ids(cur, copies)
        new = [c for i, c in enumerate(copies) if i not in ids and c.message is not None]
        if new:
            m = [c.message for c in new]
            cur.execute(_MESSAGES_SQL, {
                "app": [c.app_id for c in new], "sender": [x["sender"] for x in m],
                "kind": [str(x.get("kind") or "direct")[:16] for x in m], "content": [x["content"] for x in m],
                "ref": [str(x.get("reference") or "")[:256] for x in m],
                "confirm": [bool(x.get("confirmation_requested")) for x in m],
                "cmid": [None for _ in m],  # its clientMessageId was the sender's, deduplicated where it sent
                "od": [c.origin_domain for c in new], "oid": [c.origin_message_id for c in new]})
            ids = _message_ids(cur, copies)
        known = [i for i in range(len(copies)) if i in ids]
        # The messages' rows locked first, in id order, as the forward intake locks them
        # (messaging.federation.inbound): a merge and an intake bringing one message at once are taken
        # one after the other, and the second sees the first's delivery (no second mailbox row).
        cur.execute("SELECT id FROM messaging_message WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                    [sorted({ids[i] for i in known})])
        cur.execute(_DELIVERIES_SQL, {"i": known, "mid": [ids[i] for i in known],
                                      "rcpt": [copies[i].recipient for i in known]})
        here = {i: (delivery, state) for i, delivery, state in cur.fetchall()}
        append = [i for i in known if i not in here]
        appended: dict[int, int] = {}
        if append:
            cur.execute(_APPEND_SQL, {"ord": append, "mid": [ids[i] for i in append],
                                      "app": [copies[i].app_id for i in append],
                                      "rcpt": [copies[i].recipient for i in append],
                                      "oseq": [copies[i].origin_seq for i in append]})
            by_message = {}
            for delivery, message in cur.fetchall():
                by_message.setdefault(message, []).append(delivery)
            # One message may go to several recipients here (a group): match each by recipient.
            cur.execute("SELECT id, message_id, recipient FROM messaging_delivery WHERE id = ANY(%s)",
                        [[d for ds in by_message.values() for d in ds]])
            where = {(message, recipient): delivery for delivery, message, recipient in cur.fetchall()}
            appended = {i: where[(ids[i], copies[i].recipient)] for i in append}
        final = [(here[i][0] if i in here else appended[i], copies[i]) for i in known
                 if copies[i].state in FINAL and (i in appended or here[i][1] != copies[i].state)]
        states = 0
        if final:
            cur.execute(_STATES_SQL, {"id": [d for d, _ in final], "state": [c.state for _, c in final],
                                      "delivered_at": [c.delivered_at for _, c in final],
                                      "dead_at": [c.dead_at for _, c in final],
                                      "expired_at": [c.expired_at for _, c in final]})
            states = cur.rowcount
        behind = _order_marks_raise(copies)
        cur.execute("SELECT set_config('switchboard.no_copy', '', true)")
        # What waited for a message this merge brought (an arrival held for its origin's order) goes
        # in now, fed on as any arrival (no_copy is off again): it waited NETWORK_ORDER_WAIT_SECONDS
        # for a gap the merge had filled (46 s in a fault run, after the sender's later messages).
        if let_go := held_let_go(behind):
            transaction.on_commit(lambda: routing_enqueue(let_go))
        waiting = [i for i in appended if copies[i].state not in FINAL]
        # Served elsewhere now (a home merging its holder's changes while still held): parked, its
        # mailbox for when the user is back, never forwarded (the copy came from where it is served).
        elsewhere = {i for i in waiting if destination(copies[i].recipient) is not None}
        if elsewhere:
            cur.execute("UPDATE messaging_delivery SET next_attempt_at = NULL WHERE id = ANY(%s)",
                        [[appended[i] for i in elsewhere]])
        to_route = [appended[i] for i in waiting if i not in elsewhere]
        if to_route:
            transaction.on_commit(lambda: routing_enqueue(to_route))
    return Merged(appended=len(appended), states=states)


def subscriptions_merge(subs: list[dict]) -> None:
    """Durable subscriptions made or ended on the other side, made or ended here (fed on to no one)."""
    with transaction.atomic(), hot_cursor() as cur:
        cur.execute("SELECT set_config('switchboard.no_copy', 'on', true)")
        for sub in subs:  # in order: one made and ended ends ended
            if sub["subscribed"]:
                cur.execute("INSERT INTO messaging_subscription (app_id, subscriber, channel, created_at)"
                            " VALUES (%s, %s, %s, now()) ON CONFLICT DO NOTHING",
                            [sub["app_id"], sub["subscriber"], sub["channel"]])
            else:
                cur.execute("DELETE FROM messaging_subscription WHERE app_id = %s AND subscriber = %s"
                            " AND channel = %s", [sub["app_id"], sub["subscriber"], sub["channel"]])
        cur.execute("SELECT set_config('switchboard.no_copy', '', true)")


def handback_in_turn(home: str, holder: str) -> None:
    """In the caller's transaction, at a home: one at a time, what puts into its mailboxes the rows of
    the users `holder` gives back (the hand-back's merge here, `given_back`, the late look after it).
    Each looks for the message's row in the mailbox before it adds one; two at once did not see each
    other's, and a message stood twice in a mailbox (once in a fault run)."""
    in_turn(f"handback:{home}:{holder}")
