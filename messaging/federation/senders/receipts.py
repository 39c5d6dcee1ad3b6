"""Receipts: how a message's origin domain learns that a forwarded delivery was delivered (or died)
at the recipient's home domain.

When a delivery of a message that came from another domain becomes delivered (messaging.core.delivery.
delivered) or dead (messaging.core.delivery.dead_letters) here, a receipt

    {"origin_domain", "origin_message_id", "recipient", "state": "delivered" | "dead", "at",
     "domain": where it happened, "error"}

travels back towards the origin, in the `receipts` list of the same signed
/internal/v1/forward call messages use. Every domain on the way that holds the message (a copy, or
the original) moves its `forwarding`/`forwarded` row for that recipient to delivered (delivered_at =
`at`) or dead (last_error "dead at domain-03: ..."), and passes the receipt on until the origin.

A receipt waits in a table on the link to its next hop (ReceiptForward, written in the transaction
of the state change: messaging.core.delivery.receipt_queue) and leaves through `ReceiptSender`, the link's
receipt sender on the outbound skeleton (foundation.outbound): one sender per link, held back by the
link's backoff, batches bounded by rows and bytes. A receipt is never dropped after some number of
retries: while its link fails it waits (the console lists it), and the sweep moves it to another
path when its link is down for long (messaging.federation.senders.queue). A receipt carries its `path` (the
domains it passed through) and never goes back to one of them: where the only way on is back, it
waits where it is until a way forward opens, so receipts whose origin is away wait rather than
circulate; past FORWARD_HOP_LIMIT it is applied but not passed on. Domains on the message's path
that are not on the receipt's way back keep `forwarded`.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils.dateparse import parse_datetime

from foundation.db import hot_cursor
from foundation.outbound import Batch, CallFailed, Failed, Limits, Outcome, Settled, send_batches
from messaging.core.delivery.dead_letters import dead_letters_announce
from messaging.core.delivery.receipt_queue import receipts_queue_items
from messaging.core.delivery.sql import DEAD, DELIVERED, MOVED_COLUMNS, lock_sql, states_sql
from messaging.federation.links import LinkQueueSender, link_failed, link_succeeded
from messaging.federation.models import ReceiptForward
from messaging.federation.wire.transport import FORWARD_PATH, PeerRefused, peer_call
from messaging.models import DeliveryState

log = logging.getLogger(__name__)

WAITING = states_sql((DeliveryState.FORWARDING.value, DeliveryState.FORWARDED.value))
RECEIPT_STATES = (DeliveryState.DELIVERED.value, DeliveryState.DEAD.value)


def receipt_parse(ord_: int, item, *, sender: str) -> dict:
    """A receipt of a call from `sender`, checked (PeerRefused 400 otherwise). Its `path` (the
    domains it passed through, ending with the caller) is [sender] where a caller sends none."""
    where = f"receipts[{ord_}]"
    if not isinstance(item, dict):
        raise PeerRefused(400, f"{where} must be an object")
    path = item.get("path", [sender])
    if (not isinstance(path, list) or not path or len(path) > 64
            or not all(isinstance(d, str) and d and len(d) <= 64 and "," not in d for d in path)):
        raise PeerRefused(400, f"{where}: path must be a non-empty list of domain names")
    if path[-1] != sender:
        raise PeerRefused(400, f"{where}: path must end with the calling domain ({sender})")
    for key, max_len in (("origin_domain", 64), ("recipient", 96), ("domain", 64), ("at", 64)):
        if not isinstance(item.get(key), str) or not item[key] or len(item[key]) > max_len:
            raise PeerRefused(400, f"{where}: {key} must be a non-empty string of at most {max_len} characters")
    oid = item.get("origin_message_id")
    if not isinstance(oid, int) or isinstance(oid, bool) or oid < 1:
        raise PeerRefused(400, f"{where}: origin_message_id must be a positive whole number")
    if item.get("state") not in RECEIPT_STATES:
        raise PeerRefused(400, f"{where}: state must be delivered or dead")
    if not isinstance(item.get("error", ""), str):
        raise PeerRefused(400, f"{where}: error must be a string")
    at = parse_datetime(item["at"])
    if at is None or at.tzinfo is None:
        raise PeerRefused(400, f"{where}: at must be an ISO 8601 time with its offset")
    return {"origin_domain": item["origin_domain"], "origin_message_id": oid, "recipient": item["recipient"],
            "state": item["state"], "at": item["at"], "domain": item["domain"], "error": item.get("error", "")[:400],
            "path": path}


def receipts_apply(items: list[dict]) -> int:
    """Apply receipts that reached this domain (inside the caller's transaction): the rows of the
    message here for that recipient that still wait on a link move to delivered or dead (a dead one
    to delivered too: a late ACK at the home domain counts there, so here as well); receipts
    whose origin is elsewhere are queued on towards it in the same transaction. Returns the rows moved."""
    if not items:
        return 0
    here = settings.DOMAIN_NAME
    moved_rows: list[tuple] = []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH r AS (
                SELECT * FROM unnest(%(origin)s::text[], %(oid)s::bigint[], %(recipient)s::text[], %(state)s::text[],
                                     %(at)s::timestamptz[], %(error)s::text[])
                       AS t(origin, oid, recipient, state, at, error)
            ), target AS MATERIALIZED (
                SELECT d.id, r.state, r.at, r.error FROM r
                  JOIN messaging_message m
                    ON (m.origin_domain = r.origin AND m.origin_message_id = r.oid)
                    OR (r.origin = %(here)s AND m.id = r.oid AND m.origin_message_id IS NULL)
                  JOIN messaging_delivery d ON d.message_id = m.id AND d.recipient = r.recipient
                 WHERE d.state IN {WAITING} OR (r.state = {DELIVERED} AND d.state = {DEAD})
            ), locked AS MATERIALIZED ({lock_sql("id IN (SELECT id FROM target)")})
            UPDATE messaging_delivery d
               SET state = t.state, next_attempt_at = NULL, claim = NULL,
                   delivered_at = CASE WHEN t.state = {DELIVERED} THEN t.at ELSE d.delivered_at END,
                   dead_at = CASE WHEN t.state = {DEAD} THEN now() ELSE d.dead_at END,
                   last_error = CASE WHEN t.state = {DEAD} THEN left(t.error, 500) ELSE d.last_error END
              FROM locked l, target t
             WHERE d.id = l.id AND t.id = d.id AND (d.state IN {WAITING} OR (t.state = {DELIVERED} AND d.state = {DEAD}))
            RETURNING {MOVED_COLUMNS}
            """,
            {"origin": [r["origin_domain"] for r in items], "oid": [r["origin_message_id"] for r in items],
             "recipient": [r["recipient"] for r in items], "state": [r["state"] for r in items],
             "at": [parse_datetime(r["at"]) for r in items],
             "error": [f"dead at {r['domain']}: {r['error']}" if r["state"] == DeliveryState.DEAD.value else ""
                       for r in items],
             "here": here},
        )
        moved_rows = cur.fetchall()
    # The sender's app hears of a dead letter where the sender is: at the origin.
    dead_here = [r for r in moved_rows if r[1] == DeliveryState.DEAD.value]
    if dead_here:
        _announce_at_origin(dead_here, items)
    receipts_queue_items(items)
    return len(moved_rows)


