"""Messages for users homed in other domains travel hop by hop, are stored once in every domain on
the way, arrive in order, and their origin learns where they are."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from apps_registry.selectors import app_snapshot
from foundation.handoff import FAST_FORWARD_TASK, FORWARD_LINK_TASK, ROUTE_TASK
from foundation.outbound import Limits
from foundation.outgoing import Answer
from messaging.api.serializers import DeliverySerializer
from messaging.core.delivery.dead_letters import dead_letters_requeue
from messaging.core.delivery.fast import message_fast_send
from messaging.core.delivery.retry import deliveries_fail
from messaging.core.protocol import delivery_frame
from messaging.federation.inbound import forward_accept
from messaging.federation.links import link_succeeded
from messaging.federation.models import LinkHealth
from messaging.federation.senders.outbox import link_forward, payload_build, queue_peek
from messaging.federation.senders.queue import forward_sweep
from messaging.federation.wire.transport import PeerRefused, wire_use
from messaging.models import Delivery, Message
from messaging.routing.tasks import forward_link
from tests.network import OneByOneWire

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
    assert again == {"stored": 0, "duplicates": 1, "receipts": 0, "refused": []}
    assert more == {"stored": 1, "duplicates": 1, "receipts": 0, "refused": []}
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
            self.recipient, self.message_id, self.app_id, self.revive, self.seq = recipient, message_id, 1, False, None
            self.after = None
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
    # The link's retries come faster than the row's: only a retry at or after the row's own retry
    # time (the app's delivery backoff) counts one of its attempts.
    LinkHealth.objects.update(retry_at=None)
    assert link_forward(peer="domain-02")["failed"] == 1
    assert row(sent, NEAR).attempts == 1
    for _ in range(2):
        LinkHealth.objects.update(retry_at=None)
        Delivery.objects.filter(pk=waiting.pk).update(next_attempt_at=timezone.now() - timedelta(hours=1))  # due
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
    ({"origin_message_id": "9"}, 400, "origin_message_id must be a positive whole number"),
    ({"recipients": []}, 400, "recipients must be a non-empty list"),
    ({"kind": "fast"}, 400, "kind must be one of"),
    ({"path": ["domain-04"]}, 400, "path must run from the origin domain"),
])
def test_a_malformed_call_is_refused_and_stores_nothing(net, overrides, status, reason):
    payload = _payload(**overrides)
    with net.at("domain-02"), pytest.raises(PeerRefused) as refused:
        forward_accept(sender="domain-01", payload=payload)
    assert refused.value.status == status and reason in refused.value.reason
    with net.at("domain-02"):
        assert not Message.objects.filter(origin_message_id=9).exists()


def test_a_message_the_domain_cannot_take_is_refused_alone_and_the_rest_of_the_call_is_stored(net):
    over_hop = [f"domain-{i:02d}" for i in range(10, 20)] + ["domain-01"]
    payload = {"messages": [
        _payload(origin_message_id=9)["messages"][0],
        _payload(origin_message_id=10, app="NOPE")["messages"][0],
        _payload(origin_message_id=11, origin_domain="domain-10", path=over_hop)["messages"][0],
        _payload(origin_message_id=12)["messages"][0],
    ]}
    with net.at("domain-02"):
        answer = forward_accept(sender="domain-01", payload=payload)
        stored = sorted(Message.objects.values_list("origin_message_id", flat=True))
    assert answer == {"stored": 2, "duplicates": 0, "receipts": 0, "refused": [
        {"index": 1, "reason": "app 'NOPE' is not known in domain-02"},
        {"index": 2, "reason": "hop limit (10) exceeded: 11 hops"}]}
    assert stored == [9, 12]


class RefusingWire(OneByOneWire):
    """domain-02 as a neighbour that stores a call's messages but refuses the second one alone."""

    def __init__(self):
        self.payloads: list[dict] = []

    def post(self, call, *, deadline):
        payload = json.loads(call.body)
        self.payloads.append(payload)
        answer = {"stored": len(payload["messages"]) - 1, "duplicates": 0, "receipts": 0,
                  "refused": [{"index": 1, "reason": "app 'ANZ' is not known in domain-02"}]}
        return Answer(200, json.dumps(answer).encode(), complete=True)


