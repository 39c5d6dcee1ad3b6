"""A home takes its users back from a holder gone silent (messaging.federation.takeover.reclaim), on
the one-database ring: domain-03's users stand by on domain-04; domain-02 witnesses for domain-03.

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Takeover
from messaging.federation.models import LinkHealth
from messaging.federation.takeover.fence import fence_forget, fence_seconds
from messaging.federation.takeover.records import network_accept, network_gossip
from messaging.federation.takeover.take import hand_back, take_over, takeover_watch
from messaging.models import Delivery
from tests.messaging.federation.test_takeover import (
    ALICE,
    CAROL,
    DAVE,
    copy_now,
    heard,
    held_by,
    login,
    lost,
    mailbox,
)

pytestmark = pytest.mark.django_db


def told(net, by: str, to: str) -> dict:
    """What `by`'s gossip tells `to` of the takeovers, taken there (the refused ones listed)."""
    with net.at(by):
        records = network_gossip()["takeovers"]
    with net.at(to):
        return {"refused": network_accept({"heard": {}, "takeovers": records}, sender=by).refused}


def holder_silent(net, seconds: float) -> None:
    """domain-04 is down: domain-03 and the witness domain-02 have heard nothing of it for `seconds`,
    and domain-03's link to it has been down as long."""
    net.down.add("domain-04")
    for n in ("domain-01", "domain-02", "domain-03"):
        heard(net, n, "domain-04", seconds)
        heard(net, n, "domain-01" if n != "domain-01" else "domain-02", 0)  # (none of them is cut off)
    with net.at("domain-03"):
        LinkHealth.objects.update_or_create(peer="domain-04", defaults={
            "up": False, "down_since": timezone.now() - timedelta(seconds=seconds), "last_error": "refused"})


def held_then_holder_silent(net, seconds: float) -> None:
    """domain-03 lost and taken over by domain-04, back (told so), and then domain-04 silent for
    `seconds` (`holder_silent`) while it holds carol, not handing her back."""
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    told(net, "domain-04", "domain-03")
    net.down.clear()
    holder_silent(net, seconds)


def held_and_handing_back(net) -> None:
    """domain-03 lost and taken over by domain-04 (alice's "during" stored there and sent home), then
    back: domain-04 has begun handing carol back, and domain-03 has heard so; dave's "late" is stored
    at domain-04 just then."""
    net.send(ALICE, CAROL, "before")
    net.pump()
    copy_now(net)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    for n in ("domain-01", "domain-02", "domain-03"):
        told(net, "domain-04", n)
    net.send(ALICE, CAROL, "during")
    net.pump()
    net.down.clear()
    with net.at("domain-04"):
        LinkHealth.objects.filter(peer="domain-03").update(retry_at=None)  # it speaks again
    copy_now(net, at="domain-04")  # domain-04's changes reach domain-03 ("during")
    assert mailbox(net, "domain-03") == [("before", "pending"), ("during", "pending")]
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "closing"
    told(net, "domain-04", "domain-03")
    net.send(DAVE, CAROL, "late", at="domain-04")  # stored at the holder; its feed is not sent before it falls silent


def test_a_home_takes_its_users_back_from_a_holder_that_fell_silent_while_handing_them_back(standby_ring, settings):
    net = standby_ring
    settings.HAND_BACK_GRACE_SECONDS = 3
    held_and_handing_back(net)
    with net.at("domain-03"):
        row = Takeover.objects.get(home__name="domain-03")
        assert row.held and row.returning_since is not None  # told at the same epoch: news all the same
        assert not login(CAROL, net.app.app_id).ok  # still domain-04's to serve
    holder_silent(net, fence_seconds() + 1)
    with net.at("domain-03"):
        fence_forget()
        assert takeover_watch()["domain-04 holds"] == "taken back"
        assert login(CAROL, net.app.app_id).ok
        taken_back = Takeover.objects.get(home__name="domain-03")
    net.pump()
    assert held_by(net, "domain-03") is None
    assert taken_back.epoch > row.epoch and "silent while handing back" in taken_back.reason
    # Every other domain takes the home's word; the holder does not: only it records what it holds.
    told(net, "domain-03", "domain-02")
    assert held_by(net, "domain-02") is None
    assert told(net, "domain-03", "domain-04")["refused"][0]["reason"] == (
        "only domain-04 records which users domain-04 holds")
    assert held_by(net, "domain-04") == "domain-04"
    # Carol reads "during" at home meanwhile; the holder comes back and finishes its hand-back:
    # "late" comes home with it, nothing she read comes again, nothing is there twice.
    net.deliver(CAROL, at="domain-03")
    net.down.clear()
    with net.at("domain-04"):
        Takeover.objects.update(returning_since=timezone.now() - timedelta(seconds=4))
        assert hand_back("domain-03")["state"] == "handed back"
        assert not Delivery.objects.filter(recipient=CAROL).exists()
    net.pump()
    told(net, "domain-04", "domain-03")
    net.pump()
    assert mailbox(net, "domain-03") == [("before", "delivered"), ("during", "delivered"), ("late", "pending")]
    assert held_by(net, "domain-04") is None and held_by(net, "domain-03") is None


