"""A link's sender: the deliveries queued on the link to one neighbour, sent in calls of up to
FORWARD_BATCH_SIZE, in each recipient's mailbox order.

`link_forward(peer=)` (task messaging.tasks.forward_link, safe twice) drains the link's queue:
take the oldest rows (by (app, recipient, seq): the partial index delivery_link_queue), build one
payload in which a message with several recipients on this link goes once with its recipients, and
POST it (messaging.network.transport.peer_call). The neighbour stores everything before it answers,
so on success the rows are `forwarded` (it has them; the home domain's receipt later makes them
delivered or dead, messaging.network.receipts). On failure the link is marked down with backoff
(links.link_failed) and every row of the batch counts a failed attempt; those out of the app's
attempts are dead with the reason, the others wait on the link, in order, until its retry is due
(the sweep, messaging.network.queue, wakes the link then, or moves the queue to another path).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.utils import timezone

from foundation.db import hot_cursor
from messaging.delivery.dead_letters import dead_letters_announce
from messaging.delivery.sql import DEAD, MOVED_COLUMNS, lock_sql, states_sql
from messaging.models import DeliveryState
from messaging.network.links import link_failed, link_succeeded
from messaging.network.models import LinkHealth
from messaging.network.transport import FORWARD_PATH, PeerError, peer_call

log = logging.getLogger(__name__)

FORWARDING = states_sql(DeliveryState.FORWARDING)
FORWARDED = states_sql(DeliveryState.FORWARDED)
# Advisory lock keys: (this class, hashtext(peer)). A class of our own keeps the key space apart from
# any other advisory lock of the project.
LINK_LOCK_CLASS = 18_001


@contextmanager
def link_lock(peer: str) -> Iterator[bool]:
    """The link's sender lock (a session-level Postgres advisory lock on this thread's connection),
    yielding whether it was taken. Only one sender per link at a time: two senders draining one
    queue would post overlapping batches concurrently, and the neighbour could store a recipient's
    later messages before its earlier ones (the order of one sender's messages to one recipient
    must be kept across domains). A worker that dies loses its connection, and the lock with it."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [LINK_LOCK_CLASS, peer])
        held = bool(cur.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [LINK_LOCK_CLASS, peer])


@dataclass
class Queued:
    delivery_id: int
    recipient: str
    app_id: int
    message_id: int
    message: dict  # the payload item, without its recipients


_QUEUE_SQL = f"""
SELECT d.id, d.app_id, d.recipient, m.id, a.app_name, m.sender, m.kind, m.content, m.reference,
       m.confirmation_requested, m.client_message_id, m.origin_domain, m.origin_message_id, m.forward_path,
       m.confirms_origin, c.id, c.origin_domain, c.origin_message_id
  FROM messaging_delivery d
  JOIN messaging_message m ON m.id = d.message_id
  JOIN apps_registry_clientapp a ON a.id = d.app_id
  LEFT JOIN messaging_message c ON c.id = m.confirms_id
 WHERE d.state = {FORWARDING} AND d.forward_to = %s
 ORDER BY d.forward_to, d.app_id, d.recipient, d.seq
 LIMIT %s
"""


def _origin(here: str, message_id: int, origin_domain: str, origin_message_id: int | None) -> tuple[str, int]:
    """(origin domain, id there) of a message: its own for one stored here first."""
    if origin_message_id is None:
        return here, message_id
    return origin_domain, origin_message_id


def queue_peek(*, peer: str, limit: int) -> list[Queued]:
    """The oldest rows queued on the link to `peer`, each recipient's in mailbox order."""
    here = settings.DOMAIN_NAME
    with hot_cursor() as cur:
        cur.execute(_QUEUE_SQL, [peer, limit])
        rows = cur.fetchall()
    out = []
    for (delivery_id, app_id, recipient, message_id, app_name, sender, kind, content, reference, confirm, cmid,
         origin_domain, origin_id, forward_path, confirms_origin, c_id, c_origin, c_origin_id) in rows:
        origin, oid = _origin(here, message_id, origin_domain, origin_id)
        confirms = ""
        if c_id is not None:
            c_domain, c_oid = _origin(here, c_id, c_origin, c_origin_id)
            confirms = f"{c_domain}:{c_oid}"
        elif confirms_origin:
            confirms = confirms_origin
        path = [d for d in forward_path.split(",") if d] + [here]
        out.append(Queued(delivery_id=delivery_id, recipient=recipient, app_id=app_id, message_id=message_id, message={
            "app": app_name, "sender": sender, "kind": kind, "content": content, "reference": reference,
            "confirmation_requested": confirm, "client_message_id": cmid, "origin_domain": origin,
            "origin_message_id": oid, "path": path, "confirms": confirms,
        }))
    return out


