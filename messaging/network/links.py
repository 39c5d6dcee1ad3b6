"""Where an item goes next, and each link's health as this domain sees it.

`next_hop(target, visited=...)` is the one routing decision of the network: the shortest path
(apps_registry.routing, ties broken by name so every domain agrees) from here to `target` over
enabled links, leaving out
- the links from here to neighbours that have not answered for longer than LINK_DOWN_AFTER_SECONDS
  (routed around while another path exists, used again once they answer: probes and calls both
  record health), and
- the domains the item has already passed through, so a domain that routes around a broken link
  never sends an item back where it came from (that domain does not know the link is broken).
- the neighbours that said they have no way on to `target` now (they refused an item for it, or
  handed one back: `route_blocked`), for ROUTE_BLOCK_SECONDS.
Where no path is left that way, the item waits on the best link there is (the down one): it is
retried with backoff there and dead-lettered after its attempts, never dropped.

The link health this reads (down links, blocked routes) is cached for LINK_STATE_CACHE_SECONDS per
process, like the graph: a hop costs no query per item.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps_registry.models import Takeover
from apps_registry.routing import DomainGraph
from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.db import hot_cursor
from foundation.outbound import Backoff, Batch, Limits
from messaging.network.models import LinkHealth
from messaging.network.transport import link_cache_clear

GRAPH_CACHE_SECONDS = 1.0
LINK_STATE_CACHE_SECONDS = 1.0
_graph_cache: tuple[float, DomainGraph] | None = None
_state_cache: tuple[float, LinkState] | None = None
_learned_cache: tuple[float, dict[str, float]] | None = None


@dataclass(frozen=True)
class LinkState:
    """What this domain knows of its links now: neighbours down for longer than
    LINK_DOWN_AFTER_SECONDS, and per neighbour the domains it has no way on to."""

    down: frozenset[str]
    blocked: dict[str, frozenset[str]]
    holding: dict[str, frozenset[str]]

    def blocked_towards(self, target: str) -> set[str]:
        return {peer for peer, targets in self.blocked.items() if target in targets}

    def holding_towards(self, target: str) -> set[str]:
        return {peer for peer, targets in self.holding.items() if target in targets}


def _live(marks: dict | None, wall: float) -> dict[str, float]:
    """The marks (domain -> unix time until) of a `blocked` or `holding` field still in force."""
    return {t: until for t, until in (marks or {}).items() if isinstance(until, (int, float)) and until > wall}


def graph() -> DomainGraph:
    """The domain graph over enabled links, re-read at most every GRAPH_CACHE_SECONDS."""
    global _graph_cache
    now = time.monotonic()
    if _graph_cache is None or now - _graph_cache[0] > GRAPH_CACHE_SECONDS:
        _graph_cache = (now, DomainGraph.load())
    return _graph_cache[1]


def graph_cache_clear() -> None:
    """Forget the cached graph and link state (tests that change links; the admin after a change is
    at most GRAPH_CACHE_SECONDS behind anyway)."""
    global _graph_cache, _state_cache, _learned_cache
    _graph_cache = _state_cache = _learned_cache = None
    link_cache_clear()


def link_state_forget() -> None:
    """Read the link state afresh next time (this process changed it)."""
    global _state_cache
    _state_cache = None


def link_state() -> LinkState:
    """The links' state (LinkState), re-read at most every LINK_STATE_CACHE_SECONDS: one query."""
    global _state_cache
    now = time.monotonic()
    if _state_cache is None or now - _state_cache[0] > LINK_STATE_CACHE_SECONDS:
        cutoff = timezone.now() - timedelta(seconds=settings.LINK_DOWN_AFTER_SECONDS)
        wall = time.time()
        down, blocked, holding = set(), {}, {}
        for peer, up, down_since, blocks, holds in LinkHealth.objects.values_list(
                "peer", "up", "down_since", "blocked", "holding"):
            if not up and down_since is not None and down_since <= cutoff:
                down.add(peer)
            if live := _live(blocks, wall):
                blocked[peer] = frozenset(live)
            if live := _live(holds, wall):
                holding[peer] = frozenset(live)
        _state_cache = (now, LinkState(down=frozenset(down), blocked=blocked, holding=holding))
    return _state_cache[1]


