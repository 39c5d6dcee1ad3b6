"""Receipts queued on the links towards their origin domains (messaging.federation.senders.receipts says what a
receipt is and what the origin does with it).

`receipts_queue(delivery_ids=)` is called where a delivery becomes delivered or dead, inside the
statement's transaction: the receipts of those deliveries whose message came from another domain
are written as ReceiptForward rows on the link to their next hop, in the same transaction, so a
receipt is never lost between the state change and its sending. `receipts_queue_items` does the same
for receipts passing through (taken in by messaging.federation.inbound). The link's receipt sender is
woken once the transaction commits; the sweep wakes it again when its retry is due.

This module sits low (it imports no delivery code), so the delivery transitions can call it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.utils.dateparse import parse_datetime

from foundation.db import hot_cursor
from foundation.handoff import receipt_links_kick
from messaging.core.delivery.sql import DEAD, DELIVERED
from messaging.core.next_hop import receipt_next_hop
from messaging.models import DeliveryState

log = logging.getLogger(__name__)


def receipts_of(delivery_ids: Iterable[int]) -> list[dict]:
    """The receipts of deliveries here (delivered or dead) whose message came from another domain."""
    ids = sorted(set(delivery_ids))
    if not ids:
        return []
    here = settings.DOMAIN_NAME
    with hot_cursor() as cur:
        cur.execute(
            f"""
            SELECT m.origin_domain, m.origin_message_id, d.recipient, d.state,
                   coalesce(d.delivered_at, d.dead_at, now()), d.last_error
              FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
             WHERE d.id = ANY(%s::bigint[]) AND m.origin_message_id IS NOT NULL AND d.state IN ({DELIVERED}, {DEAD})
            """,
            [ids],
        )
        rows = cur.fetchall()
    return [{"origin_domain": origin, "origin_message_id": oid, "recipient": recipient, "state": state,
             "at": at.isoformat(), "domain": here, "error": error if state == DeliveryState.DEAD.value else ""}
            for origin, oid, recipient, state, at, error in rows]


def receipts_queue_items(items: list[dict]) -> int:
    """Queue receipts (receipt_parse's dicts) on the links to their next hops, in the caller's
    transaction; those whose origin is this domain have arrived and are skipped, and so are those
    that made FORWARD_HOP_LIMIT hops (a receipt only ever goes forward, so that takes a network
    larger than the limit allows). Returns how many were queued."""
    here = settings.DOMAIN_NAME
    passing = [(r, ",".join([*r.get("path", []), here])) for r in items if r["origin_domain"] != here]
    over = [r for r, path in passing if path.count(",") + 1 > settings.FORWARD_HOP_LIMIT]
    if over:
        log.warning("%d receipt(s) past the hop limit (%d) not passed on, e.g. %s", len(over),
                    settings.FORWARD_HOP_LIMIT, over[0])
    queued = [(r, path) for r, path in passing if path.count(",") + 1 <= settings.FORWARD_HOP_LIMIT]
    if not queued:
        return 0
    ways = {(r["origin_domain"], path) for r, path in queued}
    hops = {(origin, path): receipt_next_hop(origin, path.split(",")) for origin, path in ways}
    with hot_cursor() as cur:
        cur.execute(
            """
            INSERT INTO messaging_receiptforward (peer, origin_domain, origin_message_id, recipient, state, at,
                                                  domain, error, path, attempts, last_error, created_at)
            SELECT t.peer, t.origin, t.oid, t.recipient, t.state, t.at, t.domain, left(t.error, 400), t.path, 0, '',
                   now()
              FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::timestamptz[], %s::text[],
                          %s::text[], %s::text[]) AS t(peer, origin, oid, recipient, state, at, domain, error, path)
            """,
            [[hops[r["origin_domain"], path] for r, path in queued], [r["origin_domain"] for r, _ in queued],
             [r["origin_message_id"] for r, _ in queued], [r["recipient"] for r, _ in queued],
             [r["state"] for r, _ in queued],
             [parse_datetime(r["at"]) if isinstance(r["at"], str) else r["at"] for r, _ in queued],
             [r["domain"] for r, _ in queued], [r.get("error", "") for r, _ in queued], [path for _, path in queued]],
        )
    peers = sorted({p for p in hops.values() if p})
    if peers:
        transaction.on_commit(lambda: receipt_links_kick(peers))
    return len(queued)


def receipts_queue(*, delivery_ids: Iterable[int]) -> int:
    """Queue the receipts of these deliveries (those that came from another domain and are now
    delivered or dead), in the caller's transaction."""
    return receipts_queue_items(receipts_of(delivery_ids))
