from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Q

from apps_registry.config_io import config_import
from apps_registry.models import Domain, DomainLink, UserDistribution
from apps_registry.routing import DomainGraph, route_for_user

pytestmark = pytest.mark.django_db
EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "linker_meta_4_domains.yaml"


@pytest.fixture
def network():
    config_import(text=EXAMPLE.read_text())


def _link(a: str, b: str) -> DomainLink:
    return DomainLink.objects.get(n1__name=a, n2__name=b)


def test_a_user_homed_here_needs_no_hop(network):
    assert route_for_user("ANZ-5", from_domain="domain-01").path == ["domain-01"]


def test_a_neighbour_is_one_hop_away(network):
    route = route_for_user("ANZ-6000001", from_domain="domain-01")
    assert route.path == ["domain-01", "domain-04"]
    assert route.next_hop == "domain-04"


def test_the_opposite_corner_is_two_hops_either_way(network):
    path = route_for_user("ANZ-3123456", from_domain="domain-01").path
    assert len(path) == 3 and path[0] == "domain-01" and path[-1] == "domain-03"


def test_a_disabled_link_forces_the_longer_way_round(network):
    DomainLink.objects.filter(pk=_link("domain-01", "domain-04").pk).update(enabled=False)
    assert route_for_user("ANZ-6000001", from_domain="domain-01").path == [
        "domain-01", "domain-02", "domain-03", "domain-04"]


def test_weights_pick_the_cheaper_path(network):
    DomainLink.objects.filter(pk=_link("domain-01", "domain-02").pk).update(weight=10)
    assert route_for_user("ANZ-3123456", from_domain="domain-01").path == ["domain-01", "domain-04", "domain-03"]


def test_a_liveness_only_link_is_no_way_for_a_message(network):
    domain_01, domain_03 = Domain.objects.get(name="domain-01"), Domain.objects.get(name="domain-03")
    DomainLink.objects.create(n1=domain_01, n2=domain_03, liveness_only=True)
    path = route_for_user("ANZ-3123456", from_domain="domain-01").path
    assert len(path) == 3 and path[0] == "domain-01" and path[-1] == "domain-03"  # round the ring, as before
    DomainLink.objects.filter(Q(n1__name="domain-03") | Q(n2__name="domain-03"), liveness_only=False).update(enabled=False)
    assert route_for_user("ANZ-3123456", from_domain="domain-01").path is None


def test_an_unreachable_domain_has_no_path(network):
    DomainLink.objects.filter(n1__name="domain-03").update(enabled=False)
    DomainLink.objects.filter(n2__name="domain-03").update(enabled=False)
    route = route_for_user("ANZ-3123456", from_domain="domain-01")
    assert route.path is None
    assert "unreachable" in route.describe()


def test_a_user_of_an_unknown_app_has_no_home(network):
    assert route_for_user("NOPE-1").home is None
    assert DomainGraph.load().shortest_path("domain-01", "domain-09") is None


def test_route_command_prints_the_path(network):
    DomainLink.objects.filter(pk=_link("domain-01", "domain-02").pk).update(enabled=False)
    out = StringIO()
    call_command("route", "ANZ-3123456", "--from", "domain-01", stdout=out)
    assert out.getvalue().strip() == "domain-01 -> domain-04 -> domain-03"


def test_route_command_explains_an_unknown_user(network):
    with pytest.raises(CommandError, match="no home domain"):
        call_command("route", "ZZZ-1")


def test_route_command_names_the_users_standby_domain(network):
    UserDistribution.objects.filter(app__app_name="ANZ", range_from=3000000).update(
        standby=Domain.objects.get(name="domain-04"))
    out = StringIO()
    call_command("route", "ANZ-3123456", "--from", "domain-01", stdout=out)
    assert out.getvalue().strip() == "domain-01 -> domain-02 -> domain-03 (standby: domain-04)"
