"""A link's sender: the deliveries queued on the link to one neighbour, sent in calls of at most
FORWARD_BATCH_SIZE rows and FORWARD_BATCH_BYTES, in each recipient's mailbox order.

`link_forward(peer=)` (task messaging.tasks.forward_link, safe twice) runs `LinkSender` on the
outbound skeleton (foundation.outbound: one sender per link, held back by the link's backoff,
batches bounded by rows and bytes). What is its own: the queue's SQL (the oldest rows by (app,
recipient, seq): the partial index delivery_link_queue) and the payload, in which a message with
several recipients on this link goes once with its recipients. The neighbour stores everything
before it answers, so on success the rows are `forwarded` (it has them; the home domain's receipt
later makes them delivered or dead, messaging.federation.senders.receipts), except those of a message it
refused alone (its app unknown there): dead at once with its reason. On failure the link is marked
down with backoff (links.link_failed) and each row of the batch whose own retry time has come
counts a failed attempt (so its attempts go at its app's pace, not at the pace of the link's
retries); those out of the app's attempts are dead with the reason, the others wait on the link, in
order, until its retry is due (the sweep, messaging.federation.senders.queue, wakes the link then, or moves
the queue to another path).
A row that already made FORWARD_HOP_LIMIT hops is dead before any call.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps_registry.selectors import takeover_records
from foundation.db import hot_cursor
from foundation.handoff import forward_links_kick
from foundation.outbound import Batch, CallFailed, Failed, Limits, Settled, head_sql, out_of_attempts, send_batches
from messaging.core.delivery.dead_letters import dead_letters_announce
from messaging.core.delivery.retry import retry_backoff
from messaging.core.delivery.sql import DEAD, FORWARDED, FORWARDING, MOVED_COLUMNS, RETRYING, lock_sql
from messaging.core.next_hop import destination, link_state, must_hold, route_around_to
from messaging.federation.links import LinkQueueSender, link_failed, link_succeeded, route_blocked
from messaging.federation.wire.transport import FORWARD_PATH, peer_call
from messaging.models import DeliveryState

log = logging.getLogger(__name__)

TAKEOVER_TELL_SECONDS = 60.0  # a takeover or hand-back rides every forward call for this long

# What a row counts towards FORWARD_BATCH_BYTES beyond its content (its other fields, as JSON).
ROW_OVERHEAD_BYTES = 300


def link_lock_key(peer: str) -> str:
    """The link's sender lock (foundation.locks.one_at_a_time): the sender, and the sweep that
    moves the link's queue elsewhere, never act on the link's rows at once."""
    return LinkSender(peer).lock_key


@dataclass
class Queued:
    delivery_id: int
    recipient: str
    app_id: int
    message_id: int
    message: dict  # the payload item, without its recipients
    size: int = 0  # what it counts towards FORWARD_BATCH_BYTES
    revive: bool = False  # a re-queued dead letter: the neighbour revives its dead copy
    held: bool = False  # sent with `hold` (LinkSender._to_hold)
    seq: int | None = None  # the recipient's mailbox seq at the origin (messaging.federation.order)
    after: tuple[str, int] | None = None  # in at the recipient's home after (origin, seq) (OrderAfter)


# The head of the link's queue, as long as the running size stays within the byte limit (the first
# row always: a message larger than the limit goes alone).
_QUEUE_SQL = head_sql(f"""
    SELECT d.id, d.app_id, d.recipient, m.id, a.app_name, m.sender, m.kind, m.content, m.reference,
           m.confirmation_requested, m.client_message_id, m.origin_domain, m.origin_message_id, m.forward_path,
           m.confirms_origin, c.id, c.origin_domain, c.origin_message_id, d.revive,
           d.origin_seq, m.order_after,
           octet_length(m.content) + {ROW_OVERHEAD_BYTES} AS size,
           sum(octet_length(m.content) + {ROW_OVERHEAD_BYTES}) OVER w AS running, row_number() OVER w AS n
      FROM messaging_delivery d
      JOIN messaging_message m ON m.id = d.message_id
      JOIN apps_registry_clientapp a ON a.id = d.app_id
      LEFT JOIN messaging_message c ON c.id = m.confirms_id
     WHERE d.state = {FORWARDING} AND d.forward_to = %(peer)s
    WINDOW w AS (ORDER BY d.forward_to, d.app_id, d.recipient, d.seq)
     ORDER BY d.forward_to, d.app_id, d.recipient, d.seq
     LIMIT %(rows)s
