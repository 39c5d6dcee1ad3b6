"""The domain graph: where a user lives and the shortest way there over enabled links (those that
carry messages: a liveness-only link is no edge of it).

Used by the message router (a user homed elsewhere is forwarded to the next hop), by the
`route` management command and by the admin's graph page.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from django.conf import settings

from .models import Domain, DomainLink
from .selectors import user_distribution_of


@dataclass
class DomainGraph:
    domains: list[str]
    # name -> [(neighbour, weight)], enabled links that carry messages only
    adjacency: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    @classmethod
    def load(cls) -> DomainGraph:
        graph = cls(domains=list(Domain.objects.order_by("name").values_list("name", flat=True)))
        graph.adjacency = {name: [] for name in graph.domains}
        # (a liveness-only link carries no message: no route takes it)
        links = DomainLink.objects.filter(enabled=True, liveness_only=False).values_list("n1__name", "n2__name", "weight")
        for a, b, weight in links:
            graph.adjacency[a].append((b, weight))
            graph.adjacency[b].append((a, weight))
        return graph

    def shortest_path(self, source: str, target: str) -> list[str] | None:
        """Dijkstra; ties broken by domain name so every node computes the same route."""
        if source not in self.adjacency or target not in self.adjacency:
            return None
        best: dict[str, int] = {source: 0}
        previous: dict[str, str] = {}
        queue: list[tuple[int, str]] = [(0, source)]
        while queue:
            cost, node = heapq.heappop(queue)
            if node == target:
                break
            if cost > best.get(node, cost):
                continue
            for neighbour, weight in sorted(self.adjacency[node]):
                candidate = cost + weight
                if candidate < best.get(neighbour, candidate + 1):
                    best[neighbour] = candidate
                    previous[neighbour] = node
                    heapq.heappush(queue, (candidate, neighbour))
        if target not in best:
            return None
        path = [target]
        while path[-1] != source:
            path.append(previous[path[-1]])
        return list(reversed(path))


@dataclass(frozen=True)
class Route:
    user_id: str
    home: str | None
    path: list[str] | None
    standby: str | None = None  # the domain that stands by for the user's home (UserDistribution.standby)

    @property
    def next_hop(self) -> str | None:
        if not self.path or len(self.path) < 2:
            return None
        return self.path[1]

    def describe(self) -> str:
        if self.home is None:
            return f"{self.user_id} has no home domain (no user distribution covers it)"
        standby = f" (standby: {self.standby})" if self.standby else ""
        if self.path is None:
            return f"{self.user_id} lives in {self.home}, which is unreachable over enabled links{standby}"
        return " -> ".join(self.path) + standby


def route_for_user(user_id: str, *, from_domain: str | None = None, graph: DomainGraph | None = None) -> Route:
    source = from_domain or settings.DOMAIN_NAME
    distribution = user_distribution_of(user_id)
    if distribution is None:
        return Route(user_id=user_id, home=None, path=None)
    home = distribution.domain.name
    graph = graph or DomainGraph.load()
    return Route(user_id=user_id, home=home, path=graph.shortest_path(source, home),
                 standby=distribution.standby.name if distribution.standby_id else None)