def test_a_message_the_neighbour_refuses_alone_is_dead_with_its_reason_and_its_batch_goes_on(net):
    sent = [net.send(ALICE, [NEAR], f"m{i}") for i in range(3)]
    previous = wire_use(wire := RefusingWire())
    try:
        net.pump()
    finally:
        wire_use(previous)
    assert [[m["content"] for m in p["messages"]] for p in wire.payloads] == [["m0", "m1", "m2"]]
    assert [row(m, NEAR).state for m in sent] == ["forwarded", "dead", "forwarded"]
    assert row(sent[1], NEAR).last_error == "domain-02 refused it: app 'ANZ' is not known in domain-02"
    assert LinkHealth.objects.get(peer="domain-02").up  # the link itself is fine


def dies_at_home(net, sent: int) -> Message:
    """FAR's copy at domain-03 (its home) used its last attempt ("push failed: boom"); the receipt
    has travelled back. Returns that copy."""
    at_03 = net.copy("domain-03", sent)
    with net.at("domain-03"):
        Delivery.objects.filter(message=at_03).update(state="sent", claim=7, attempts=2)
        deliveries_fail(claims=[(row(at_03.id, FAR).id, 7)], error="push failed: boom")
    net.pump()
    return at_03


def test_a_message_dead_at_its_home_is_reported_dead_at_the_origin_with_where_and_why(net):
    sent = net.send(ALICE, FAR)
    net.pump()
    dies_at_home(net, sent)
    origin_row = row(sent, FAR)
    assert (origin_row.state, origin_row.last_error) == ("dead", "dead at domain-03: push failed: boom")


def test_a_dead_letter_that_died_downstream_re_queued_at_the_origin_is_tried_again_there_and_arrives(net):
    sent = net.send(ALICE, FAR, "second chance")
    net.pump()
    at_03 = dies_at_home(net, sent)
    assert row(sent, FAR).state == "dead"  # at the origin, where the operator looks
    assert dead_letters_requeue(delivery_ids=[row(sent, FAR).id]) == 1
    net.pump()
    home = net.row("domain-03", at_03.id, FAR)
    assert (home.state, home.attempts) == ("pending", 0)  # back in FAR's mailbox, with fresh attempts
    assert net.row("domain-02", net.copy("domain-02", sent).id, FAR).state == "forwarded"
    assert row(sent, FAR).state == "forwarded"
    net.deliver(FAR, at="domain-03")
    net.pump()
    assert row(sent, FAR).state == "delivered"
    assert net.mailbox("domain-03", FAR) == [sent]  # once


def test_a_downstream_dead_letter_re_queued_while_its_first_way_is_closed_goes_another_way_and_is_revived(net):
    net.link("domain-01", "domain-04")
    net.link("domain-04", "domain-03")
    sent = net.send(ALICE, FAR, "second chance, another way")
    net.pump()
    at_03 = dies_at_home(net, sent)  # it went 01 - 02 - 03
    net.disable("domain-01", "domain-02")
    assert dead_letters_requeue(delivery_ids=[row(sent, FAR).id]) == 1
    net.pump()
    # domain-04 never had it: its new copy carries the re-queue on, and domain-03 revives the copy that died.
    assert net.copy("domain-04", sent).forward_path == "domain-01"
    home = net.row("domain-03", at_03.id, FAR)
    assert (home.state, home.attempts) == ("pending", 0)
    net.deliver(FAR, at="domain-03")
    net.pump()
    assert net.mailbox("domain-03", FAR) == [sent]  # once


def waiting_on_a_down_link(net) -> list[int]:
    """A detour 01 - 04 - 03 besides the line; domain-02 down; three messages for FAR waiting on the
    link to domain-02 (the shortest path), which has been down long enough to be routed around."""
    net.link("domain-01", "domain-04")
    net.link("domain-04", "domain-03")
    net.down.add("domain-02")
    sent = [net.send(ALICE, FAR, f"m{i}") for i in range(3)]
    net.pump()
    assert {row(s, FAR).forward_to for s in sent} == {"domain-02"}  # the shortest path first
    LinkHealth.objects.filter(peer="domain-02").update(down_since=timezone.now() - timedelta(minutes=5))
    return sent