""")


def _origin(here: str, message_id: int, origin_domain: str, origin_message_id: int | None) -> tuple[str, int]:
    """(origin domain, id there) of a message: its own for one stored here first."""
    if origin_message_id is None:
        return here, message_id
    return origin_domain, origin_message_id


def _after_of(order_after: str | dict | None, recipient: str) -> tuple[str, int] | None:
    """A message's `after` for one recipient (Message.order_after: carried, or fixed here as it was
    first queued, messaging.federation.senders.follow; the raw cursor reads jsonb as text)."""
    if not order_after:
        return None
    after = (json.loads(order_after) if isinstance(order_after, str) else order_after).get(recipient)
    return (after[0], after[1]) if after else None


def queue_peek(*, peer: str, limits: Limits) -> tuple[list[Queued], bool]:
    """The oldest rows queued on the link to `peer`, each recipient's in mailbox order, as many as
    `limits` allow, and whether they are the whole queue (Limits.drained)."""
    here = settings.DOMAIN_NAME
    rows, drained = LinkSender(peer).head(_QUEUE_SQL, limits)
    out = []
    for (delivery_id, app_id, recipient, message_id, app_name, sender, kind, content, reference, confirm, cmid,
         origin_domain, origin_id, forward_path, confirms_origin, c_id, c_origin, c_origin_id, revive, origin_seq,
         order_after, size, _, _, _) in rows:
        origin, oid = _origin(here, message_id, origin_domain, origin_id)
        confirms = ""
        if c_id is not None:
            c_domain, c_oid = _origin(here, c_id, c_origin, c_origin_id)
            confirms = f"{c_domain}:{c_oid}"
        elif confirms_origin:
            confirms = confirms_origin
        path = [d for d in forward_path.split(",") if d] + [here]
        if path[0] != origin:  # stored here from a standby copy, which carries no path: it came from its origin
            path.insert(0, origin)
        out.append(Queued(delivery_id=delivery_id, recipient=recipient, app_id=app_id, message_id=message_id, message={
            "app": app_name, "sender": sender, "kind": kind, "content": content, "reference": reference,
            "confirmation_requested": confirm, "client_message_id": cmid, "origin_domain": origin,
            "origin_message_id": oid, "path": path, "confirms": confirms,
        }, size=size, revive=revive, seq=origin_seq,
            after=_after_of(order_after, recipient)))
    return out, drained


def payload_build(rows: list[Queued]) -> list[dict]:
    """The payload's messages: each once, with its recipients on this link, in an order that keeps
    every recipient's mailbox order (a topological order of the recipients' sequences, ties broken
    by first appearance: the receiver stores a call's messages in payload order)."""
    return [item for _, item in _payload(rows)]


def _payload(rows: list[Queued]) -> list[tuple[int, dict]]:
    """payload_build's messages, each with its message id here."""
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
        if row.seq is not None:
            items[row.message_id].setdefault("seqs", {})[row.recipient] = row.seq
        if row.after is not None:
            items[row.message_id].setdefault("after", {})[row.recipient] = list(row.after)
        if row.revive:
            items[row.message_id].setdefault("revive", []).append(row.recipient)
        key = (row.app_id, row.recipient)
        before = previous.get(key)
        if before is not None and before != row.message_id and row.message_id not in after[before]:
            after[before].add(row.message_id)
            indegree[row.message_id] += 1
        previous[key] = row.message_id
    ready = [(first[m], m) for m, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    ordered: list[int] = []
    while ready:
        _, message_id = heapq.heappop(ready)
        ordered.append(message_id)
        for nxt in after[message_id]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, (first[nxt], nxt))
    if len(ordered) != len(items):  # a cycle cannot happen (mailboxes lock in one order); never drop
        seen = set(ordered)
        ordered += [m for m in items if m not in seen]
    return [(m, items[m]) for m in ordered]