def test_a_home_waits_the_failover_threshold_for_a_holder_that_was_not_handing_back(standby_ring, settings):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    told(net, "domain-04", "domain-03")
    net.down.clear()
    holder_silent(net, fence_seconds() + 1)  # long enough for one handing back, not for one that serves
    with net.at("domain-03"):
        assert takeover_watch() == {}
    assert held_by(net, "domain-03") == "domain-04"
    holder_silent(net, settings.FAILOVER_SECONDS + 1)
    with net.at("domain-03"):
        assert takeover_watch()["domain-04 holds"] == "taken back"
    assert held_by(net, "domain-03") is None


def test_a_home_started_since_its_holder_fell_silent_counts_the_silence_from_the_witness(standby_ring, settings):
    """domain-03, started again after domain-04 (holding its users) was killed, heard domain-04's
    last word again from its neighbours as it started: not long ago here, but said long ago, and
    domain-02 heard it then. The home waits for no more than domain-02 does."""
    net = standby_ring
    failover = settings.FAILOVER_SECONDS
    held_then_holder_silent(net, failover + 1)
    heard(net, "domain-03", "domain-04", 1, like="domain-02")  # (less than two gossip rounds here)
    with net.at("domain-03"):
        assert takeover_watch() == {}  # not even asked yet: its own neighbours may still tell it more
    assert held_by(net, "domain-04") == "domain-04" and held_by(net, "domain-03") == "domain-04"
    heard(net, "domain-03", "domain-04", 2 * settings.PRESENCE_GOSSIP_SECONDS, like="domain-02")
    with net.at("domain-03"):
        assert takeover_watch()["domain-04 holds"] == "taken back"
        assert login(CAROL, net.app.app_id).ok
    assert held_by(net, "domain-03") is None


def test_a_home_started_since_waits_while_the_holders_last_word_is_recent_at_the_witness(standby_ring, settings):
    net = standby_ring
    failover = settings.FAILOVER_SECONDS
    held_then_holder_silent(net, failover + 1)
    heard(net, "domain-02", "domain-04", failover - 2)  # the witness heard a later word of it
    with net.at("domain-03"):
        watched = takeover_watch()
    assert watched == {"domain-04 holds": f"not taken back: domain-02 heard domain-04 within {failover:g} s"}
    assert held_by(net, "domain-03") == "domain-04"


def test_a_home_does_not_take_its_users_back_while_a_third_domain_still_hears_the_holder(standby_ring, settings):
    net = standby_ring
    settings.HAND_BACK_GRACE_SECONDS = 3
    held_and_handing_back(net)
    holder_silent(net, fence_seconds() + 1)
    heard(net, "domain-02", "domain-04", 1)  # domain-04 is only cut off from its home
    with net.at("domain-03"):
        watched = takeover_watch()
    assert watched == {"domain-04 holds": f"not taken back: domain-02 heard domain-04 within {fence_seconds():g} s"}
    assert held_by(net, "domain-03") == "domain-04"


def test_a_holder_cut_off_from_the_network_closes_the_connections_of_the_users_it_holds(standby_ring, settings):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    for n in ("domain-01", "domain-03"):
        heard(net, "domain-04", n, 600)
    with net.at("domain-04"):
        fence_forget()
        watched = takeover_watch()
    assert watched["domain-04"].startswith("cut off from the network")
    with net.at("domain-04"):
        fence_forget()
        assert login(CAROL, net.app.app_id).reason.startswith("domain-04 is cut off from the network")
