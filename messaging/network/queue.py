"""Deliveries for recipients homed in other domains: queued on the link to the next hop.

The router (messaging.router) decides "here or elsewhere" in one place, `destination`; what it
claimed for elsewhere comes here (`deliveries_queue_on_links`): moved, in one statement naming the
claim, to `forwarding` on the link to `next_hop(home, visited=<the message's path>)`, with no timer
(the retry sweep leaves them alone: the link's sender and its own backoff own them from here), and
the link's sender is woken (messaging.network.outbox). A recipient whose home no enabled link
reaches counts a failed attempt ("no route to domain-05"): retried with the app's backoff by the
ordinary retry sweep, dead after the app's max attempts.

`forward_sweep` (beat, every FORWARD_SWEEP_SECONDS) moves the queues of links that have been down
for longer than LINK_DOWN_AFTER_SECONDS, or were disabled, to another path where one exists, and wakes every link
with waiting rows whose retry is due (a sender task lost with its worker is made up for here); the
same for the receipts waiting on links (and those that had no route when they were written).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.db import hot_cursor
from foundation.outbound import one_at_a_time
from messaging.delivery.retry import deliveries_fail
from messaging.delivery.sql import SENT, states_sql
from messaging.handoff import forward_links_kick, receipt_links_kick
from messaging.models import DeliveryState
from messaging.network.links import links_down, links_held_back, neighbours, next_hop
from messaging.network.models import ReceiptForward
from messaging.network.outbox import link_lock_key
from messaging.network.receipts import receipt_lock_key

log = logging.getLogger(__name__)

FORWARDING = states_sql(DeliveryState.FORWARDING)


def destination(recipient: str) -> str | None:
    """Where a delivery to `recipient` goes from this domain: None, pushed here (its home is this
    domain, or it has none any more); otherwise the name of its home domain."""
    parsed = user_id_parse(recipient)
    app = app_snapshot(parsed.app_name) if parsed else None
    home = app.home_domain(parsed.number) if app else None
    return None if home in (None, settings.DOMAIN_NAME) else home


def path_of(forward_path: str) -> list[str]:
    """A message's path as a list, origin first ("" for one stored here first: [])."""
    return [d for d in forward_path.split(",") if d]


@dataclass(frozen=True)
class QueueOutcome:
    queued: int
    no_route: int


def deliveries_queue_on_links(*, homes: dict[int, str], token: int) -> QueueOutcome:
    """Claimed deliveries (id -> recipient's home domain, all `sent` under `token`) -> forwarding on
    the link to their next hop; those with no path at all count a failed attempt."""
    if not homes:
        return QueueOutcome(0, 0)
    with hot_cursor() as cur:
        cur.execute("SELECT d.id, m.forward_path FROM messaging_delivery d"
                    " JOIN messaging_message m ON m.id = d.message_id WHERE d.id = ANY(%s::bigint[])",
                    [sorted(homes)])
        paths = dict(cur.fetchall())
    hops: dict[tuple[str, str], str | None] = {}
    queue_ids, queue_peers = [], []
    no_route: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for delivery_id, home in sorted(homes.items()):
        path = paths.get(delivery_id, "")
        if (home, path) not in hops:
            hops[home, path] = next_hop(home, visited=path_of(path))
        hop = hops[home, path]
        if hop is None:
            no_route[home].append((delivery_id, token))
        else:
            queue_ids.append(delivery_id)
            queue_peers.append(hop)
    queued: list[str] = []
    if queue_ids:
        with hot_cursor() as cur:
            cur.execute(
                f"""
                UPDATE messaging_delivery d
                   SET state = {FORWARDING}, forward_to = q.peer, next_attempt_at = NULL, claim = NULL
                  FROM unnest(%s::bigint[], %s::text[]) AS q(id, peer)
                 WHERE d.id = q.id AND d.state = {SENT} AND d.claim = %s
                RETURNING q.peer
                """,
                [queue_ids, queue_peers, token],
            )
            queued = [row[0] for row in cur.fetchall()]
    for home, claims in no_route.items():
        deliveries_fail(claims=claims, error=f"no route to {home}")
    if queued:
        peers = sorted(set(queued))
        transaction.on_commit(lambda: forward_links_kick(peers))
    return QueueOutcome(queued=len(queued), no_route=sum(len(c) for c in no_route.values()))


# --- the sweep ----------------------------------------------------------------------------------


