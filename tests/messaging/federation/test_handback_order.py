"""Order kept across a hand-back (issue 46, item 2), on the one-database ring: what the holder held
for an earlier message of its origin goes home with the hand-back, and what the hand-back put in a
home's mailbox counts as placed there, so the next arrival of that origin does not wait for it.

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04
"""

from __future__ import annotations

import pytest
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from messaging.federation.models import HeldInOrder, OrderMark
from messaging.federation.order import Arrival, arrivals_put_in_order
from messaging.federation.standby.mailbox_merge import Copied, mailbox_merge
from messaging.federation.takeover.records import network_accept
from messaging.federation.takeover.take import given_back, take_over
from messaging.models import Delivery, Mailbox, Message
from tests.messaging.federation.test_takeover import (
    ALICE,
    CAROL,
    copy_now,
    handed_back_and_told,
    lost,
    mailbox,
    taken_over_and_back,
    told_by_04,
)

pytestmark = pytest.mark.django_db


def from_01(net, content: str, oid: int) -> Message:
    """A message stored first at domain-01, as it stands at the domain in use."""
    return Message.objects.create(app_id=net.app.pk, sender=ALICE, content=content, origin_domain="domain-01",
                                  origin_message_id=oid, forward_path="domain-01", created_at=timezone.now())


def record_to_holder(net, message: Message, origin_seq: int) -> None:
    """The home's record of passing `message` on to carol's holder (no mailbox row here), numbered
    in her mailbox's count."""
    box, _ = Mailbox.objects.get_or_create(app_id=net.app.pk, user_id=CAROL)
    Mailbox.objects.filter(pk=box.pk).update(last_seq=F("last_seq") + 1)
    box.refresh_from_db()
    Delivery.objects.create(message=message, app_id=net.app.pk, recipient=CAROL, seq=box.last_seq, state="forwarded",
                            forward_to="domain-04", origin_seq=origin_seq, created_at=timezone.now())


def test_a_message_the_holder_held_for_one_its_home_had_goes_home_with_the_hand_back_after_it(standby_ring):
    net = standby_ring
    net.send(ALICE, CAROL, "m1")
    net.pump()
    copy_now(net)  # the standby has m1 ...
    net.send(ALICE, CAROL, "m2")
    net.pump()  # ... but not m2: the home was lost before its copy went
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    with net.at("domain-01"):
        network_accept(told_by_04(net), sender="domain-04")
    net.send(ALICE, CAROL, "m3")
    net.pump()
    with net.at("domain-04"):  # m3 waits at the holder for m2, which only the lost home has
        assert list(HeldInOrder.objects.values_list("recipient", "origin_seq")) == [(CAROL, 3)]
    assert [c for c, _ in mailbox(net, "domain-04")] == ["m1"]
    net.down.clear()
    handed_back_and_told(net)
    net.pump()
    with net.at("domain-04"):
        assert not HeldInOrder.objects.exists()
        assert not Delivery.objects.filter(recipient=CAROL).exists()
    assert [c for c, _ in mailbox(net, "domain-03")] == ["m1", "m2", "m3"]  # home with the rest, in order
    net.send(ALICE, CAROL, "m4")
    net.pump()
    assert [c for c, _ in mailbox(net, "domain-03")] == ["m1", "m2", "m3", "m4"]


def test_a_record_a_home_puts_back_in_the_mailbox_lets_the_next_message_of_its_origin_in_at_once(standby_ring):
    net = standby_ring
    taken_over_and_back(net)
    # While held, the home passed a message from domain-01 on to the holder (a record only here),
    # and the holder took it for a duplicate of its own; the hand-back puts it in the mailbox.
    with net.at("domain-03"):
        record_to_holder(net, from_01(net, "n1", 9001), 1)
    handed_back_and_told(net)
    with net.at("domain-03"):
        given_back("domain-04")
        assert OrderMark.objects.get(recipient=CAROL, origin_domain="domain-01").last_seq == 1
        later = from_01(net, "n2", 9002)
        placed = arrivals_put_in_order([Arrival(later.id, net.app.pk, CAROL, "domain-01", 2)])
    assert placed.held == 0  # not NETWORK_ORDER_WAIT_SECONDS for n1, which is in the mailbox already
    assert [c for c, _ in mailbox(net, "domain-03")] == ["n1", "n2"]


def test_an_arrival_held_at_a_home_before_its_hand_back_goes_in_once_the_hand_back_fills_its_gap(standby_ring):
    net = standby_ring
    taken_over_and_back(net)
    with net.at("domain-03"), override_settings(NETWORK_ORDER_WAIT_SECONDS=3600):
        OrderMark.objects.create(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-01", last_seq=0, held=0)
        k1, k2 = from_01(net, "k1", 9101), from_01(net, "k2", 9102)
        record_to_holder(net, k1, 1)
        assert arrivals_put_in_order([Arrival(k2.id, net.app.pk, CAROL, "domain-01", 2)]).held == 1
    handed_back_and_told(net)
    with net.at("domain-03"):
        given_back("domain-04")
        assert not HeldInOrder.objects.exists()
    assert [c for c, _ in mailbox(net, "domain-03")] == ["k1", "k2"]


def test_an_arrival_held_for_a_message_a_merge_brings_goes_in_with_the_merge(standby_ring):
    net = standby_ring
    with net.at("domain-03"), override_settings(NETWORK_ORDER_WAIT_SECONDS=3600):
        second = from_01(net, "p2", 9202)
        assert arrivals_put_in_order([Arrival(second.id, net.app.pk, CAROL, "domain-01", 2)]).held == 1
        # the holder's rows come home: among them the first, which the second waited for
        mailbox_merge([Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-01", origin_message_id=9201,
                              state="pending", origin_seq=1, message={"sender": ALICE, "content": "p1"})])
        assert not HeldInOrder.objects.exists()  # not NETWORK_ORDER_WAIT_SECONDS later
    assert [c for c, _ in mailbox(net, "domain-03")] == ["p1", "p2"]
