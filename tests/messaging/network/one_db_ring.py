"""The seed's four-domain ring in one test database: domain-01 to domain-04, links 01-02, 02-03,
03-04 and 01-04, app ANZ distributed by user id as in the seed's meta example. A test plays any
domain by switching settings.DOMAIN_NAME (`as_domain`); the tables are shared, so a test looks at
what the domain it plays wrote."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.test import override_settings

from apps_registry.models import Domain, DomainLink
from apps_registry.services import distribution_create
from messaging.network.links import graph_cache_clear
from tests.factories import make_app

RING = [("domain-01", "domain-02"), ("domain-02", "domain-03"), ("domain-03", "domain-04"), ("domain-01", "domain-04")]


@contextmanager
def as_domain(name: str):
    """Run as domain `name` (its neighbours, its links' secrets)."""
    graph_cache_clear()
    with override_settings(DOMAIN_NAME=name):
        yield
    graph_cache_clear()


@pytest.fixture
def ring(db):
    domains = {n: Domain.objects.create(name=f"domain-0{n}", urls=[f"ws://127.0.0.1:800{n}/ws"]) for n in range(1, 5)}
    links = {}
    for a, b in RING:
        links[(a, b)] = DomainLink.objects.create(n1=domains[int(a[-1])], n2=domains[int(b[-1])],
                                                  shared_secret=f"secret-{a}-{b}")
    app = make_app(domain=domains[1], range_from=0, range_to=999999, public_channel_patterns=["news*"])
    for n, low, high in [(2, 1000000, 2999999), (3, 3000000, 5999999), (4, 6000000, None)]:
        distribution_create(app=app, domain=domains[n], range_from=low, range_to=high)
    graph_cache_clear()
    return links


def link(links: dict, a: str, b: str) -> DomainLink:
    return links.get((a, b)) or links[(b, a)]
