"""`make network`'s ring, started as the tests' `ring` fixture: four domains that answer, each whole
from the start, that admit a user only at its home, and one of which stops and starts alone."""

from __future__ import annotations

import pytest

from tests.ring import RingRefused

pytestmark = pytest.mark.system

DOMAINS = ["domain-01", "domain-02", "domain-03", "domain-04"]
LINKS = ["domain-01 — domain-02", "domain-02 — domain-03", "domain-03 — domain-04", "domain-01 — domain-04"]


def _admin_lists(ring, n: int) -> tuple[list[str], list[str]]:
    """The domains and the links domain n's admin lists."""
    with ring.admin(n) as admin:
        domains = admin.get("/admin/apps_registry/domain/").text
        links = admin.get("/admin/apps_registry/domainlink/").text
    return [d for d in DOMAINS if f">{d}<" in domains], [link for link in LINKS if link in links]


def test_every_domain_is_ready_and_its_admin_lists_the_four_domains_and_the_four_links(ring):
    print(f"the ring started in {ring.start_seconds:.1f}s")
    for n in ring.domains():
        assert ring.ready(n), f"domain-0{n} is not ready"
        assert _admin_lists(ring, n) == (DOMAINS, LINKS)


def test_a_user_is_admitted_at_home_and_refused_elsewhere_with_its_home_named(ring):
    with ring.client(3, "ANZ-3123456") as carol:
        assert carol.frames[-1]["data"]["isAuthenticated"] is True
    with pytest.raises(RingRefused) as refused:
        ring.client(1, "ANZ-3123456")
    assert "domain-03" in refused.value.reason


def test_a_stopped_domain_leaves_the_others_serving_and_comes_back_with_the_same_configuration(ring):
    ring.stop_domain(2)
    try:
        assert [n for n in ring.domains() if ring.ready(n)] == [1, 3, 4]
        with ring.client(3, "ANZ-3000001"), ring.client(4, "ANZ-6000001"), ring.client(1, "ANZ-1"):
            pass
    finally:
        ring.start_domain(2)
    assert ring.ready(2)
    assert _admin_lists(ring, 2) == (DOMAINS, LINKS)
    assert ring.query(2, "select count(*) from apps_registry_userdistribution") == [(4,)]
    with ring.client(2, "ANZ-1500000"):
        pass
