"""Deliveries for recipients homed in other domains: queued on the link to the next hop.

The router (messaging.routing.router) decides "here or elsewhere" in one place, `destination`; what it
claimed for elsewhere comes here (`deliveries_queue_on_links`): moved, in one statement naming the
claim, to `forwarding` on the link to `next_hop(home, visited=<the message's path>)`, with no timer
(the retry sweep leaves them alone: the link's sender and its own backoff own them from here), and
the link's sender is woken (messaging.federation.senders.outbox). A recipient whose home no enabled link
reaches counts a failed attempt ("no route to domain-05"): retried with the app's backoff by the
ordinary retry sweep, dead after the app's max attempts.

`forward_sweep` (beat, every FORWARD_SWEEP_SECONDS) moves the queues of links that have been down
for longer than LINK_DOWN_AFTER_SECONDS, or were disabled, to another path where one exists, and wakes every link
with waiting rows whose retry is due (a sender task lost with its worker is made up for here); the
same for the receipts waiting on links (and those that had no route when they were written). It
also lets go of the messages held here for an earlier one too long (messaging.federation.order).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction

from foundation.db import hot_cursor
from foundation.handoff import ROUTING_TASK_MAX_IDS, forward_links_kick, receipt_links_kick
from foundation.locks import one_at_a_time
from messaging.core.delivery.retry import deliveries_fail
from messaging.core.delivery.sql import FORWARDED, FORWARDING, PENDING, RETRYING, SENT
from messaging.core.next_hop import (
    destination,
    link_state,
    link_state_forget,
    links_down,
    neighbours,
    next_hop,
    path_of,
    receipt_next_hop,
)
from messaging.federation.links import links_held_back
from messaging.federation.models import ReceiptForward
from messaging.federation.order import held_release_overdue
from messaging.federation.senders.follow import afters_fix
from messaging.federation.senders.outbox import link_lock_key
from messaging.federation.senders.receipts import receipt_lock_key

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class QueueOutcome:
    queued: int
    no_route: int


def deliveries_queue_on_links(*, homes: dict[int, str], token: int) -> QueueOutcome:
    """Claimed deliveries (id -> recipient's home domain, all `sent` under `token`) -> forwarding on
    the link to their next hop; those with no path at all count a failed attempt.

    A recipient whose earlier messages still wait on a link gets the new ones queued behind them on
    that link, even where the next hop has changed meanwhile (a link down long enough to be routed
    around): the sweep moves a recipient's queue as a whole, so its order holds across the reroute
    (unless that link leads back through the new message's path)."""
    if not homes:
        return QueueOutcome(0, 0)
    with hot_cursor() as cur:
        # Each row's message path, and the link its recipient's oldest waiting row is on (if any).
        cur.execute(
            f"""
            SELECT d.id, m.forward_path, d.app_id, d.recipient,
                   (SELECT o.forward_to FROM messaging_delivery o
                     WHERE o.app_id = d.app_id AND o.recipient = d.recipient AND o.state = {FORWARDING}
                     ORDER BY o.seq LIMIT 1)
              FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
             WHERE d.id = ANY(%s::bigint[])
            """,
            [sorted(homes)],
        )
        rows = {delivery_id: (path, (app_id, recipient), behind)
                for delivery_id, path, app_id, recipient, behind in cur.fetchall()}
    hops: dict[tuple[str, str], str | None] = {}
    chosen: dict[int, str | None] = {}
    for delivery_id, home in sorted(homes.items()):
        path, _, behind = rows.get(delivery_id, ("", None, None))
        if (home, path) not in hops:
            hops[home, path] = next_hop(home, visited=path_of(path))
        hop = hops[home, path]
        if hop is not None and behind and behind not in path_of(path):
            hop = behind
        chosen[delivery_id] = hop
    _keep_on_the_detour(chosen, rows, homes)
    queue_ids, queue_peers = [], []
    no_route: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for delivery_id, home in sorted(homes.items()):
        hop = chosen[delivery_id]
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
        afters_fix(queue_ids)
    for home, claims in no_route.items():
        deliveries_fail(claims=claims, error=f"no route to {home}")
    if queued:
        peers = sorted(set(queued))
        transaction.on_commit(lambda: forward_links_kick(peers))
    return QueueOutcome(queued=len(queued), no_route=sum(len(c) for c in no_route.values()))


def earlier_unrouted(delivery_ids: list[int]) -> list[int]:
    """Rows not yet routed (pending, or retrying on a timer) that stand in their recipient's mailbox
    before the earliest of `delivery_ids` for that recipient: a routing task that takes them with
    its own rows keeps the recipient's order where their own routing was lost (a worker stopped or
    killed between the store and its routing task, which the sweep makes up for only later) or is
    still on its way behind this task. Rows another task has claimed (`sent`) are its own."""
    if not delivery_ids:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            SELECT o.id
              FROM (SELECT d.app_id, d.recipient, min(d.seq) AS seq FROM messaging_delivery d
                     WHERE d.id = ANY(%s::bigint[]) GROUP BY d.app_id, d.recipient) k
              JOIN LATERAL (
                   SELECT o.id FROM messaging_delivery o
                    WHERE o.app_id = k.app_id AND o.recipient = k.recipient AND o.seq < k.seq
                      AND o.state IN ({PENDING}, {RETRYING}) AND o.next_attempt_at IS NOT NULL
                    ORDER BY o.seq LIMIT {ROUTING_TASK_MAX_IDS}) o ON true
            """,
            [sorted(delivery_ids)],
        )
        return sorted(row[0] for row in cur.fetchall())


def _keep_on_the_detour(chosen: dict[int, str | None], rows: dict[int, tuple], homes: dict[int, str]) -> None:
    """Deliveries whose recipient's earlier messages went on another way than the one chosen now
    and are still in flight there (`forwarded`, no receipt yet) follow them over that way, rather
    than overtake them on a shorter one (a detour that has just ended: the home, or the link to it,
    is back) or wait here on a link that is down and overtake them once it is back. The way
    followed must be a link that is up and not lead back through the message's path; a neighbour
    that has said it has no way on is followed only where the way chosen is down (it holds them:
    messaging.core.next_hop.must_hold), else the shorter way is taken. Rows queued behind their recipient's rows
    waiting on a link (`behind`) stay there unless that link is down: the sweep moves them together."""
    down = links_down()
    following = [i for i, hop in chosen.items()
                 if hop is not None and i in rows and (hop in down or not rows[i][2])]
    pinned = detours_of(sorted({rows[i][1] for i in following})) if following else {}
    if not pinned:
        return
    state = link_state()
    up = set(neighbours()) - down
    for delivery_id in following:
        path, key, _ = rows[delivery_id]
        hop, detour = chosen[delivery_id], _usable_detour(pinned.get(key), [path], up)
        if detour is not None and (hop in down or detour not in state.blocked_towards(homes[delivery_id])):
            chosen[delivery_id] = detour


def detours_of(recipients: list[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """(app id, recipient) -> the link its newest message still in flight further on went by (one
    index probe per recipient: delivery_in_flight)."""
    with hot_cursor() as cur:
        cur.execute(
            f"""
            SELECT k.app_id, k.recipient,
                   (SELECT o.forward_to FROM messaging_delivery o
                     WHERE o.app_id = k.app_id AND o.recipient = k.recipient AND o.state = {FORWARDED}
                     ORDER BY o.seq DESC LIMIT 1)
              FROM unnest(%s::bigint[], %s::text[]) AS k(app_id, recipient)
            """,
            [[a for a, _ in recipients], [r for _, r in recipients]],
        )
        return {(a, r): peer for a, r, peer in cur.fetchall() if peer}


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
                hop = _hand_back_to(home, paths, down=peer) or _detour(app_id, recipient, paths)
            if hop is None:
                continue
            with hot_cursor() as cur:
                cur.execute(f"UPDATE messaging_delivery SET forward_to = %s WHERE state = {FORWARDING}"
                            " AND forward_to = %s AND app_id = %s AND recipient = %s",
                            [hop, peer, app_id, recipient])
                moved[hop] += cur.rowcount
    if moved:
        log.info("link to %s is down: moved %s", peer, dict(moved))
    return dict(moved)


def _hand_back_to(home: str, paths: list[str], *, down: str) -> str | None:
    """Where a recipient's rows waiting on the down link to `down` go when no other way on is left
    from here: back to the domain they came from (one for all of them, so their order holds), unless
    that domain is out of reach too or has said it has no way to `home` either. It routes them round
    (the call says this domain has no way on to `home`: messaging.federation.senders.outbox). None: they wait."""
    if len(paths) != 1 or not path_of(paths[0]):
        return None  # stored here first (the origin keeps its own), or come by different ways
    back = path_of(paths[0])[-1]
    state = link_state()
    if (back == down or back not in neighbours() or back in state.down or back in state.blocked_towards(home)
            or back in state.holding_towards(home)):  # it has no other way: they wait here
        return None
    return back


def _detour(app_id: int, recipient: str, paths: list[str]) -> str | None:
    """The link up that a recipient's earlier messages went on by, still in flight there (see
    _keep_on_the_detour), where its rows waiting on a down link can follow them; None: they wait."""
    up = set(neighbours()) - links_down()
    return _usable_detour(detours_of([(app_id, recipient)]).get((app_id, recipient)), paths, up)


def _usable_detour(detour: str | None, paths: list[str], up: set[str]) -> str | None:
    """`detour` where it is among `up` (neighbours over a link that is up) and on none of `paths`."""
    if detour in up and all(detour not in path_of(p) for p in paths):
        return detour
    return None


def receipts_reroute(*, peer: str) -> dict[str, int]:
    """Move the receipts waiting on a link that is down (or on no link: "") to the next hop towards
    their origins now, where that is another link. Holds the link's receipt sender lock meanwhile."""
    moved: dict[str, int] = defaultdict(int)
    with one_at_a_time(receipt_lock_key(peer)) as held:
        if not held:
            return {}
        ways = (ReceiptForward.objects.filter(peer=peer).order_by().values_list("origin_domain", "path")
                .distinct())
        for origin, path in list(ways):
            hop = receipt_next_hop(origin, [d for d in path.split(",") if d])
            if hop != peer:
                moved[hop] += ReceiptForward.objects.filter(peer=peer, origin_domain=origin, path=path).update(peer=hop)
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
    receipt_links_kick(due, again=True)  # also where a wake-up was lost with a worker
    return due, dict(rerouted)


def forward_sweep() -> dict:
    """Beat: re-route the queues of links that are down, then wake every link with waiting rows
    (deliveries, receipts) whose retry is due. Returns what it did (for the task's result)."""
    link_state_forget()  # decided on the links' state now, not on a cached one
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
    forward_links_kick(due, again=True)  # also where a wake-up was lost with a worker
    receipts_due, receipts_rerouted = _receipts_sweep(links_down())
    return {"kicked": due, "rerouted": rerouted, "receipts_kicked": receipts_due,
            "receipts_rerouted": receipts_rerouted, "order_given_up": held_release_overdue()}
