"""One sender's messages to one recipient from two origins keep their order at the recipient's home
(issue 46, item 2; messaging.federation.order, "After another origin"), on the one-database ring:

    domain-01 ── domain-02      BOB is homed on 02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04

While domain-04 holds carol, what she sends bob from there says it comes after domain-03's last
message to bob that domain-04 knows of; once she is home again, what she sends from domain-03 says it
comes after domain-04's count for bob at the hand-back.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging.federation.inbound import forward_accept
from messaging.federation.models import HeldInOrder, LinkHealth, OrderAfter, OrderMark
from messaging.federation.order import Arrival, arrivals_put_in_order, held_release_overdue
from messaging.federation.senders.queue import forward_sweep
from messaging.federation.standby.copy import copies_accept
from messaging.federation.takeover.take import take_over
from messaging.federation.wire.transport import FORWARD_PATH, PeerRefused
from messaging.models import Delivery, Message
from tests.messaging.federation.test_takeover import BOB, CAROL, handed_back_and_told, lost
from tests.network import DOMAINS

pytestmark = pytest.mark.django_db


def bobs_mailbox(net) -> list[str]:
    with net.at("domain-02"):
        return list(Delivery.objects.filter(recipient=BOB, forward_to="").order_by("seq")
                    .values_list("message__content", flat=True))


def links_back(net) -> None:
    """Every domain answers again and every link is up: what waited goes on."""
    net.down.clear()
    net.cut.clear()
    for n in DOMAINS:
        with net.at(n):
            LinkHealth.objects.update(up=True, down_since=None, retry_at=None)
            forward_sweep()
    net.pump()


def arrive(net, content: str, origin: str, seq: int, after: tuple[str, int] | None = None) -> None:
    """A message of `origin`'s for bob reaches domain-02 (its home) with its place there, and `after`."""
    with net.at("domain-02"):
        message = Message.objects.create(app_id=net.app.pk, sender=CAROL, content=content, origin_domain=origin,
                                         origin_message_id=1000 + seq + (500 if origin == "domain-04" else 0),
                                         forward_path=origin, created_at=timezone.now(),
                                         order_after={BOB: list(after)} if after else None)
        arrivals_put_in_order([Arrival(message.pk, net.app.pk, BOB, origin, seq, CAROL, after)])


def test_a_message_that_says_it_comes_after_another_origins_waits_for_it_and_goes_in_behind_it(net_ring):
    net = net_ring
    arrive(net, "home 1", "domain-03", 1)
    arrive(net, "holder 1", "domain-04", 1, after=("domain-03", 2))  # home 2 is still on its way
    assert bobs_mailbox(net) == ["home 1"]
    with net.at("domain-02"):
        assert OrderMark.objects.get(recipient=BOB, origin_domain="domain-04").after_origin == "domain-03"
    arrive(net, "holder 2", "domain-04", 2)  # behind the barrier too, in its origin's order
    arrive(net, "home 2", "domain-03", 2)
    assert bobs_mailbox(net) == ["home 1", "home 2", "holder 1", "holder 2"]
    with net.at("domain-02"):
        assert not HeldInOrder.objects.exists()
        assert OrderMark.objects.get(recipient=BOB, origin_domain="domain-04").after_origin == ""


def test_a_message_whose_other_origins_message_is_in_already_goes_in_at_once(net_ring):
    net = net_ring
    arrive(net, "home 1", "domain-03", 1)
    arrive(net, "holder 1", "domain-04", 1, after=("domain-03", 1))
    assert bobs_mailbox(net) == ["home 1", "holder 1"]


