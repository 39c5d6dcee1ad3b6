"""A home that took its users back from a holder gone silent keeps a sender's order across its two
origins (messaging.federation.order, "Barriers"), on the one-database ring: domain-03's users stand
by on domain-04, domain-04's on domain-01.

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03; DAVE is homed on 04, served by 01 while 04 is lost

domain-04 held carol and was killed while it did, with dave's first message to her stored there and
not yet sent home; domain-03 took carol back without it. Dave, served by domain-01 meanwhile, sends
her his second: it waits at domain-03 until domain-04 is back and has handed over what it stored
(his first), or for NETWORK_ORDER_WAIT_SECONDS.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain, Takeover, UserDistribution
from messaging.federation.models import HeldInOrder, OrderMark
from messaging.federation.order import held_release_overdue
from messaging.federation.takeover.reclaim import take_back
from messaging.federation.takeover.records import network_accept
from tests.messaging.federation.test_takeover import BOB, CAROL, DAVE, mailbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def taken_back(standby_ring):
    """domain-03 has taken carol back from domain-04, silent (killed while it held her)."""
    net = standby_ring
    UserDistribution.objects.filter(domain__name="domain-04").update(standby=Domain.objects.get(name="domain-01"))
    net.down.add("domain-04")
    with net.at("domain-03"):
        Takeover.objects.create(home=Domain.objects.get(name="domain-03"), holder=Domain.objects.get(name="domain-04"),
                                held=True, epoch=1, taken_at=timezone.now() - timedelta(seconds=30))
        assert take_back("domain-04", reason="silent")["state"] == "taken back"
    net.pump()
    return net


def holder_finished(net) -> None:
    """domain-04 is back and has handed carol back: what it stored for her (dave's first) is in her
    mailbox at home, and its own record, a later epoch, reaches domain-03."""
    net.down.discard("domain-04")
    net.send(DAVE, CAROL, "dave 1 (stored at domain-04)", at="domain-03")  # (as its hand-back's merge puts it)
    record = {"home": "domain-03", "holder": "domain-04", "held": False, "epoch": time.time_ns() // 1000 + 10**6,
              "taken_at": timezone.now().isoformat(), "returned_at": timezone.now().isoformat()}
    with net.at("domain-03"):
        network_accept({"heard": {}, "takeovers": [record]}, sender="domain-04")
    net.pump()


def contents(net) -> list[str]:
    return [content for content, _ in mailbox(net, "domain-03")]


def test_a_held_users_message_from_elsewhere_waits_for_the_silent_holders_hand_back(taken_back):
    net = taken_back
    net.send(DAVE, CAROL, "dave 2 (from domain-01)", at="domain-01")
    net.send(BOB, CAROL, "bob (domain-02's own)", at="domain-02")
    net.pump()
    assert contents(net) == ["bob (domain-02's own)"]  # another origin, another sender: not held
    with net.at("domain-03"):
        assert HeldInOrder.objects.count() == 1
        assert OrderMark.objects.get(recipient=CAROL, origin_domain="domain-01").blocked_by == "domain-04"
    holder_finished(net)
    assert contents(net) == ["bob (domain-02's own)", "dave 1 (stored at domain-04)", "dave 2 (from domain-01)"]
    with net.at("domain-03"):
        assert not HeldInOrder.objects.exists()
        assert OrderMark.objects.get(recipient=CAROL, origin_domain="domain-01").blocked_by == ""


def test_what_comes_behind_a_barrier_from_its_origin_waits_with_it_in_order(taken_back):
    net = taken_back
    net.send(DAVE, CAROL, "dave 2 (from domain-01)", at="domain-01")
    net.pump()
    net.send(DAVE, CAROL, "dave 3 (from domain-01)", at="domain-01")
    net.pump()
    assert contents(net) == []
    holder_finished(net)
    assert contents(net) == ["dave 1 (stored at domain-04)", "dave 2 (from domain-01)", "dave 3 (from domain-01)"]


def test_a_barrier_whose_holder_never_returns_is_given_up_after_the_order_wait(taken_back, settings):
    net = taken_back
    net.send(DAVE, CAROL, "dave 2 (from domain-01)", at="domain-01")
    net.pump()
    assert contents(net) == []
    with net.at("domain-03"):
        OrderMark.objects.update(blocked_until=timezone.now() - timedelta(seconds=1))
        HeldInOrder.objects.update(held_at=timezone.now() - timedelta(seconds=settings.NETWORK_ORDER_WAIT_SECONDS / 2))
        assert held_release_overdue() == 1
    net.pump()
    assert contents(net) == ["dave 2 (from domain-01)"]


def test_a_home_that_took_nobody_back_holds_nothing_behind_a_barrier(standby_ring):
    net = standby_ring
    net.send(DAVE, CAROL, "dave (from domain-04)", at="domain-04")
    net.pump()
    assert contents(net) == ["dave (from domain-04)"]
