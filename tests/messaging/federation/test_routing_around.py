"""A link that fails two hops away is routed around: the domain that cannot pass an item on refuses
it (or hands back what it already took), says which domains it has no way on to, and the domain
before it sends the item another way. An item dies only when no way exists for as long as its app's
attempts allow.

    domain-01 ── domain-02
        │            ╳        the link 02 - 03 failing
    domain-04 ── domain-03
"""

from __future__ import annotations

import pytest

from messaging.core.next_hop import next_hop
from messaging.federation.models import LinkHealth
from messaging.federation.senders.queue import forward_sweep
from messaging.models import Delivery, Message

pytestmark = pytest.mark.django_db

ALICE, CAROL = "ANZ-17", "ANZ-3000007"  # homed in domain-01 and domain-03


def origin_row(message_id: int) -> Delivery:
    return Delivery.objects.get(message_id=message_id, recipient=CAROL)


def test_with_the_link_02_03_down_a_message_from_01_to_03_is_refused_by_02_and_arrives_through_04(net_ring):
    net_ring.cut_link("domain-02", "domain-03")
    sent = [net_ring.send(ALICE, CAROL, f"m{i}") for i in range(3)]
    net_ring.pump()
    assert net_ring.mailbox("domain-03", CAROL) == sent  # all of them, in order
    assert net_ring.copy("domain-03", sent[0]).forward_path == "domain-01,domain-04"
    with pytest.raises(Message.DoesNotExist):
        net_ring.copy("domain-02", sent[0])  # refused there: nothing waits at a domain with no way on
    assert [(origin_row(s).state, origin_row(s).forward_to, origin_row(s).attempts) for s in sent] == \
        [("forwarded", "domain-04", 0)] * 3  # moved, no attempt counted
    # domain-01 remembers that domain-02 has no way to domain-03, for a while: the next goes round at once.
    assert "domain-03" in LinkHealth.objects.get(peer="domain-02").blocked
    assert next_hop("domain-03") == "domain-04"
    calls_to_02 = sum(c.peer == "domain-02" for c in net_ring.calls)
    later = net_ring.send(ALICE, CAROL, "later")
    net_ring.pump()
    assert net_ring.mailbox("domain-03", CAROL) == [*sent, later]
    assert sum(c.peer == "domain-02" for c in net_ring.calls) == calls_to_02


def test_what_02_took_before_its_link_to_03_failed_is_handed_back_and_arrives_through_04(net_ring):
    with net_ring.at("domain-02"):
        net_ring.down.add("domain-03")  # 02 takes the messages, then cannot pass them on
    sent = [net_ring.send(ALICE, CAROL, f"m{i}") for i in range(3)]
    net_ring.pump()
    assert all(origin_row(s).state == "forwarded" for s in sent)  # domain-02 has them
    net_ring.down.clear()
    net_ring.cut_link("domain-02", "domain-03")
    with net_ring.at("domain-02"):
        result = forward_sweep()  # the link to 03 is down and every other way from 02 leads back
    assert result["rerouted"] == {"domain-01": 3}
    net_ring.pump()
    assert net_ring.mailbox("domain-03", CAROL) == sent  # once each, in order
    assert net_ring.copy("domain-03", sent[0]).forward_path == "domain-01,domain-04"  # the way from the origin
    # The origin's rows went round, with their attempts untouched; once delivered, the receipt says so.
    assert [(origin_row(s).state, origin_row(s).forward_to) for s in sent] == [("forwarded", "domain-04")] * 3
    net_ring.deliver(CAROL, at="domain-03")
    net_ring.pump()
    assert [origin_row(s).state for s in sent] == ["delivered"] * 3


def test_with_no_way_left_at_all_a_message_waits_on_the_broken_link_in_order_and_arrives_once_a_way_opens(net_ring):
    net_ring.cut_link("domain-02", "domain-03")
    net_ring.cut_link("domain-04", "domain-03")
    sent = [net_ring.send(ALICE, CAROL, f"patience {i}") for i in range(3)]
    net_ring.pump()
    # Both neighbours said they have no way on; none left from domain-01 either: domain-02 (the
    # shortest way) holds them, waiting on its link to domain-03, in order, not dead.
    assert [(origin_row(s).state, origin_row(s).forward_to) for s in sent] == [("forwarded", "domain-02")] * 3
    waiting = [net_ring.row("domain-02", net_ring.copy("domain-02", s).id, CAROL) for s in sent]
    assert [(w.state, w.forward_to) for w in waiting] == [("forwarding", "domain-03")] * 3
    with net_ring.at("domain-02"):
        assert forward_sweep()["rerouted"] == {}  # domain-01 has no other way: nothing is handed back
    net_ring.cut.clear()
    with net_ring.at("domain-02"):
        LinkHealth.objects.filter(peer="domain-03").update(up=True, down_since=None, retry_at=None, failures=0)
        forward_sweep()
    net_ring.pump()
    assert net_ring.mailbox("domain-03", CAROL) == sent


def test_the_admin_shows_which_neighbour_is_passed_over_for_which_domain(net_ring, operator):
    net_ring.cut_link("domain-02", "domain-03")
    net_ring.send(ALICE, CAROL, "m")
    net_ring.pump()
    page = operator.get("/admin/messaging/linkhealth/").content.decode()
    assert "no way on to (routed around)" in page.lower()
    assert "domain-03 (" in page  # domain-02 said it has no way on to domain-03


BOB = "ANZ-1000003"  # homed in domain-02


def test_with_the_home_down_what_went_round_and_what_comes_after_wait_together_further_on_and_arrive_in_order(net_ring):
    net_ring.down.add("domain-02")
    net_ring.cut_link("domain-01", "domain-02")
    net_ring.cut_link("domain-03", "domain-02")
    first = [net_ring.send(ALICE, BOB, f"first {i}") for i in range(3)]
    net_ring.pump()  # round through domain-04; domain-03 has no way on and is asked to hold them
    later = [net_ring.send(ALICE, BOB, f"later {i}") for i in range(3)]
    net_ring.pump()  # domain-04 has no way on now either: the later ones do not wait on the down link
    with net_ring.at("domain-01"):
        assert "domain-02" in LinkHealth.objects.get(peer="domain-04").blocked
    last = [net_ring.send(ALICE, BOB, f"last {i}") for i in range(3)]
    net_ring.pump()  # routed knowing that every way is closed: they follow the earlier ones all the same
    sent = first + later + last
    assert [(r.state, r.forward_to) for r in (net_ring.row("domain-01", s, BOB) for s in sent)] == \
        [("forwarded", "domain-04")] * 9
    waiting = [net_ring.row("domain-03", net_ring.copy("domain-03", s).id, BOB) for s in sent]
    assert [(w.state, w.forward_to) for w in waiting] == [("forwarding", "domain-02")] * 9  # together, in order
    net_ring.down.clear()
    net_ring.cut.clear()
    for here in ("domain-01", "domain-03"):
        with net_ring.at(here):
            LinkHealth.objects.filter(peer="domain-02").update(up=True, down_since=None, retry_at=None, failures=0)
            forward_sweep()
    net_ring.pump()
    assert net_ring.mailbox("domain-02", BOB) == sent  # each once, in the order they were sent
