"""Where an item goes next: the one module that decides the next hop (the router, the link queues,
receipts and the flood ask it; each link's health is kept by messaging.federation.links).

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
from django.utils import timezone

from apps_registry.models import Takeover
from apps_registry.routing import DomainGraph
from apps_registry.selectors import app_snapshot, user_id_parse
from messaging.federation.models import LinkHealth

GRAPH_CACHE_SECONDS = 1.0
LINK_STATE_CACHE_SECONDS = 1.0
_graph_cache: tuple[float, DomainGraph] | None = None
_state_cache: tuple[float, LinkState] | None = None
_learned_cache: tuple[float, dict[tuple[str, str], float]] | None = None


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


def marks_live(marks: dict | None, wall: float) -> dict[str, float]:
    """The marks (domain -> unix time until) of a `blocked` or `holding` field still in force."""
    return {t: until for t, until in (marks or {}).items() if isinstance(until, (int, float)) and until > wall}


def graph() -> DomainGraph:
    """The domain graph over enabled links, re-read at most every GRAPH_CACHE_SECONDS."""
    global _graph_cache
    now = time.monotonic()
    if _graph_cache is None or now - _graph_cache[0] > GRAPH_CACHE_SECONDS:
        _graph_cache = (now, DomainGraph.load())
    return _graph_cache[1]


def routes_cache_clear() -> None:
    """Forget the cached graph, link state and takeovers learned (tests that change links; the admin
    after a change is at most GRAPH_CACHE_SECONDS behind anyway)."""
    global _graph_cache, _state_cache, _learned_cache
    _graph_cache = _state_cache = _learned_cache = None


def link_state_known() -> LinkState | None:
    """The link state this process holds now, without reading it (None: not read, or forgotten)."""
    return _state_cache[1] if _state_cache is not None else None


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
            if live := marks_live(blocks, wall):
                blocked[peer] = frozenset(live)
            if live := marks_live(holds, wall):
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
    puts it in order (messaging.federation.order)."""
    parsed = user_id_parse(recipient)
    app = app_snapshot(parsed.app_name) if parsed else None
    pair = app.home_and_standby(parsed.number) if app else None
    return pair == (settings.DOMAIN_NAME, destination_) and stored_at < _held_learned().get(pair, 0.0)


def _held_learned() -> dict[tuple[str, str], float]:
    """(home, holder) -> when this domain learned that holder holds the home's ranges it stands by
    for (unix time), re-read at most every LINK_STATE_CACHE_SECONDS."""
    global _learned_cache
    now = time.monotonic()
    if _learned_cache is None or now - _learned_cache[0] > LINK_STATE_CACHE_SECONDS:
        _learned_cache = (now, {(home, holder): (learned.timestamp() if learned else time.time())
                                for home, holder, learned in Takeover.objects.filter(held=True).values_list(
                                    "home__name", "holder__name", "learned_at")})
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
    here now; an intermediate domain refuses it, or hands it back: messaging.federation.senders.queue)."""
    return _first_hop(_routes(target, visited)[:1], target)


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


def receipt_next_hop(origin: str, path: list[str]) -> str:
    """Where a receipt that passed through `path` goes next towards `origin`: the next hop that
    never leads back through a domain it passed ("" when there is none now: it waits here, and the
    sweep looks again; a down link on the way forward is waited on rather than turned back from)."""
    return next_hop(origin, visited=path, back=False) or ""
