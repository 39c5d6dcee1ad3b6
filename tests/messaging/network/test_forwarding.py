"""Messages for users homed in other domains travel hop by hop, are stored once in every domain on
the way, arrive in order, and their origin learns where they are."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from foundation.outbound import Limits
from messaging.api.serializers import DeliverySerializer
from messaging.delivery.retry import deliveries_fail
from messaging.models import Delivery, Message
from messaging.network.intake import forward_accept
from messaging.network.models import LinkHealth
from messaging.network.outbox import link_forward, payload_build, queue_peek
from messaging.network.queue import forward_sweep
from messaging.network.transport import PeerRefused
from messaging.protocol import delivery_frame

pytestmark = pytest.mark.django_db

NEAR, FAR = "ANZ-1000005", "ANZ-3000007"  # homed in domain-02 and domain-03
ALICE = "ANZ-17"  # homed in domain-01


def row(message_id: int, recipient: str) -> Delivery:
    """A delivery row at domain-01 (the origin)."""
    return Delivery.objects.get(message_id=message_id, recipient=recipient)


def test_a_message_to_a_user_two_domains_away_is_stored_once_in_each_domain_on_the_shortest_path(net):
    sent = net.send(ALICE, FAR, "hello far")
    net.pump()
    origin_row = row(sent, FAR)
    assert (origin_row.state, origin_row.forward_to) == ("forwarded", "domain-02")
    at_02, at_03 = net.copy("domain-02", sent), net.copy("domain-03", sent)
    assert (at_02.forward_path, at_03.forward_path) == ("domain-01", "domain-01,domain-02")
    on_02 = net.row("domain-02", at_02.id, FAR)
    assert (on_02.state, on_02.forward_to) == ("forwarded", "domain-03")
    home = net.row("domain-03", at_03.id, FAR)
    assert (home.state, at_03.content, at_03.sender) == ("pending", "hello far", ALICE)  # in FAR's mailbox


def test_once_delivered_at_home_the_receipt_makes_the_row_delivered_all_the_way_back(net):
    sent = net.send(ALICE, FAR)
    net.pump()
    net.deliver(FAR, at="domain-03")
    net.pump()
    assert row(sent, FAR).state == "delivered" and row(sent, FAR).delivered_at is not None
    assert net.row("domain-02", net.copy("domain-02", sent).id, FAR).state == "delivered"


def test_the_sender_gets_the_same_confirmation_frame_as_from_a_user_of_its_own_domain(net):
    sent = net.send(ALICE, FAR, confirmation_requested=True, reference="ref-42")
    net.pump()
    net.deliver(FAR, at="domain-03")
    net.pump()
    confirmation = Message.objects.get(confirms_id=sent)
    to_alice = Delivery.objects.get(message=confirmation, recipient=ALICE)
    assert (confirmation.kind, confirmation.reference, confirmation.sender) == ("confirmation", "ref-42", FAR)
    assert to_alice.state == "pending"  # in Alice's mailbox at domain-01, pushed once she is online
    frame = delivery_frame(kind=confirmation.kind, sender=confirmation.sender, content=confirmation.content,
                           reference=confirmation.reference, message_id=confirmation.id, seq=to_alice.seq)
    local = delivery_frame(kind="confirmation", sender="ANZ-2", content="", reference="ref-42",
                           message_id=confirmation.id, seq=to_alice.seq)
    assert frame == local


def test_a_repeated_call_stores_nothing_new_and_a_later_call_adds_only_the_missing_recipients(net):
    net.send(ALICE, [NEAR], "group")
    net.pump()  # sends it over; then replay the very same payload
    origin, payload = net.calls[0].sender, net.calls[0].payload
    with net.at("domain-02"):
        again = forward_accept(sender=origin, payload=payload)
        payload["messages"][0]["recipients"] = [NEAR, "ANZ-1000006"]
        more = forward_accept(sender=origin, payload=payload)
    assert again == {"stored": 0, "duplicates": 1, "receipts": 0}
    assert more == {"stored": 1, "duplicates": 1, "receipts": 0}
    with net.at("domain-02"):
        assert Message.objects.filter(origin_message_id=payload["messages"][0]["origin_message_id"]).count() == 1


def test_a_group_message_goes_once_over_a_link_with_all_its_recipients_there(net):
    sent = net.send(ALICE, [NEAR, FAR, "ANZ-18"], "to all", kind="group")
    net.pump()
    first = net.calls[0]
    assert (first.sender, first.peer) == ("domain-01", "domain-02")
    assert [m["recipients"] for m in first.payload["messages"]] == [[NEAR, FAR]]
    assert row(sent, "ANZ-18").state == "pending" and row(sent, NEAR).state == "forwarded"


@override_settings(FORWARD_BATCH_SIZE=2)
def test_one_senders_messages_to_one_recipient_arrive_in_order_across_domains(net):
    sent = [net.send(ALICE, FAR, f"m{i}") for i in range(7)]
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent
    assert len(net.calls) >= 4  # batches of two on each link


def test_the_payload_keeps_every_recipients_order_when_messages_share_recipients():
    class Row:
        def __init__(self, recipient, message_id):
            self.recipient, self.message_id, self.app_id = recipient, message_id, 1
            self.message = {"id": message_id}

    # b's mailbox: 3 then 1; a's: 1 then 2; c's: 2 then 3 would be a cycle, which mailboxes never make.
    rows = [Row("a", 1), Row("a", 2), Row("b", 3), Row("b", 1)]
    assert [m["id"] for m in payload_build(rows)] == [3, 1, 2]


def test_a_link_that_refuses_keeps_its_queue_in_order_counting_attempts_then_dead_letters_with_the_reason(net):
    net.down.add("domain-02")
    sent = net.send(ALICE, NEAR)
    net.pump()
    waiting = row(sent, NEAR)
    assert (waiting.state, waiting.attempts, waiting.last_error) == (
        "forwarding", 1, "forwarding to domain-02 failed: connection refused")
    health = LinkHealth.objects.get(peer="domain-02")
    assert (health.up, health.last_error, health.retry_at is not None) == (False, "domain-02: connection refused", True)
    assert link_forward(peer="domain-02")["skipped"] == "held back"  # the backoff holds the queue until retry_at
    for _ in range(2):
        LinkHealth.objects.update(retry_at=None)
        link_forward(peer="domain-02")
    dead = row(sent, NEAR)
    assert (dead.state, dead.attempts, dead.last_error) == ("dead", 3, "forwarding to domain-02 failed: connection refused")


def test_once_the_link_answers_again_the_waiting_queue_goes_and_the_link_is_up(net):
    net.down.add("domain-02")
    sent = net.send(ALICE, NEAR)
    net.pump()
    net.down.clear()
    LinkHealth.objects.update(retry_at=None)
    link_forward(peer="domain-02")
    assert row(sent, NEAR).state == "forwarded"
    health = LinkHealth.objects.get(peer="domain-02")
    assert (health.up, health.forwarded_out) == (True, 1)


def test_a_message_that_made_the_hop_limit_is_dead_lettered_instead_of_sent(net):
    with net.at("domain-02"):
        path = [f"domain-{i:02d}" for i in range(10, 19)] + ["domain-01"]  # ten domains: ten hops to here
        forward_accept(sender="domain-01", payload={"messages": [{
            "app": "ANZ", "sender": ALICE, "kind": "direct", "content": "x", "reference": "",
            "confirmation_requested": False, "client_message_id": None, "origin_domain": "domain-10",
            "origin_message_id": 5, "path": path, "confirms": "", "recipients": [FAR]}]})
    net.pump()
    dead = net.row("domain-02", net.copy("domain-02", 5, origin="domain-10").id, FAR)
    assert (dead.state, dead.last_error) == ("dead", "hop limit (10) reached")


def _payload(**overrides) -> dict:
    item = {"app": "ANZ", "sender": ALICE, "kind": "direct", "content": "x", "reference": "",
            "confirmation_requested": False, "client_message_id": None, "origin_domain": "domain-01",
            "origin_message_id": 9, "path": ["domain-01"], "confirms": "", "recipients": [NEAR]}
    item.update(overrides)
    return {"messages": [item]}


@pytest.mark.parametrize(("overrides", "status", "reason"), [
    ({"path": [f"domain-{i:02d}" for i in range(1, 12)]}, 422, "hop limit (10) exceeded"),
    ({"app": "NOPE"}, 422, "app 'NOPE' is not known in domain-02"),
    ({"origin_message_id": "9"}, 400, "origin_message_id must be a positive whole number"),
    ({"recipients": []}, 400, "recipients must be a non-empty list"),
    ({"kind": "fast"}, 400, "kind must be one of"),
    ({"path": ["domain-04"]}, 400, "path must run from the origin domain"),
])
def test_a_malformed_or_over_hop_call_is_refused_and_stores_nothing(net, overrides, status, reason):
    payload = _payload(**overrides)
    if "path" in overrides and status == 422:
        payload["messages"][0]["path"][-1] = "domain-01"
    with net.at("domain-02"), pytest.raises(PeerRefused) as refused:
        forward_accept(sender="domain-01", payload=payload)
    assert refused.value.status == status and reason in refused.value.reason
    with net.at("domain-02"):
        assert not Message.objects.filter(origin_message_id=9).exists()


def test_a_message_dead_at_its_home_is_reported_dead_at_the_origin_with_where_and_why(net):
    sent = net.send(ALICE, FAR)
    net.pump()
    at_03 = net.copy("domain-03", sent)
    with net.at("domain-03"):
        Delivery.objects.filter(message=at_03).update(state="sent", claim=7, attempts=2)
        deliveries_fail(claims=[(row(at_03.id, FAR).id, 7)], error="push failed: boom")
    net.pump()
    origin_row = row(sent, FAR)
    assert (origin_row.state, origin_row.last_error) == ("dead", "dead at domain-03: push failed: boom")


def test_the_queue_of_a_link_down_too_long_moves_to_another_path_recipient_by_recipient(net):
    net.link("domain-01", "domain-04")
    net.link("domain-04", "domain-03")
    net.down.add("domain-02")
    sent = [net.send(ALICE, FAR, f"m{i}") for i in range(3)]
    net.pump()
    assert {row(s, FAR).forward_to for s in sent} == {"domain-02"}  # the shortest path first
    LinkHealth.objects.filter(peer="domain-02").update(down_since=timezone.now() - timedelta(minutes=5))
    result = forward_sweep()
    assert result["rerouted"] == {"domain-04": 3}
    assert [(row(s, FAR).state, row(s, FAR).forward_to) for s in sent] == [("forwarding", "domain-04")] * 3
    net.dispatcher.clear()
    link_forward(peer="domain-04")
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent


def test_the_queue_peek_names_the_origin_and_path_of_a_message_stored_here_first(net):
    sent = net.send(ALICE, NEAR, "x", confirmation_requested=True, reference="r")
    net.pump()
    sent_payload = net.calls[0].payload["messages"][0]
    assert {k: sent_payload[k] for k in ("origin_domain", "origin_message_id", "path", "confirmation_requested")} == {
        "origin_domain": "domain-01", "origin_message_id": sent, "path": ["domain-01"], "confirmation_requested": True}
    assert queue_peek(peer="domain-02", limits=Limits(rows=10, bytes=1 << 20)) == []


def test_the_queue_of_a_disabled_link_moves_to_another_path_at_the_next_sweep(net):
    net.link("domain-01", "domain-04")
    net.link("domain-04", "domain-03")
    net.down.add("domain-02")
    sent = net.send(ALICE, NEAR)
    net.pump()
    net.down.clear()
    net.disable("domain-01", "domain-02")
    assert forward_sweep()["rerouted"] == {"domain-04": 1}
    LinkHealth.objects.update(retry_at=None)
    net.pump()
    assert net.copy("domain-02", sent).forward_path == "domain-01,domain-04,domain-03"


def test_the_origin_shows_where_a_message_is_in_the_admin_and_the_rest_api(net, operator):
    sent = net.send(ALICE, FAR)
    net.pump()
    waiting = DeliverySerializer(row(sent, FAR)).data
    assert (waiting["state"], waiting["forwarded_to"], waiting["where"]) == (
        "forwarded", "domain-02", "forwarded to domain-02, not yet delivered in domain-03")
    net.deliver(FAR, at="domain-03")
    net.pump()
    page = operator.get(f"/admin/messaging/message/{sent}/change/").content.decode()
    assert "forwarded to domain-02, delivered in domain-03" in page
    assert DeliverySerializer(row(sent, FAR)).data["where"] == "forwarded to domain-02, delivered in domain-03"


def test_a_message_that_dies_on_the_way_is_reported_dead_at_the_origin_with_the_hop_that_failed(net):
    net.down.add("domain-03")
    sent = net.send(ALICE, FAR)
    net.pump()
    for _ in range(3):
        LinkHealth.objects.update(retry_at=None)
        with net.at("domain-02"):
            LinkHealth.objects.update(retry_at=None)
            link_forward(peer="domain-03")
        net.pump()
    origin_row = row(sent, FAR)
    assert (origin_row.state, origin_row.last_error) == (
        "dead", "dead at domain-02: forwarding to domain-03 failed: connection refused")