def neighbours() -> list[str]:
    """The domains linked to this one over enabled links."""
    return sorted(n for n, _ in graph().adjacency.get(settings.DOMAIN_NAME, []))


def links_down() -> set[str]:
    """Neighbours that have not answered for longer than LINK_DOWN_AFTER_SECONDS."""
    return set(link_state().down)


def _without(g: DomainGraph, *, edges_from_here: set[str], nodes: set[str]) -> DomainGraph:
    here = settings.DOMAIN_NAME
    adjacency = {}
    for name, edges in g.adjacency.items():
        if name in nodes:
            continue
        adjacency[name] = [(n, w) for n, w in edges
                           if n not in nodes and not (name == here and n in edges_from_here)
                           and not (n == here and name in edges_from_here)]
    return DomainGraph(domains=[d for d in g.domains if d not in nodes], adjacency=adjacency)


def destination(recipient: str) -> str | None:
    """Where a delivery to `recipient` goes from this domain: None, pushed here (its home is this
    domain, or it has none any more); otherwise the name of its home domain."""
    parsed = user_id_parse(recipient)
    app = app_snapshot(parsed.app_name) if parsed else None
    home = app.home_domain(parsed.number) if app else None
    return None if home in (None, settings.DOMAIN_NAME) else home


def frozen_here(recipient: str, destination_: str, stored_at: float) -> bool:
    """Whether this domain is the recipient's home, `destination_` its standby, which serves it now
    (a takeover), and the row was stored here before this domain learned so: its mailbox as it was,
    which went to the holder by the standby copy and which the home keeps, parked, for the
    hand-back. A row stored here since is forwarded to the holder like any message, so the holder
    puts it in order (messaging.network.order)."""
    parsed = user_id_parse(recipient)
    app = app_snapshot(parsed.app_name) if parsed else None
    pair = app.home_and_standby(parsed.number) if app else None
    return pair == (settings.DOMAIN_NAME, destination_) and stored_at < _held_learned().get(settings.DOMAIN_NAME, 0.0)


def _held_learned() -> dict[str, float]:
    """home -> when this domain learned it is held (unix time), re-read at most every LINK_STATE_CACHE_SECONDS."""
    global _learned_cache
    now = time.monotonic()
    if _learned_cache is None or now - _learned_cache[0] > LINK_STATE_CACHE_SECONDS:
        _learned_cache = (now, {home: (learned.timestamp() if learned else time.time()) for home, learned in
                                Takeover.objects.filter(held=True).values_list("home__name", "learned_at")})
    return _learned_cache[1]


def path_of(forward_path: str) -> list[str]:
    """A message's path as a list, origin first ("" for one stored here first: [])."""
    return [d for d in forward_path.split(",") if d]


def _routes(target: str, visited: Iterable[str]) -> list[DomainGraph]:
    """The graphs to look for a path to `target` in, best first: without the links that are down,
    the neighbours blocked towards it and the visited domains; then with the down links (an item
    waits there); then with the blocked neighbours too."""
    here = settings.DOMAIN_NAME
    g = graph()
    avoid = {d for d in visited if d not in (here, target)}
    state = link_state()
    blocked = state.blocked_towards(target)
    return [_without(g, edges_from_here=set(state.down) | blocked, nodes=avoid),
            _without(g, edges_from_here=blocked, nodes=avoid),
            _without(g, edges_from_here=set(), nodes=avoid)]


def _first_hop(candidates: list[DomainGraph], target: str) -> str | None:
    here = settings.DOMAIN_NAME
    for candidate in candidates:
        path = candidate.shortest_path(here, target)
        if path and len(path) >= 2:
            return path[1]
    return None


def next_hop(target: str, *, visited: Iterable[str] = (), back: bool = True) -> str | None:
    """The neighbour to hand an item for `target` to (None: no path over enabled links at all, or,
    with `back=False`, none that avoids the `visited` domains)."""
    candidates = _routes(target, visited)
    if back:
        candidates.append(graph())
    return _first_hop(candidates, target)


