"""Liveness-only links (DomainLink.liveness_only), on the one-database ring with its two diagonals
added as such links: domain-03's users stand by on domain-04.

    domain-01 ── domain-02
        │  ╲    ╱    │          ── carries everything
        │   ╳        │          ╲╱ liveness only: gossip, probes, the takeover witness
        │  ╱    ╲    │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04

With domain-01 and domain-03 lost together, domain-04 has lost both its neighbours. Over the
liveness link it still hears domain-02, so it goes on admitting its own users and takes domain-03's
over, domain-02 its witness; without that link it hears nobody, fences its users and finds no
witness, until one of the pair returns. No message ever takes the liveness link.
"""

from __future__ import annotations

import pytest

from apps_registry.models import Takeover
from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.takeover.fence import cut_off, fence_forget
from messaging.federation.takeover.take import takeover_watch
from messaging.federation.wire.probes import links_probe
from messaging.federation.wire.transport import FORWARD_PATH
from messaging.models import Delivery
from tests.messaging.federation.test_takeover import BOB, DAVE, heard, lost

pytestmark = pytest.mark.django_db

PAIR = ("domain-01", "domain-03")


@pytest.fixture(autouse=True)
def serving(monkeypatch):
    """Each domain's web node answers (tests/network.py's addresses are not real: no /healthz to ask)."""
    monkeypatch.setattr("messaging.federation.presence_gossip.domain_serves", lambda: True)


@pytest.fixture
def diagonals(standby_ring, settings):
    settings.FAILOVER_SECONDS = 10
    standby_ring.link("domain-01", "domain-03", liveness_only=True)
    standby_ring.link("domain-02", "domain-04", liveness_only=True)
    return standby_ring


def pair_lost(net) -> None:
    """domain-01 and domain-03 down, unheard of for a minute, their links down at both survivors."""
    lost(net, "domain-03")
    lost(net, "domain-01")
    for survivor in ("domain-02", "domain-04"):
        for n in PAIR:
            heard(net, survivor, n, 60)


def a_gossip_round_at(net, domain: str) -> dict:
    with net.at(domain):
        return presence_gossip()


def test_a_survivor_of_a_lost_pair_hears_the_other_over_their_liveness_link_and_is_not_cut_off(diagonals):
    net = diagonals
    pair_lost(net)
    heard(net, "domain-04", "domain-02", 60)  # (nothing heard lately from anyone)
    with net.at("domain-04"):
        fence_forget()
        assert cut_off()
    assert a_gossip_round_at(net, "domain-02")["domain-04"] == "ok"
    with net.at("domain-04"):
        fence_forget()
        assert not cut_off()


def test_the_lost_pairs_users_are_taken_over_with_the_other_survivor_as_witness(diagonals):
    net = diagonals
    pair_lost(net)
    a_gossip_round_at(net, "domain-02")
    with net.at("domain-04"):
        assert takeover_watch() == {"domain-03": "taken"}
    with net.at("domain-04"):
        assert Takeover.objects.filter(home__name="domain-03", holder__name="domain-04", held=True).exists()


def test_without_the_liveness_link_the_survivor_is_cut_off_and_finds_no_witness(standby_ring, settings):
    settings.FAILOVER_SECONDS = 10
    net = standby_ring
    pair_lost(net)
    a_gossip_round_at(net, "domain-02")  # reaches nobody: its neighbours are the lost pair
    with net.at("domain-04"):
        fence_forget()
        assert cut_off()
        assert takeover_watch() == {"domain-03": "not taken: no third domain answered about domain-03"}


def test_no_message_takes_a_liveness_link_even_when_it_is_the_only_way_left(diagonals):
    net = diagonals
    pair_lost(net)
    net.calls.clear()
    net.send(DAVE, BOB, "to domain-02", at="domain-04")
    net.pump()
    with net.at("domain-04"):
        row = Delivery.objects.get(recipient=BOB)
    assert row.state == "forwarding" and row.forward_to in PAIR  # waiting on a link that carries messages
    assert not [c for c in net.calls if c.peer == "domain-02" and c.path == FORWARD_PATH and "messages" in c.payload]


def test_a_liveness_link_is_probed_like_any_other(diagonals):
    net = diagonals
    with net.at("domain-04"):
        results = {r.peer: r.ok for r in links_probe()}
    assert results == {"domain-01": True, "domain-02": True, "domain-03": True}
