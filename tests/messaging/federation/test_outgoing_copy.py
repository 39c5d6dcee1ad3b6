"""A home's outgoing queue on its standby (messaging.federation.standby.outgoing_copy): what a home's user sent
to a user homed elsewhere, while it waits on the home's links, is copied to the standby; a standby
that takes the home over sends it on before the user's next messages. On the one-database ring:

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04; ALICE on 01
"""

from __future__ import annotations

import pytest

from foundation.handoff import FORWARD_LINK_TASK
from messaging.federation.models import StandbyOutgoing
from messaging.federation.order import Arrival, arrivals_put_in_order
from messaging.federation.senders.queue import forward_sweep
from messaging.federation.standby.mailbox_merge import Copied, mailbox_merge
from messaging.federation.takeover.take import take_over
from messaging.models import Delivery, Message
from messaging.routing.tasks import standby_sweep
from tests.messaging.federation.test_takeover import ALICE, BOB, CAROL, DAVE, copy_now, lost

pytestmark = pytest.mark.django_db


def alices_mailbox(net) -> list[str]:
    with net.at("domain-01"):
        return list(Delivery.objects.filter(recipient=ALICE, forward_to="").order_by("seq")
                    .values_list("message__content", flat=True))


def waiting_at_the_standby(net) -> list[tuple[str, str]]:
    with net.at("domain-04"):
        return list(StandbyOutgoing.objects.values_list("recipient", "content"))


def test_a_message_waiting_on_a_lost_homes_link_is_sent_on_by_the_standby_before_the_users_next_one(standby_ring):
    net = standby_ring
    net.send(CAROL, ALICE, "sent at home", at="domain-03")
    net.pump(skip=FORWARD_LINK_TASK)  # queued on domain-03's link, and the home is lost before it goes
    with net.at("domain-03"):
        standby_sweep()
    net.pump(skip=FORWARD_LINK_TASK)
    assert waiting_at_the_standby(net) == [(ALICE, "sent at home")]
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    assert waiting_at_the_standby(net) == []
    net.send(CAROL, ALICE, "sent at the standby", at="domain-04")
    net.pump()
    assert alices_mailbox(net) == ["sent at home", "sent at the standby"]
    # The home returns and sends its queue: ALICE's home takes that message once.
    net.down.clear()
    net.cut.clear()
    with net.at("domain-03"):
        forward_sweep()
    net.pump()
    assert alices_mailbox(net) == ["sent at home", "sent at the standby"]


def test_a_message_the_home_sent_on_leaves_the_standbys_copy_of_its_queue(standby_ring):
    net = standby_ring
    net.send(CAROL, ALICE, "on its way", at="domain-03")
    net.pump()  # forwarded: queued on the link, then gone from it
    copy_now(net)
    assert alices_mailbox(net) == ["on its way"]
    assert waiting_at_the_standby(net) == []


def test_a_message_held_at_the_standby_behind_one_the_home_still_had_queued_goes_in_with_the_takeover(standby_ring):
    net = standby_ring
    net.send(CAROL, DAVE, "sent at home", at="domain-03")  # the first from domain-03 to dave
    net.pump(skip=FORWARD_LINK_TASK)  # queued on domain-03's link, and the home is lost before it goes
    with net.at("domain-03"):
        standby_sweep()
    net.pump(skip=FORWARD_LINK_TASK)
    assert waiting_at_the_standby(net) == [(DAVE, "sent at home")]
    with net.at("domain-04"):  # the second came another way, and waits for the first (its origin's order)
        mailbox_merge([Copied(app_id=net.app.pk, recipient=BOB, origin_domain="domain-03", origin_message_id=900,
                              state="pending", origin_seq=1, message={"sender": CAROL, "content": "second"})])
        second = Message.objects.get(origin_domain="domain-03", origin_message_id=900).pk
        assert arrivals_put_in_order([Arrival(second, net.app.pk, DAVE, "domain-03", 2)]).held == 1
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        # Not NETWORK_ORDER_WAIT_SECONDS later: the takeover put the first in, and so the second.
        assert list(Delivery.objects.filter(recipient=DAVE, forward_to="").order_by("seq")
                    .values_list("message__content", flat=True)) == ["sent at home", "second"]