def way_on(target: str, *, visited: Iterable[str] = ()) -> str | None:
    """The neighbour an item for `target` that came through `visited` can go on to now: over a link
    that is up, to a neighbour not blocked towards `target`, never back (None: it has no way on from
    here now; an intermediate domain refuses it, or hands it back: messaging.network.queue)."""
    return _first_hop(_routes(target, visited)[:1], target)


# --- health ------------------------------------------------------------------------------------


def link_succeeded(*, peer: str, forwarded: int = 0) -> None:
    """A call to `peer` was answered: the link is up, its backoff cleared; `forwarded` items went out."""
    now = timezone.now()
    updated = LinkHealth.objects.filter(peer=peer).update(
        up=True, down_since=None, failures=0, retry_at=None, last_failure_kind="", last_ok_at=now,
        forwarded_out=F("forwarded_out") + forwarded)
    if _state_cache is not None and peer in _state_cache[1].down:
        link_state_forget()  # up again: used again at once
    if not updated:
        LinkHealth.objects.get_or_create(peer=peer, defaults={"last_ok_at": now, "forwarded_out": forwarded})


def link_ping_answered(peer: str) -> bool:
    """A probe of `peer` was answered. The link is up again unless its last failure was a call the
    neighbour answered with an error: a neighbour that answers pings but fails the link's calls
    keeps the backoff its calls earned, so its queue is not retried, and its rows' attempts not used
    up, at every probe. Returns whether the link is (now) clear to send."""
    now = timezone.now()
    cleared = (LinkHealth.objects.filter(peer=peer).exclude(last_failure_kind="call", failures__gt=0)
               .update(up=True, down_since=None, failures=0, retry_at=None, last_failure_kind="", last_ok_at=now))
    if cleared:
        return True
    if LinkHealth.objects.filter(peer=peer).update(last_ok_at=now):
        return False
    LinkHealth.objects.get_or_create(peer=peer, defaults={"last_ok_at": now})
    return True


def link_backoff() -> Backoff:
    """When a link that failed is tried again: FORWARD_RETRY_BASE_SECONDS, doubling per failure in
    a row, at most FORWARD_RETRY_MAX_SECONDS, less up to a fifth (jitter)."""
    return Backoff(settings.FORWARD_RETRY_BASE_SECONDS, settings.FORWARD_RETRY_MAX_SECONDS, jitter=0.2)


def link_failed(*, peer: str, error: str, answered: bool = False) -> LinkHealth:
    """A call to `peer` failed (`answered`: the neighbour answered it with an error; else it was out
    of reach): down (since the first failure in a row), the error kept, and the link's queues held
    back until `retry_at` (link_backoff)."""
    now = timezone.now()
    health, _ = LinkHealth.objects.get_or_create(peer=peer)
    failures = health.failures + 1
    delay = link_backoff().seconds(failures)
    LinkHealth.objects.filter(pk=health.pk).update(
        up=False, down_since=health.down_since if not health.up and health.down_since else now,
        failures=failures, last_error=error[:500], last_failure_at=now, retry_at=now + timedelta(seconds=delay),
        last_failure_kind="call" if answered else "reach")
    link_state_forget()
    health.refresh_from_db()
    return health


def link_held_back(peer: str) -> bool:
    """The link failed and its retry time has not come: its senders wait (a probe that is answered
    clears it, unless a call answered with an error failed last: link_ping_answered)."""
    return LinkHealth.objects.filter(peer=peer, retry_at__gt=timezone.now()).exists()


def links_held_back(peers: Iterable[str]) -> set[str]:
    return set(LinkHealth.objects.filter(peer__in=list(peers), retry_at__gt=timezone.now())
               .values_list("peer", flat=True))


def link_received(*, peer: str, count: int) -> None:
    """`count` items came in from `peer` (its calls also prove the link works)."""
    if count and not LinkHealth.objects.filter(peer=peer).update(forwarded_in=F("forwarded_in") + count):
        LinkHealth.objects.get_or_create(peer=peer, defaults={"forwarded_in": count})