def _announce_at_origin(rows: list[tuple], items: list[dict]) -> None:
    here = settings.DOMAIN_NAME
    if any(r["origin_domain"] == here for r in items):
        with hot_cursor() as cur:
            cur.execute("SELECT id FROM messaging_message WHERE id = ANY(%s::bigint[]) AND origin_message_id IS NULL",
                        [[r[3] for r in rows]])
            local = {row[0] for row in cur.fetchall()}
        dead_letters_announce([r for r in rows if r[3] in local], receipts=False)


# --- the link's receipt sender -----------------------------------------------------------------

ROW_BYTES = 400  # what a receipt counts towards FORWARD_BATCH_BYTES


def receipt_lock_key(peer: str) -> str:
    return ReceiptSender(peer).lock_key


class ReceiptSender(LinkQueueSender):
    """The receipts waiting on the link to `peer`, on the outbound skeleton."""

    name = "receipts"

    def take(self, limits: Limits) -> Batch[ReceiptForward]:
        rows = list(ReceiptForward.objects.filter(peer=self.peer).order_by("id")[:limits.rows])
        kept = limits.cut([ROW_BYTES] * len(rows))
        return Batch(items=rows[:kept], drained=limits.drained(fetched=len(rows), kept=kept))

    def send(self, batch: Batch[ReceiptForward]) -> dict:
        return peer_call(peer=self.peer, path=FORWARD_PATH, payload={"receipts": [r.as_payload() for r in batch.items]})

    def settle(self, batch: Batch[ReceiptForward], answer: dict) -> Settled:
        sent, _ = ReceiptForward.objects.filter(pk__in=[r.pk for r in batch.items], peer=self.peer).delete()
        link_succeeded(peer=self.peer, forwarded=sent)
        return Settled(sent=sent)

    def fail(self, batch: Batch[ReceiptForward], error: CallFailed) -> Failed:
        """An attempt counted, the reason kept; the receipts wait for the link's retry."""
        with transaction.atomic():
            failed = ReceiptForward.objects.filter(pk__in=[r.pk for r in batch.items], peer=self.peer).update(
                attempts=F("attempts") + 1, last_error=error.reason)
        health = link_failed(peer=self.peer, error=error.reason, answered=error.status is not None)
        return Failed(failed=failed, retry_at=health.retry_at)


def receipts_link_send(*, peer: str) -> Outcome:
    """Send the receipts waiting on the link to `peer` until none is left, the link fails, or its
    backoff holds it back."""
    return send_batches(ReceiptSender(peer), budget_seconds=settings.FORWARD_TASK_BUDGET_SECONDS)