DIES = out_of_attempts("d.attempts + 1", "a.max_delivery_attempts")
# A waiting row's attempt counts once its retry time has come (never earlier, however often the
# link's calls fail meanwhile): its attempts follow the app's retry schedule, as a local delivery's do.
DUE = "(%(kill)s OR d.next_attempt_at IS NULL OR d.next_attempt_at <= now())"
COUNTED_DEAD = f"({DUE} AND (%(kill)s OR {DIES}))"


def _rows_fail(*, peer: str, ids: list[int], error: str, kill: bool = False, routed_again: bool = False) -> list[tuple]:
    """Forwarding rows of this link whose call failed: the error kept on each; an attempt counted on
    those whose retry time has come (the next one then due after the delivery backoff,
    messaging.core.delivery.retry), dead once the app's attempts are used (all of them when `kill`); the
    others left waiting on the link, in order (or, `routed_again`, off the link: retrying, routed again
    by the retry sweep when due). So a link retried every second while its neighbour is away does not
    use up its rows' attempts in a minute: a row dies only after its app's attempts, at the app's
    pace. Returns the moved rows (MOVED_COLUMNS)."""
    if not ids:
        return []
    backoff = retry_backoff().sql("d.attempts + 1")
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d
               SET attempts = CASE WHEN {DUE} THEN d.attempts + 1 ELSE d.attempts END,
                   last_error = left(%(error)s, 500),
                   state = CASE WHEN {COUNTED_DEAD} THEN {DEAD} WHEN %(again)s THEN {RETRYING} ELSE d.state END,
                   dead_at = CASE WHEN {COUNTED_DEAD} THEN now() ELSE d.dead_at END,
                   next_attempt_at = CASE WHEN {COUNTED_DEAD} THEN NULL WHEN {DUE} THEN now() + {backoff}
                                          ELSE coalesce(d.next_attempt_at, now()) END
              FROM locked l, apps_registry_clientapp a
             WHERE d.id = l.id AND a.id = d.app_id AND d.state = {FORWARDING} AND d.forward_to = %(peer)s
            RETURNING {MOVED_COLUMNS}
            """,
            {"ids": sorted(ids), "error": error, "kill": kill, "peer": peer, "again": routed_again},
        )
        rows = cur.fetchall()
    dead_letters_announce([r for r in rows if r[1] == DeliveryState.DEAD.value])
    return rows


def _rows_forwarded(*, peer: str, ids: list[int]) -> int:
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET state = {FORWARDED}, sent_at = now(), next_attempt_at = NULL, revive = false
              FROM locked l WHERE d.id = l.id AND d.state = {FORWARDING} AND d.forward_to = %(peer)s
            """,
            {"ids": sorted(ids), "peer": peer},
        )
        return cur.rowcount