def test_the_queue_of_a_link_down_too_long_moves_to_another_path_recipient_by_recipient(net):
    sent = waiting_on_a_down_link(net)
    result = forward_sweep()
    assert result["rerouted"] == {"domain-04": 3}
    assert [(row(s, FAR).state, row(s, FAR).forward_to) for s in sent] == [("forwarding", "domain-04")] * 3
    net.dispatcher.clear()
    link_forward(peer="domain-04")
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent


def test_a_message_sent_while_its_recipients_queue_waits_on_a_link_routed_around_keeps_its_place(net):
    sent = waiting_on_a_down_link(net)
    # Routed around now (the next hop is domain-04), but before the sweep moved the older ones:
    sent.append(net.send(ALICE, FAR, "m3"))
    net.pump()
    assert {row(s, FAR).forward_to for s in sent} == {"domain-02"}  # behind the others, not ahead of them
    assert forward_sweep()["rerouted"] == {"domain-04": 4}
    net.dispatcher.clear()
    link_forward(peer="domain-04")
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent  # in the order sent


def test_a_message_sent_just_after_a_detour_ends_follows_its_recipients_messages_still_on_the_detour(net):
    sent = waiting_on_a_down_link(net)
    forward_sweep()
    link_forward(peer="domain-04")  # on the detour, not yet passed on by domain-04
    assert [row(s, FAR).state for s in sent] == ["forwarded"] * 3
    net.down.clear()
    link_succeeded(peer="domain-02")  # domain-02 answers again
    sent.append(net.send(ALICE, FAR, "m3"))  # the shorter way is open again
    net.dispatcher.pump(only=lambda handed: handed.context != "domain-04")
    assert row(sent[-1], FAR).forward_to == "domain-04"  # behind the others, not ahead of them by domain-02
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent  # in the order sent
    net.deliver(FAR, at="domain-03")
    net.pump()
    later = net.send(ALICE, FAR, "m4")  # nothing in flight on the detour any more: the short way again
    net.pump()
    assert row(later, FAR).forward_to == "domain-02"
    assert net.mailbox("domain-03", FAR) == [*sent, later]


def test_a_message_for_a_recipient_whose_earlier_ones_wait_further_on_waits_behind_them_not_another_way(net):
    net.link("domain-01", "domain-04")
    net.link("domain-04", "domain-03")  # another way, open all along
    net.cut.add(frozenset(("domain-02", "domain-03")))  # calls 02 -> 03 fail from now on
    sent = [net.send(ALICE, FAR, f"m{i}") for i in range(3)]
    net.pump()
    assert net.mailbox("domain-02", FAR) == sent  # taken by domain-02, waiting on its link to 03
    net.cut_link("domain-02", "domain-03")  # and down there for long: domain-02 has no way on now
    sent.append(net.send(ALICE, FAR, "m3"))
    net.pump()
    assert net.mailbox("domain-02", FAR) == sent  # behind the others, not refused and sent round by 04
    assert net.mailbox("domain-03", FAR) == [] and net.mailbox("domain-04", FAR) == []
    net.cut.clear()
    with net.at("domain-02"):
        link_succeeded(peer="domain-03")
        link_forward(peer="domain-03")
    net.pump()
    assert net.mailbox("domain-03", FAR) == sent  # in the order sent


def test_the_queue_peek_names_the_origin_and_path_of_a_message_stored_here_first(net):
    sent = net.send(ALICE, NEAR, "x", confirmation_requested=True, reference="r")
    net.pump()
    sent_payload = net.calls[0].payload["messages"][0]
    assert {k: sent_payload[k] for k in ("origin_domain", "origin_message_id", "path", "confirmation_requested")} == {
        "origin_domain": "domain-01", "origin_message_id": sent, "path": ["domain-01"], "confirmation_requested": True}
    assert queue_peek(peer="domain-02", limits=Limits(rows=10, bytes=1 << 20)) == ([], True)


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
            Delivery.objects.filter(state="forwarding").update(next_attempt_at=None)  # their retry time came
            link_forward(peer="domain-03")
        net.pump()
    origin_row = row(sent, FAR)
    assert (origin_row.state, origin_row.last_error) == (
        "dead", "dead at domain-02: forwarding to domain-03 failed: connection refused")