def test_a_message_waits_for_another_origins_at_most_the_order_wait_which_then_counts_as_lost(net_ring, settings):
    net = net_ring
    arrive(net, "holder 1", "domain-04", 1, after=("domain-03", 3))
    assert bobs_mailbox(net) == []
    with net.at("domain-02"):
        OrderMark.objects.filter(recipient=BOB, origin_domain="domain-04").update(
            blocked_until=timezone.now() - timedelta(seconds=1))
        assert held_release_overdue() == 1
        assert OrderMark.objects.get(recipient=BOB, origin_domain="domain-03").last_seq == 3
    net.pump()
    arrive(net, "home 2, late", "domain-03", 2)  # taken for lost: it goes in late, at once
    arrive(net, "holder 2", "domain-04", 2, after=("domain-03", 3))  # waits no more
    assert bobs_mailbox(net) == ["holder 1", "home 2, late", "holder 2"]


def test_the_standby_keeps_the_homes_highest_place_for_each_recipient_its_outgoing_copy_showed(standby_ring):
    net = standby_ring

    def outgoing(seq: int, state: str) -> dict:
        message = {"sender": CAROL, "content": f"to bob {seq}"} if state == "forwarding" else None
        return {"delivery": seq, "app": "ANZ", "recipient": BOB, "state": state, "origin_seq": seq,
                "origin_message_id": 700 + seq, **({"message": message} if message else {})}

    with net.at("domain-04"):
        copies_accept(sender="domain-03", payload={"copies": [], "outgoing": [outgoing(4, "forwarding"),
                                                                             outgoing(7, "forwarding")]})
        copies_accept(sender="domain-03", payload={"copies": [], "outgoing": [outgoing(7, "forwarded")]})  # sent on
        assert list(OrderAfter.objects.values_list("recipient", "senders_home", "origin_domain", "seq", "until")) == [
            (BOB, "domain-03", "domain-03", 7, None)]


def test_what_carol_sends_bob_from_her_holder_follows_her_homes_messages_she_sent_before(standby_ring):
    net = standby_ring
    net.cut_link("domain-03", "domain-02")
    net.cut_link("domain-03", "domain-04")  # her first messages wait at home; the standby's copy knows them
    for i in (1, 2):
        net.send(CAROL, BOB, f"from home {i}", at="domain-03")
    with net.at("domain-04"):
        OrderAfter.objects.create(app=net.app, recipient=BOB, senders_home="domain-03", origin_domain="domain-03",
                                  seq=2, updated_at=timezone.now() - timedelta(minutes=1))  # (as its copy left it)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    net.send(CAROL, BOB, "from the holder", at="domain-04")
    net.pump()
    sent = [c.payload for c in net.calls if c.path == FORWARD_PATH and c.sender == "domain-04"]
    assert any(m.get("after") == {BOB: ["domain-03", 2]} for p in sent for m in p.get("messages", []))
    assert bobs_mailbox(net) == []  # held at bob's home behind domain-03's two
    links_back(net)
    assert bobs_mailbox(net) == ["from home 1", "from home 2", "from the holder"]