def _rows_move(*, peer: str, ids: list[int], to: str) -> int:
    """Rows waiting on the link to `peer` moved to the link to `to` (no attempt counted)."""
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET forward_to = %(to)s, next_attempt_at = NULL
              FROM locked l WHERE d.id = l.id AND d.state = {FORWARDING} AND d.forward_to = %(peer)s
            """,
            {"ids": sorted(ids), "peer": peer, "to": to},
        )
        return cur.rowcount


_MALFORMED_ITEM = re.compile(r"\bmessages\[(\d+)\]")  # the item a 400 names (messaging.federation.wire.forward_payload)


def failure_reason(peer: str, reason: str) -> str:
    """"forwarding to domain-02 failed: connection refused" (the reason without its peer prefix)."""
    if reason.startswith(f"{peer}: "):
        reason = reason[len(peer) + 2:]
    return f"forwarding to {peer} failed: {reason}"


class LinkSender(LinkQueueSender):
    """The link to `peer` on the outbound skeleton: its queue's SQL, its payload, its rows' fate."""

    name = "link"

    def take(self, limits: Limits) -> Batch[Queued]:
        hop_limit = int(settings.FORWARD_HOP_LIMIT)
        rows, drained = queue_peek(peer=self.peer, limits=limits)
        # A message that already made FORWARD_HOP_LIMIT hops after its origin goes no further.
        over = [(r, f"hop limit ({hop_limit}) reached") for r in rows if len(r.message["path"]) > hop_limit]
        return Batch(items=[r for r in rows if len(r.message["path"]) <= hop_limit], refused=over, drained=drained)

    def send(self, batch: Batch[Queued]) -> tuple[list[int], dict]:
        """The call; returns the payload's message ids in payload order (what the answer's refusals
        point at by index) with the neighbour's answer. Rows going back to a domain they came
        through are handed back (this domain has no way on for them, messaging.federation.senders.queue): the
        call says which domains it has no way on to (`blocked`), so the neighbour routes around."""
        payload = _payload(batch.items)
        # Only a neighbour that said it has no way on somewhere can need a `hold`: the common call
        # pays nothing for it.
        held = self._to_hold(payload) if self.peer in link_state().blocked else set()
        for row in batch.items:
            row.held = row.message_id in held
        body: dict = {"messages": [item for _, item in payload]}
        handed_back = sorted({home for r in batch.items if self.peer in r.message["path"][:-1]
                              and (home := destination(r.recipient))})
        if handed_back:
            body["blocked"] = handed_back
        # Who serves whose users, where that changed lately (issue 27): a message a holder sends a
        # home just given its users back must not find the home, or a domain on the way, still
        # thinking them held there (it would send it back); each reads this before it stores the
        # call's messages, and tells it on with its own calls (the gossip may come later).
        if told := takeover_records(changed_within=TAKEOVER_TELL_SECONDS):
            body["network"] = {"takeovers": told}
        answer = peer_call(peer=self.peer, path=FORWARD_PATH, payload=body)
        return [message_id for message_id, _ in payload], answer

    def _to_hold(self, payload: list[tuple[int, dict]]) -> set[int]:
        """Marks `hold` on the items the neighbour has no way on for when no other way is left from
        here either (messaging.core.next_hop.must_hold): they are to wait there, on its onward link, not come back.
        Returns their message ids."""
        held: set[int] = set()
        known: dict[tuple[str, tuple[str, ...]], bool] = {}
        for message_id, item in payload:
            visited = tuple(item["path"][:-1])
            for recipient in item["recipients"]:
                home = destination(recipient)
                if home is None:
                    continue
                if (home, visited) not in known:
                    known[home, visited] = must_hold(self.peer, home, visited)
                if known[home, visited]:
                    item["hold"] = True
                    held.add(message_id)
                    break
        return held

    def settle(self, batch: Batch[Queued], sent_and_answer: tuple[list[int], dict]) -> Settled:
        """The neighbour stored the call's messages but those it refused alone: those it has no way
        on for (`blocked`: its onward links are down) go another way where there is one, else go
        again marked `hold` (_route_around); those refused for a reason of their own (their app unknown
        there, over the hop limit) are dead at once with its reason; the others `forwarded`."""
        order, answer = sent_and_answer
        refused: dict[int, str] = {}
        blocked: dict[int, list[str]] = {}
        for item in (answer.get("refused") if isinstance(answer, dict) else None) or []:
            if isinstance(item, dict) and isinstance(item.get("index"), int) and 0 <= item["index"] < len(order):
                refused[order[item["index"]]] = str(item.get("reason", "refused"))[:400]
                if isinstance(item.get("blocked"), list):
                    blocked[order[item["index"]]] = [d for d in item["blocked"] if isinstance(d, str)]
        sent = _rows_forwarded(peer=self.peer, ids=[r.delivery_id for r in batch.items if r.message_id not in refused])
        again = self._route_around(
            [r for r in batch.items if r.message_id in blocked], {d for ds in blocked.values() for d in ds},
            {m: refused[m] for m in blocked})
        dead = self.give_up([(r, f"{self.peer} refused it: {refused[r.message_id]}")
                             for r in batch.items if r.message_id in refused and r.message_id not in blocked])
        link_succeeded(peer=self.peer, forwarded=sent)
        return Settled(sent=sent, refused=dead, again=again)

    def _route_around(self, rows: list[Queued], targets: set[str], reasons: dict[int, str]) -> bool:
        """Rows the neighbour has no way on for: it is passed over for `targets` a while
        (links.route_blocked), and each row moves to the link of another neighbour that is up
        (messaging.core.next_hop.route_around_to); the others stay on this link, in order, and go again at once marked
        `hold` (the neighbour keeps them waiting on its onward link, as this domain would, behind the
        rows of their recipients it already has), rather than wait here on a link that is down, from
        where they would overtake those once it is back. One refused although
        it was marked (a neighbour that cannot hold it) goes back to routing, an attempt counted.
        Returns whether any stay on this link to go again."""
        if not rows:
            return False
        route_blocked(peer=self.peer, targets=targets)
        moves: dict[str, list[int]] = {}
        stuck: dict[str, list[int]] = {}
        for row in rows:
            home = destination(row.recipient)
            hop = route_around_to(home, visited=row.message["path"][:-1]) if home else None
            if hop is not None and hop != self.peer:
                moves.setdefault(hop, []).append(row.delivery_id)
            elif row.held:
                reason = f"{self.peer} has no way on: {reasons[row.message_id]}"
                stuck.setdefault(reason, []).append(row.delivery_id)
        for hop, ids in moves.items():
            _rows_move(peer=self.peer, ids=ids, to=hop)
        for reason, ids in stuck.items():
            _rows_fail(peer=self.peer, ids=ids, error=reason, routed_again=True)
        if moves:
            peers = sorted(moves)
            transaction.on_commit(lambda: forward_links_kick(peers))
        return sum(map(len, moves.values())) + sum(map(len, stuck.values())) < len(rows)

    def fail(self, batch: Batch[Queued], error: CallFailed) -> Failed:
        if error.status == 400 and (found := _MALFORMED_ITEM.search(error.reason)):
            # The neighbour refused the call for one item it found malformed: that item alone goes
            # to the dead letters (with the neighbour's reason), and the rest go in the next call, at
            # once, no attempt counted: one bad row must not hold the link's queue for ever.
            payload = _payload(batch.items)
            if int(found[1]) < len(payload):
                bad = payload[int(found[1])][0]
                dead = self.give_up([(r, failure_reason(self.peer, error.reason))
                                     for r in batch.items if r.message_id == bad])
                forward_links_kick([self.peer])
                return Failed(failed=dead, dead=dead, retry_at="now, without it")
        health = link_failed(peer=self.peer, error=error.reason, answered=error.status is not None)
        moved = _rows_fail(peer=self.peer, ids=[r.delivery_id for r in batch.items],
                           error=failure_reason(self.peer, error.reason))
        dead = sum(1 for r in moved if r[1] == DeliveryState.DEAD.value)
        return Failed(failed=len(moved), dead=dead, retry_at=health.retry_at)

    def give_up(self, refused: list[tuple[Queued, str]]) -> int:
        by_reason: dict[str, list[int]] = {}
        for row, reason in refused:
            by_reason.setdefault(reason, []).append(row.delivery_id)
        return sum(len(_rows_fail(peer=self.peer, ids=ids, error=reason, kill=True)) for reason, ids in by_reason.items())


def link_forward(*, peer: str) -> dict:
    """Drain the link to `peer` (see the module docstring). Safe twice: a second sender finds the
    link's lock taken and returns at once (`busy`); one whose link is held back by its backoff
    returns too (`held back`): the sweep comes back when the retry is due."""
    return send_batches(LinkSender(peer), budget_seconds=settings.FORWARD_TASK_BUDGET_SECONDS).as_dict()