class Listener:
    """A live connection of a user, as the presence cache records it, whose socket is a Redis
    subscription this test reads (the channel layer publishes to the connection's channel)."""

    def __init__(self, user_id: str):
        import redis

        from foundation.transport.sockets import run_async
        from presence import cache

        self.channel = f"test.fast.{user_id}"
        self.pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
        self.pubsub.subscribe(self.channel)
        self.pubsub.get_message(timeout=1)  # the subscription's confirmation
        run_async(cache.connection_add(user_id=user_id, channel_name=self.channel, node_id="test-node", acks=False,
                                       limit=10))
        self.user_id, self._cache = user_id, cache

    def frames(self) -> list[dict]:
        from channels.layers import get_channel_layer

        layer, got = get_channel_layer(), []
        while (message := self.pubsub.get_message(timeout=0.5)) is not None:
            if message["type"] == "message":
                got.append(json.loads(layer.deserialize(message["data"])["frame"]))
        return got

    def close(self) -> None:
        from foundation.transport.sockets import run_async

        run_async(self._cache.connection_remove(user_id=self.user_id, channel_name=self.channel, node_id="test-node"))
        self.pubsub.close()


def test_a_fast_message_reaches_a_user_connected_at_its_home_two_domains_away_and_is_never_stored(net):
    far = Listener(FAR)
    try:
        with net.at("domain-01"):
            reached = message_fast_send(app=app_snapshot("ANZ"), sender=ALICE, recipients=[FAR], content="quick",
                                        reference="r-1")
        assert reached == 0  # nobody connected here; it went on
        net.pump()
        [frame] = far.frames()
    finally:
        far.close()
    assert (frame["type"], frame["data"]["from"], frame["data"]["content"]) == ("MESSAGE", ALICE, "quick")
    fast_calls = [(c.sender, c.peer, c.payload["fast"][0]["path"]) for c in net.calls if "fast" in c.payload]
    assert fast_calls == [("domain-01", "domain-02", ["domain-01"]), ("domain-02", "domain-03", ["domain-01", "domain-02"])]
    for domain in ("domain-01", "domain-02", "domain-03"):
        with net.at(domain):
            assert not Message.objects.filter(content="quick").exists()  # FAST: stored nowhere


def test_a_fast_message_for_an_unreachable_home_is_dropped_without_retry(net):
    net.down.add("domain-02")
    with net.at("domain-01"):
        message_fast_send(app=app_snapshot("ANZ"), sender=ALICE, recipients=[FAR], content="quick")
    handed = net.pump()
    assert [h.task for h in handed] == [FAST_FORWARD_TASK]  # one try, nothing queued after it
    assert net.waiting() == []


def test_a_long_queue_is_sent_in_runs_of_a_bounded_time_each_handing_the_rest_to_the_next(net, settings):
    settings.FORWARD_TASK_BUDGET_SECONDS = 0  # one call per run
    settings.FORWARD_BATCH_SIZE = 1
    sent = [net.send(ALICE, NEAR, f"m{i}") for i in range(3)]
    net.pump(only=ROUTE_TASK)
    net.dispatcher.clear()
    forward_link("domain-02")  # the task a worker runs: one call, then the rest handed on
    assert [t.args for t in net.waiting(FORWARD_LINK_TASK)] == [["domain-02"]]
    assert [row(s, NEAR).state for s in sent] == ["forwarded", "forwarding", "forwarding"]
    net.pump()
    assert [row(s, NEAR).state for s in sent] == ["forwarded"] * 3


def test_a_message_whose_routing_was_lost_with_a_worker_is_not_overtaken_by_a_later_one(net):
    first = net.send(ALICE, NEAR, "stored just before the worker died")
    net.pump(only="no such task")  # committed: its routing task is handed over ...
    net.dispatcher.clear()  # ... and lost with the worker; the sweep would route it only later
    second = net.send(ALICE, NEAR, "sent once the domain was back")
    net.pump()
    assert net.mailbox("domain-02", NEAR) == [first, second]
    assert net.row("domain-01", first, NEAR).state == "forwarded"
