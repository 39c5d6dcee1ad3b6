"""Where an item goes next, and each link's health as this domain sees it.

`next_hop(target, visited=...)` is the one routing decision of the network: the shortest path
(apps_registry.routing, ties broken by name so every domain agrees) from here to `target` over
enabled links, leaving out
- the links from here to neighbours that have not answered for longer than LINK_DOWN_AFTER_SECONDS
  (routed around while another path exists, used again once they answer: probes and calls both
  record health), and
- the domains the item has already passed through, so a domain that routes around a broken link
  never sends an item back where it came from (that domain does not know the link is broken).
Where no path is left that way, the item waits on the best link there is (the down one): it is
retried with backoff there and dead-lettered after its attempts, never dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from apps_registry.routing import DomainGraph
from foundation.outbound import Backoff, Batch, Limits
from messaging.network.models import LinkHealth

GRAPH_CACHE_SECONDS = 1.0
_graph_cache: tuple[float, DomainGraph] | None = None


def graph() -> DomainGraph:
    """The domain graph over enabled links, re-read at most every GRAPH_CACHE_SECONDS."""
    global _graph_cache
    now = time.monotonic()
    if _graph_cache is None or now - _graph_cache[0] > GRAPH_CACHE_SECONDS:
        _graph_cache = (now, DomainGraph.load())
    return _graph_cache[1]


def graph_cache_clear() -> None:
    """Forget the cached graph (tests that change links; the admin after a change is at most
    GRAPH_CACHE_SECONDS behind anyway)."""
    global _graph_cache
    _graph_cache = None


def neighbours() -> list[str]:
    """The domains linked to this one over enabled links."""
    return sorted(n for n, _ in graph().adjacency.get(settings.DOMAIN_NAME, []))


def links_down() -> set[str]:
    """Neighbours that have not answered for longer than LINK_DOWN_AFTER_SECONDS."""
    cutoff = timezone.now() - timedelta(seconds=settings.LINK_DOWN_AFTER_SECONDS)
    return set(LinkHealth.objects.filter(up=False, down_since__lte=cutoff).values_list("peer", flat=True))


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


def next_hop(target: str, *, visited: Iterable[str] = ()) -> str | None:
    """The neighbour to hand an item for `target` to (None: no path over enabled links at all)."""
    here = settings.DOMAIN_NAME
    g = graph()
    avoid = {d for d in visited if d not in (here, target)}
    down = links_down()
    for candidate in (_without(g, edges_from_here=down, nodes=avoid), _without(g, edges_from_here=set(), nodes=avoid), g):
        path = candidate.shortest_path(here, target)
        if path and len(path) >= 2:
            return path[1]
    return None


# --- health ------------------------------------------------------------------------------------


def link_succeeded(*, peer: str, forwarded: int = 0) -> None:
    """A call to `peer` (or a probe) was answered: the link is up; `forwarded` items went out."""
    now = timezone.now()
    updated = LinkHealth.objects.filter(peer=peer).update(
        up=True, down_since=None, failures=0, retry_at=None, last_ok_at=now,
        forwarded_out=F("forwarded_out") + forwarded)
    if not updated:
        LinkHealth.objects.get_or_create(peer=peer, defaults={"last_ok_at": now, "forwarded_out": forwarded})


def link_backoff() -> Backoff:
    """When a link that failed is tried again: FORWARD_RETRY_BASE_SECONDS, doubling per failure in
    a row, at most FORWARD_RETRY_MAX_SECONDS, less up to a fifth (jitter)."""
    return Backoff(settings.FORWARD_RETRY_BASE_SECONDS, settings.FORWARD_RETRY_MAX_SECONDS, jitter=0.2)


def link_failed(*, peer: str, error: str) -> LinkHealth:
    """A call to `peer` failed: down (since the first failure in a row), the error kept, and the
    link's queues held back until `retry_at` (link_backoff)."""
    now = timezone.now()
    health, _ = LinkHealth.objects.get_or_create(peer=peer)
    failures = health.failures + 1
    delay = link_backoff().seconds(failures)
    LinkHealth.objects.filter(pk=health.pk).update(
        up=False, down_since=health.down_since if not health.up and health.down_since else now,
        failures=failures, last_error=error[:500], last_failure_at=now, retry_at=now + timedelta(seconds=delay))
    health.refresh_from_db()
    return health


def link_held_back(peer: str) -> bool:
    """The link failed and its retry time has not come: its senders wait (a probe that succeeds
    clears it)."""
    return LinkHealth.objects.filter(peer=peer, retry_at__gt=timezone.now()).exists()


def links_held_back(peers: Iterable[str]) -> set[str]:
    return set(LinkHealth.objects.filter(peer__in=list(peers), retry_at__gt=timezone.now())
               .values_list("peer", flat=True))


def link_received(*, peer: str, count: int) -> None:
    """`count` items came in from `peer` (its calls also prove the link works)."""
    if count and not LinkHealth.objects.filter(peer=peer).update(forwarded_in=F("forwarded_in") + count):
        LinkHealth.objects.get_or_create(peer=peer, defaults={"forwarded_in": count})


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

    def give_up(self, refused: list) -> int:
        return 0  # nothing is refused before a call, unless a sender says otherwise

    def put_back(self, batch: Batch) -> None:
        """Nothing to do: the rows never left the link's queue."""