def _mark(*, peer: str, field: str, targets: Iterable[str]) -> None:
    targets = sorted(set(targets))
    if not targets:
        return
    until = time.time() + settings.ROUTE_BLOCK_SECONDS
    with transaction.atomic():
        health, _ = LinkHealth.objects.select_for_update().get_or_create(peer=peer)
        marks = _live(getattr(health, field), time.time())
        marks.update(dict.fromkeys(targets, until))
        LinkHealth.objects.filter(pk=health.pk).update(**{field: marks})
    link_state_forget()


def route_blocked(*, peer: str, targets: Iterable[str]) -> None:
    """`peer` said it has no way on to `targets` now: items for them go another way where one
    exists, for ROUTE_BLOCK_SECONDS (then `peer` is tried again; if it still has no way on, it says
    so again)."""
    _mark(peer=peer, field="blocked", targets=targets)


def route_holding(*, peer: str, targets: Iterable[str]) -> None:
    """`peer` has no other way to `targets` than through here (it sent items for them with `hold`):
    for ROUTE_BLOCK_SECONDS what waits here for them is not handed back to it."""
    _mark(peer=peer, field="holding", targets=targets)


def must_hold(peer: str, target: str, visited: Iterable[str]) -> bool:
    """Whether an item for `target` that came through `visited` goes to `peer` although `peer` has
    no way on to `target` now: no other way is left from here, so `peer` is to hold it (its onward
    link is where the item waits) rather than refuse it. That is so where `peer` is the best link
    there is, and also where the only other way is a link that is down: the item waits at `peer`,
    behind the items of its recipient that went there before it, rather than here on the down link,
    from where it would overtake them once that link is back."""
    visited = list(visited)
    state = link_state()
    if peer not in state.blocked_towards(target):
        return False
    hop = next_hop(target, visited=visited)
    return hop == peer or (hop in state.down and peer not in visited and way_on(target, visited=visited) is None)


def route_around_to(target: str, *, visited: Iterable[str] = ()) -> str | None:
    """Where an item goes that a neighbour refused because it has no way on to `target`: another
    neighbour that is up and has a way on; else the best link there is where that one is up (it
    holds the item: must_hold). None where the best is a link that is down: the item stays with the
    neighbour that refused it, which is to hold it."""
    visited = list(visited)
    hop = way_on(target, visited=visited)
    if hop is None:
        hop = next_hop(target, visited=visited)
    return None if hop in link_state().down else hop


def link_health_rows_ensure(peers: Iterable[str]) -> None:
    """A health record for each of `peers` (the admin lists every neighbour, called yet or not)."""
    LinkHealth.objects.bulk_create([LinkHealth(peer=p) for p in peers], ignore_conflicts=True)


# --- what a link's senders share ------------------------------------------------------------------


class LinkQueueSender:
    """What the link's three senders (its deliveries, channel publishes and receipts: outbox,
    flood_sender, receipts) share on the outbound skeleton (foundation.outbound): one sender of each
    kind per link (lock key `<name>:<peer>`), calls bounded by FORWARD_BATCH_SIZE and
    FORWARD_BATCH_BYTES, held back while the link's retry time has not come. A subclass brings its
    queue's SQL, its payload and what becomes of its rows."""

    name = ""

    def __init__(self, peer: str):
        self.peer = peer
        self.lock_key = f"{self.name}:{peer}"

    def limits(self) -> Limits:
        return Limits(rows=max(1, int(settings.FORWARD_BATCH_SIZE)), bytes=int(settings.FORWARD_BATCH_BYTES))

    def held_back(self) -> bool:
        return link_held_back(self.peer)

    def head(self, sql: str, limits: Limits) -> tuple[list[tuple], bool]:
        """The rows of the queue's `head_sql` (foundation.outbound) for this link within `limits`, and
        whether they are the whole queue (Limits.drained; the rows end with head_sql's count)."""
        with hot_cursor() as cur:
            cur.execute(sql, {"peer": self.peer, "rows": max(1, limits.rows), "bytes": limits.bytes})
            rows = cur.fetchall()
        return rows, limits.drained(fetched=rows[-1][-1] if rows else 0, kept=len(rows))

    def give_up(self, refused: list) -> int:
        return 0  # nothing is refused before a call, unless a sender says otherwise

    def put_back(self, batch: Batch) -> None:
        """Nothing to do: the rows never left the link's queue."""