def payload_build(rows: list[Queued]) -> list[dict]:
    """The payload's messages: each once, with its recipients on this link, in an order that keeps
    every recipient's mailbox order (a topological order of the recipients' sequences, ties broken
    by first appearance: the receiver stores a call's messages in payload order)."""
    items: dict[int, dict] = {}
    first: dict[int, int] = {}
    after: dict[int, set[int]] = {}
    indegree: dict[int, int] = {}
    previous: dict[tuple[int, str], int] = {}
    for position, row in enumerate(rows):
        if row.message_id not in items:
            items[row.message_id] = {**row.message, "recipients": []}
            first[row.message_id] = position
            after[row.message_id] = set()
            indegree[row.message_id] = 0
        items[row.message_id]["recipients"].append(row.recipient)
        key = (row.app_id, row.recipient)
        before = previous.get(key)
        if before is not None and before != row.message_id and row.message_id not in after[before]:
            after[before].add(row.message_id)
            indegree[row.message_id] += 1
        previous[key] = row.message_id
    ready = [(first[m], m) for m, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, message_id = heapq.heappop(ready)
        ordered.append(items[message_id])
        for nxt in after[message_id]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, (first[nxt], nxt))
    if len(ordered) != len(items):  # a cycle cannot happen (mailboxes lock in one order); never drop
        seen = {id(i) for i in ordered}
        ordered += [i for i in items.values() if id(i) not in seen]
    return ordered


def _rows_fail(*, peer: str, ids: list[int], error: str, kill: bool = False) -> list[tuple]:
    """Forwarding rows of this link that failed: one attempt counted (all of them dead when `kill`),
    dead once the app's attempts are used, the others left waiting on the link. Returns the moved
    rows (MOVED_COLUMNS)."""
    if not ids:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET attempts = d.attempts + 1, last_error = left(%(error)s, 500),
                   state = CASE WHEN %(kill)s OR d.attempts + 1 >= a.max_delivery_attempts THEN {DEAD}
                                ELSE d.state END,
                   dead_at = CASE WHEN %(kill)s OR d.attempts + 1 >= a.max_delivery_attempts THEN now()
                                  ELSE d.dead_at END
              FROM locked l, apps_registry_clientapp a
             WHERE d.id = l.id AND a.id = d.app_id AND d.state = {FORWARDING} AND d.forward_to = %(peer)s
            RETURNING {MOVED_COLUMNS}
            """,
            {"ids": sorted(ids), "error": error, "kill": kill, "peer": peer},
        )
        rows = cur.fetchall()
    dead_letters_announce([r for r in rows if r[1] == DeliveryState.DEAD.value])
    return rows


def _rows_forwarded(*, peer: str, ids: list[int]) -> int:
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET state = {FORWARDED}, sent_at = now()
              FROM locked l WHERE d.id = l.id AND d.state = {FORWARDING} AND d.forward_to = %(peer)s
            """,
            {"ids": sorted(ids), "peer": peer},
        )
        return cur.rowcount


def failure_reason(peer: str, error: PeerError) -> str:
    """"forwarding to domain-02 failed: connection refused" (the reason without its peer prefix)."""
    reason = error.reason
    if reason.startswith(f"{peer}: "):
        reason = reason[len(peer) + 2:]
    return f"forwarding to {peer} failed: {reason}"


def _link_waiting(peer: str) -> bool:
    with hot_cursor() as cur:
        cur.execute(f"SELECT 1 FROM messaging_delivery WHERE state = {FORWARDING} AND forward_to = %s LIMIT 1",
                    [peer])
        return cur.fetchone() is not None


def _held_back(peer: str) -> bool:
    return LinkHealth.objects.filter(peer=peer, retry_at__gt=timezone.now()).exists()


def _drain(peer: str, totals: dict[str, int]) -> bool:
    """Send the link's queue until it is empty (True) or a call fails (False)."""
    limit = max(1, int(settings.FORWARD_BATCH_SIZE))
    hop_limit = int(settings.FORWARD_HOP_LIMIT)
    while True:
        rows = queue_peek(peer=peer, limit=limit)
        if not rows:
            return True
        # A message that already made FORWARD_HOP_LIMIT hops after its origin goes no further.
        over = {r.delivery_id for r in rows if len(r.message["path"]) > hop_limit}
        if over:
            totals["dead"] += len(_rows_fail(peer=peer, ids=list(over), error=f"hop limit ({hop_limit}) reached",
                                             kill=True))
            rows = [r for r in rows if r.delivery_id not in over]
            if not rows:
                continue
        ids = [r.delivery_id for r in rows]
        try:
            peer_call(peer=peer, path=FORWARD_PATH, payload={"messages": payload_build(rows)})
        except PeerError as error:
            reason = failure_reason(peer, error)
            health = link_failed(peer=peer, error=error.reason)
            moved = _rows_fail(peer=peer, ids=ids, error=reason)
            dead = sum(1 for r in moved if r[1] == DeliveryState.DEAD.value)
            totals["failed"] += len(moved) - dead
            totals["dead"] += dead
            log.warning("%s (%d rows, %d now dead; retry at %s)", reason, len(ids), dead, health.retry_at)
            return False
        sent = _rows_forwarded(peer=peer, ids=ids)
        link_succeeded(peer=peer, forwarded=sent)
        totals["forwarded"] += sent


def link_forward(*, peer: str) -> dict[str, int]:
    """Drain the link to `peer` (see the module docstring). Safe twice: a second sender finds the
    link's lock taken and returns at once (`busy`); one whose link is held back by its backoff
    returns too (`held`): the sweep comes back when the retry is due."""
    totals = {"forwarded": 0, "failed": 0, "dead": 0, "busy": 0, "held": 0}
    while True:
        if _held_back(peer):
            totals["held"] = 1
            return totals
        with link_lock(peer) as held:
            if not held:
                totals["busy"] = 1
                return totals
            emptied = _drain(peer, totals)
        # Rows queued after our last look but while we still held the lock had their wake-up
        # refused (`busy`): look once more now that the lock is free.
        if not emptied or not _link_waiting(peer):
            return totals