def links_waiting() -> list[str]:
    """Neighbours with deliveries queued on their link."""
    with hot_cursor() as cur:
        cur.execute(f"SELECT DISTINCT forward_to FROM messaging_delivery WHERE state = {FORWARDING}")
        return sorted(row[0] for row in cur.fetchall())


def queue_reroute(*, peer: str) -> dict[str, int]:
    """Move the queue of a link that is down to other paths, recipient by recipient: all of one
    recipient's waiting rows move together, and only when every one of them has the same new next
    hop (their paths, which the next hop must avoid, may differ), so its order is kept. Returns
    {new peer: rows moved}. Holds the link's sender lock meanwhile: a sender in the middle of a
    call must not have its rows moved under it (they would be sent twice, down two paths)."""
    moved: dict[str, int] = defaultdict(int)
    with one_at_a_time(link_lock_key(peer)) as held:
        if not held:
            return {}
        with hot_cursor() as cur:
            cur.execute(
                f"""
                SELECT d.app_id, d.recipient, array_agg(DISTINCT m.forward_path)
                  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
                 WHERE d.state = {FORWARDING} AND d.forward_to = %s
                 GROUP BY d.app_id, d.recipient
                """,
                [peer],
            )
            recipients = cur.fetchall()
        for app_id, recipient, paths in recipients:
            home = destination(recipient)
            if home is None:
                continue  # homed here now (a configuration change): left to the sender, which refuses nothing
            hops = {next_hop(home, visited=path_of(p)) for p in paths}
            if len(hops) != 1:
                continue
            (hop,) = hops
            if hop in (None, peer):
                continue
            with hot_cursor() as cur:
                cur.execute(f"UPDATE messaging_delivery SET forward_to = %s WHERE state = {FORWARDING}"
                            " AND forward_to = %s AND app_id = %s AND recipient = %s",
                            [hop, peer, app_id, recipient])
                moved[hop] += cur.rowcount
    if moved:
        log.info("link to %s is down: moved %s", peer, dict(moved))
    return dict(moved)


def receipts_reroute(*, peer: str) -> dict[str, int]:
    """Move the receipts waiting on a link that is down (or on no link: "") to the next hop towards
    their origins now, where that is another link. Holds the link's receipt sender lock meanwhile."""
    moved: dict[str, int] = defaultdict(int)
    with one_at_a_time(receipt_lock_key(peer)) as held:
        if not held:
            return {}
        origins = (ReceiptForward.objects.filter(peer=peer).order_by().values_list("origin_domain", flat=True)
                   .distinct())
        for origin in list(origins):
            hop = next_hop(origin) or ""
            if hop != peer:
                moved[hop] += ReceiptForward.objects.filter(peer=peer, origin_domain=origin).update(peer=hop)
    return {hop: n for hop, n in moved.items() if hop}


def _receipts_sweep(down: set[str]) -> tuple[list[str], dict[str, int]]:
    waiting = set(ReceiptForward.objects.order_by().values_list("peer", flat=True).distinct())
    down = down | {""} | (waiting - set(neighbours()))  # no route when written; a link disabled or removed
    rerouted: dict[str, int] = defaultdict(int)
    for peer in sorted(waiting):
        if peer in down:
            for hop, count in receipts_reroute(peer=peer).items():
                rerouted[hop] += count
    waiting = set(ReceiptForward.objects.exclude(peer="").order_by().values_list("peer", flat=True).distinct())
    due = sorted(waiting - links_held_back(waiting))
    receipt_links_kick(due)
    return due, dict(rerouted)


def forward_sweep() -> dict:
    """Beat: re-route the queues of links that are down, then wake every link with waiting rows
    (deliveries, receipts) whose retry is due. Returns what it did (for the task's result)."""
    waiting = links_waiting()
    # Down for longer than LINK_DOWN_AFTER_SECONDS, or no longer an enabled link at all (disabled by
    # an operator, removed by a configuration pull): their queues move where another path exists.
    down = links_down() | (set(waiting) - set(neighbours()))
    rerouted: dict[str, int] = {}
    for peer in waiting:
        if peer in down:
            for hop, count in queue_reroute(peer=peer).items():
                rerouted[hop] = rerouted.get(hop, 0) + count
    waiting = sorted(set(links_waiting()))
    due = sorted(set(waiting) - links_held_back(waiting))
    forward_links_kick(due)
    receipts_due, receipts_rerouted = _receipts_sweep(links_down())
    return {"kicked": due, "rerouted": rerouted, "receipts_kicked": receipts_due,
            "receipts_rerouted": receipts_rerouted}
