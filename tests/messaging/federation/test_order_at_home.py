"""A recipient's home puts each origin's messages into the mailbox in the origin's order, whatever
way each came: a message that comes before an earlier one still on its way waits for it (held, not
in the mailbox yet), for at most NETWORK_ORDER_WAIT_SECONDS.

    domain-01 ── domain-02        m1 goes by domain-02, which stops while it holds it;
        │            │            m2 goes round by domain-04 and reaches domain-03 first.
    domain-04 ── domain-03
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from messaging.federation.inbound import forward_accept
from messaging.federation.models import HeldInOrder, LinkHealth, OrderMark
from messaging.federation.senders.queue import forward_sweep

pytestmark = pytest.mark.django_db

ALICE, CAROL = "ANZ-17", "ANZ-3000007"  # homed in domain-01 and domain-03


def m1_waits_at_02_which_stops_and_m2_goes_round(net_ring) -> tuple[int, int]:
    net_ring.down.add("domain-03")
    m1 = net_ring.send(ALICE, CAROL, "m1")
    net_ring.pump()  # domain-02 has it, waiting on its link to domain-03
    assert net_ring.row("domain-02", net_ring.copy("domain-02", m1).id, CAROL).state == "forwarding"
    net_ring.down.clear()
    net_ring.down.add("domain-02")  # domain-02 stops, with m1
    net_ring.cut_link("domain-01", "domain-02")
    m2 = net_ring.send(ALICE, CAROL, "m2")
    net_ring.pump()  # round by domain-04: at domain-03 before m1
    assert net_ring.copy("domain-03", m2).forward_path == "domain-01,domain-04"
    return m1, m2


def domain_02_comes_back(net_ring) -> None:
    net_ring.down.clear()
    net_ring.cut.clear()
    for here in ("domain-01", "domain-02", "domain-03"):
        with net_ring.at(here):
            LinkHealth.objects.update(up=True, down_since=None, retry_at=None, failures=0)
            forward_sweep()
    net_ring.pump()


def test_a_message_that_overtakes_an_earlier_one_on_another_way_waits_for_it_at_the_home(net_ring):
    m1, m2 = m1_waits_at_02_which_stops_and_m2_goes_round(net_ring)
    assert net_ring.mailbox("domain-03", CAROL) == []  # m2 is stored there, but not before m1
    with net_ring.at("domain-03"):
        assert list(HeldInOrder.objects.values_list("recipient", "origin_domain", "origin_seq")) == \
            [(CAROL, "domain-01", 2)]
    domain_02_comes_back(net_ring)
    assert net_ring.mailbox("domain-03", CAROL) == [m1, m2]
    with net_ring.at("domain-03"):
        assert not HeldInOrder.objects.exists()
        assert OrderMark.objects.get(recipient=CAROL).last_seq == 2
    net_ring.deliver(CAROL, at="domain-03")
    net_ring.pump()
    assert [net_ring.row("domain-01", m, CAROL).state for m in (m1, m2)] == ["delivered"] * 2  # receipts


def test_the_console_and_metrics_show_what_is_held_and_until_when(net_ring, operator, client):
    m1_waits_at_02_which_stops_and_m2_goes_round(net_ring)
    with net_ring.at("domain-03"):
        page = operator.get("/admin/messaging/heldinorder/").content.decode()
        metrics = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert CAROL in page and "waits at most until" in page.lower()
    assert "switchboard_network_held_in_order 1.0" in metrics


def test_a_gap_never_filled_is_given_up_after_the_wait_and_the_earlier_message_comes_late(net_ring):
    m1, m2 = m1_waits_at_02_which_stops_and_m2_goes_round(net_ring)
    with net_ring.at("domain-03"):
        assert forward_sweep()["order_given_up"] == 0  # not waited long enough yet
        with override_settings(NETWORK_ORDER_WAIT_SECONDS=0):
            assert forward_sweep()["order_given_up"] == 1
    net_ring.pump()
    assert net_ring.mailbox("domain-03", CAROL) == [m2]  # m1 is taken for lost on the way meanwhile
    domain_02_comes_back(net_ring)
    assert net_ring.mailbox("domain-03", CAROL) == [m2, m1]  # it was not: late, but there, once


def test_a_domain_that_relays_others_messages_to_a_recipient_leaves_no_gap_in_its_own(net_ring):
    bob = "ANZ-1000003"  # homed in domain-02, on the way from domain-01 to domain-03
    sent = []
    for i in range(3):
        sent.append(("domain-01", net_ring.send(ALICE, CAROL, f"relayed {i}")))
        net_ring.pump()  # through domain-02: a delivery in its mailbox for CAROL too
        sent.append(("domain-02", net_ring.send(bob, CAROL, f"own {i}", at="domain-02")))
        net_ring.pump()
    assert net_ring.copy("domain-03", sent[0][1]).forward_path == "domain-01,domain-02"
    with net_ring.at("domain-03"):
        assert not HeldInOrder.objects.exists()  # nothing waited for a message that was never to come
    assert sorted(net_ring.mailbox("domain-03", CAROL)) == sorted(oid for _, oid in sent)


def test_messages_stored_in_one_call_wait_behind_a_gap_and_all_go_in_when_it_is_filled(net_ring):
    def item(oid: int, seq: int) -> dict:
        return {"app": "ANZ", "sender": ALICE, "kind": "direct", "content": f"#{oid}", "reference": "",
                "confirmation_requested": False, "client_message_id": None, "origin_domain": "domain-01",
                "origin_message_id": oid, "path": ["domain-01", "domain-04"], "confirms": "",
                "recipients": [CAROL], "seqs": {CAROL: seq}}

    with net_ring.at("domain-03"):
        first = forward_accept(sender="domain-04", payload={"messages": [item(103, 3), item(104, 4)]})
        again = forward_accept(sender="domain-04", payload={"messages": [item(103, 3), item(104, 4)]})
        assert (first["stored"], again["stored"], again["duplicates"]) == (2, 0, 2)  # a repeated call adds nothing
    assert net_ring.mailbox("domain-03", CAROL) == []
    with net_ring.at("domain-03"):
        forward_accept(sender="domain-04", payload={"messages": [item(101, 1)]})
    assert net_ring.mailbox("domain-03", CAROL) == [101]  # 2 is still missing
    with net_ring.at("domain-03"):
        forward_accept(sender="domain-04", payload={"messages": [item(102, 2)]})
    assert net_ring.mailbox("domain-03", CAROL) == [101, 102, 103, 104]


def test_a_message_sent_again_elsewhere_after_its_first_send_was_stored_here_keeps_its_origins_order(net_ring):
    """Alice's second message was stored here first from domain-02 (it served her then, and was lost
    before it answered her); she sent it again, with its clientMessageId, from home (domain-01), which
    numbers it 2 in its own order. It is stored once, and domain-01's 3 does not wait for it."""
    def item(oid: int, seq: int, origin: str = "domain-01", cmid: str | None = None) -> dict:
        return {"app": "ANZ", "sender": ALICE, "kind": "direct", "content": f"#{oid}", "reference": "",
                "confirmation_requested": False, "client_message_id": cmid, "origin_domain": origin,
                "origin_message_id": oid, "path": [origin, "domain-04"], "confirms": "",
                "recipients": [CAROL], "seqs": {CAROL: seq}}

    with net_ring.at("domain-03"):
        forward_accept(sender="domain-04", payload={"messages": [item(101, 1)]})
        forward_accept(sender="domain-04", payload={"messages": [item(500, 1, "domain-02", "alice-2")]})
        again = forward_accept(sender="domain-04", payload={"messages": [item(102, 2, cmid="alice-2"), item(103, 3)]})
        assert again["duplicates"] == 1
        assert not HeldInOrder.objects.exists()
    assert net_ring.mailbox("domain-03", CAROL) == [101, 500, 103]


def test_a_malformed_sequence_refuses_the_call(net_ring):
    from messaging.federation.wire.transport import PeerRefused

    payload = {"messages": [{"app": "ANZ", "sender": ALICE, "kind": "direct", "content": "x", "reference": "",
                             "confirmation_requested": False, "client_message_id": None,
                             "origin_domain": "domain-01", "origin_message_id": 5, "path": ["domain-01"],
                             "confirms": "", "recipients": [CAROL], "seqs": {"ANZ-99": 1}}]}
    with net_ring.at("domain-03"), pytest.raises(PeerRefused, match="seqs must map recipients"):
        forward_accept(sender="domain-01", payload=payload)