def test_what_carol_sends_bob_from_home_after_her_hand_back_follows_what_she_sent_from_her_holder(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    net.cut_link("domain-04", "domain-01")  # what she sends from the holder waits there
    net.send(CAROL, BOB, "from the holder", at="domain-04")
    net.pump()
    net.down.clear()
    handed_back_and_told(net)
    with net.at("domain-03"):
        follow = OrderAfter.objects.get(recipient=BOB)
        assert (follow.senders_home, follow.origin_domain, follow.seq) == ("domain-03", "domain-04", 1)
        assert follow.until > timezone.now()
    net.send(CAROL, BOB, "from home", at="domain-03")
    net.pump()
    assert bobs_mailbox(net) == []  # held at bob's home behind the holder's message
    links_back(net)
    assert bobs_mailbox(net) == ["from the holder", "from home"]


@pytest.mark.parametrize("after", [{BOB: ["domain-03"]}, {BOB: ["domain-03", 0]}, {BOB: [3, 1]}, {"ANZ-99": ["domain-03", 1]},
                                   ["domain-03", 1]])
def test_a_forwarding_call_with_a_malformed_after_is_refused_whole_and_nothing_of_it_is_stored(net_ring, after):
    payload = {"messages": [{"app": "ANZ", "sender": CAROL, "kind": "direct", "content": "x", "reference": "",
                             "confirmation_requested": False, "client_message_id": None,
                             "origin_domain": "domain-04", "origin_message_id": 5, "path": ["domain-04", "domain-01"],
                             "confirms": "", "recipients": [BOB], "seqs": {BOB: 1}, "after": after}]}
    with net_ring.at("domain-02"), pytest.raises(PeerRefused, match="after must map recipients"):
        forward_accept(sender="domain-01", payload=payload)
    with net_ring.at("domain-02"):
        assert not Message.objects.filter(content="x").exists()


def test_counts_from_a_domain_that_holds_none_of_the_homes_users_are_refused(standby_ring):
    with standby_ring.at("domain-03"), pytest.raises(PeerRefused, match="holds none of domain-03's users"):
        copies_accept(sender="domain-02", payload={"after": [{"app": "ANZ", "recipient": BOB, "seq": 4}]})
    with standby_ring.at("domain-03"):
        assert not OrderAfter.objects.exists()


def test_the_sweep_forgets_a_hand_backs_counts_past_their_wait_and_a_homes_places_a_day_old(net_ring):
    now = timezone.now()
    with net_ring.at("domain-03"):
        for senders_home, origin, until, updated in [("domain-03", "domain-04", now - timedelta(hours=1), now),
                                                     ("domain-03", "domain-01", now + timedelta(seconds=60), now),
                                                     ("domain-02", "domain-02", None, now - timedelta(days=2)),
                                                     ("domain-04", "domain-04", None, now - timedelta(hours=1))]:
            OrderAfter.objects.create(app=net_ring.app, recipient=BOB, senders_home=senders_home, origin_domain=origin,
                                      seq=1, until=until, updated_at=updated)
        held_release_overdue()
        assert sorted(OrderAfter.objects.values_list("origin_domain", flat=True)) == ["domain-01", "domain-04"]


def test_the_console_shows_the_barrier_a_message_put_up_and_what_the_standby_follows(net_ring, operator):
    arrive(net_ring, "holder 1", "domain-04", 1, after=("domain-03", 2))
    with net_ring.at("domain-02"):
        OrderAfter.objects.create(app=net_ring.app, recipient=CAROL, senders_home="domain-01",
                                  origin_domain="domain-01", seq=9, updated_at=timezone.now())
        marks = operator.get("/admin/messaging/ordermark/?barrier=any").content.decode()
        follows = operator.get("/admin/messaging/orderafter/").content.decode()
    assert BOB in marks and "domain-03" in marks
    assert CAROL in follows and "domain-01" in follows


def test_a_held_users_message_first_queued_after_the_homes_places_moved_follows_nothing_and_keeps_that(standby_ring):
    """(Its routing came late, past the hand-back: the home feeds again, and what it sent since comes
    after this message. Following it, the two would wait on each other.)"""
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        OrderAfter.objects.create(app=net.app, recipient=BOB, senders_home="domain-03", origin_domain="domain-03",
                                  seq=5, updated_at=timezone.now() + timedelta(minutes=1))
    sent = net.send(CAROL, BOB, "from the holder, routed late", at="domain-04")
    net.pump()
    with net.at("domain-04"):
        assert Message.objects.get(pk=sent).order_after == {BOB: None}  # looked at once, and kept
    assert bobs_mailbox(net) == ["from the holder, routed late"]  # nothing held it at bob's home


def test_a_barrier_put_up_does_not_bring_back_the_other_kind_whose_wait_was_over(net_ring):
    net = net_ring
    arrive(net, "home 1", "domain-03", 1)
    with net.at("domain-02"):
        OrderMark.objects.create(app=net.app, recipient=BOB, origin_domain="domain-04", last_seq=0, held=0,
                                 blocked_by="domain-01", blocked_until=timezone.now() - timedelta(seconds=5))
    arrive(net, "holder 1", "domain-04", 1, after=("domain-03", 2))
    with net.at("domain-02"):
        mark = OrderMark.objects.get(recipient=BOB, origin_domain="domain-04")
        assert (mark.blocked_by, mark.after_origin, mark.after_seq) == ("", "domain-03", 2)
    arrive(net, "home 2", "domain-03", 2)
    assert bobs_mailbox(net) == ["home 1", "home 2", "holder 1"]  # and nothing waits on the old holder


def test_two_messages_that_each_follow_the_others_origin_do_not_wait_on_each_other(net_ring):
    """Around a second takeover, each origin's message follows the other's earlier one: home's 1st
    follows the holder's 1st, the holder's 2nd follows home's 1st. The holder's 1st, before its 2nd,
    is not held by the barrier its 2nd put up (it held every message of its origin: the two waited
    on each other until the order wait was over, then went in crossed, seven pairs in a fault run)."""
    net = net_ring
    arrive(net, "home 1", "domain-03", 1, after=("domain-04", 1))
    arrive(net, "holder 2", "domain-04", 2, after=("domain-03", 1))
    assert bobs_mailbox(net) == []
    arrive(net, "holder 1", "domain-04", 1)
    assert bobs_mailbox(net) == ["holder 1", "home 1", "holder 2"]
    with net.at("domain-02"):
        assert not HeldInOrder.objects.exists()
        assert not OrderMark.objects.exclude(after_origin="").exists()


def test_two_origins_that_follow_each_other_by_turns_go_in_by_turns(net_ring):
    """Carol's home sent 1-2, her holder h1-h3 (after home's 2), home again 3-5 (after the holder's
    3), the holder again h4-h5 (after home's 5). Each arrival's own `after` counts: the holder's h1
    is not held for home's 5, which h4 waits for (one barrier for the key, after home's 5 from h1 on,
    held h1-h3 while home's 3-5 waited for h3: both waited out the order wait and went in crossed,
    17 pairs in a fault run)."""
    net = net_ring
    arrive(net, "home 1", "domain-03", 1)
    arrive(net, "home 2", "domain-03", 2)
    for seq in (3, 4, 5):
        arrive(net, f"home {seq}", "domain-03", seq, after=("domain-04", 3))
    arrive(net, "holder 4", "domain-04", 4, after=("domain-03", 5))
    arrive(net, "holder 5", "domain-04", 5, after=("domain-03", 5))
    assert bobs_mailbox(net) == ["home 1", "home 2"]
    for seq in (1, 2, 3):
        arrive(net, f"holder {seq}", "domain-04", seq, after=("domain-03", 2))
    assert bobs_mailbox(net) == ["home 1", "home 2", "holder 1", "holder 2", "holder 3", "home 3", "home 4",
                                 "home 5", "holder 4", "holder 5"]
    with net.at("domain-02"):
        assert not HeldInOrder.objects.exists()


def test_when_the_wait_is_over_what_the_other_origin_held_before_the_awaited_message_goes_in_first(net_ring,
                                                                                                  settings):
    """The holder's 1 follows home's 3; home's 2 and 3 are held behind home's 1, which never comes.
    When the holder's 1 has waited the order wait, home's 1 is taken for lost: home's 2 and 3 go in,
    then the holder's 1 (not the other way round because the holder's was held first)."""
    net = net_ring
    arrive(net, "holder 1", "domain-04", 1, after=("domain-03", 3))
    arrive(net, "home 2", "domain-03", 2)
    arrive(net, "home 3", "domain-03", 3)
    assert bobs_mailbox(net) == []
    with net.at("domain-02"):
        HeldInOrder.objects.filter(origin_domain="domain-04").update(
            held_at=timezone.now() - timedelta(seconds=settings.NETWORK_ORDER_WAIT_SECONDS + 1))
        held_release_overdue()
    assert bobs_mailbox(net) == ["home 2", "home 3", "holder 1"]
