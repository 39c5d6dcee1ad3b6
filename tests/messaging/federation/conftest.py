"""The one-database network of domains (tests/network.py): fixtures `net` (a line, 01 - 02 - 03),
`net_ring` (the seed's ring) and `standby_ring` (the ring with domain-03's users standing by on
domain-04)."""

from __future__ import annotations

import pytest

from apps_registry.models import Domain, UserDistribution
from tests.network import net, net_ring  # noqa: F401  (fixtures)


@pytest.fixture
def standby_ring(net_ring, settings):  # noqa: F811
    UserDistribution.objects.filter(domain__name="domain-03").update(standby=Domain.objects.get(name="domain-04"))
    settings.HAND_BACK_GRACE_SECONDS = 0  # handed back at the first look (the grace has a test of its own)
    return net_ring
