"""One row a neighbour cannot take never holds a link's queue: it goes to the dead letters with the
neighbour's reason and the rest of the queue goes on; and a message stored from a standby copy is
forwarded like any other (messaging.federation.senders.outbox)."""

from __future__ import annotations

import pytest

from messaging.federation.standby.mailbox_merge import Copied, mailbox_merge
from messaging.models import Delivery, Message
from messaging.routing.router import deliveries_route

pytestmark = pytest.mark.django_db

ALICE, NEAR = "ANZ-17", "ANZ-1000005"  # homed in domain-01 and domain-02


def test_a_message_the_neighbour_finds_malformed_is_dead_with_its_reason_and_the_queue_goes_on(net):
    sent = [net.send(ALICE, NEAR, f"m{i}") for i in range(3)]
    Message.objects.filter(pk=sent[1]).update(kind="bogus")  # a row the neighbour's checks refuse
    net.pump()
    rows = [Delivery.objects.get(message_id=m, recipient=NEAR) for m in sent]
    assert [r.state for r in rows] == ["forwarded", "dead", "forwarded"]
    assert rows[1].last_error.startswith("forwarding to domain-02 failed: domain-02 answered 400: messages[1]: kind")
    assert [[m["content"] for m in c.payload["messages"]] for c in net.calls] == [["m0", "m1", "m2"], ["m0", "m2"]]
    with net.at("domain-02"):  # both stored (m2 waits for its place behind m1 until the gap is given up)
        assert sorted(Message.objects.values_list("content", flat=True)) == ["m0", "m2"]


def test_a_message_stored_from_a_standby_copy_is_forwarded_with_a_path_from_its_origin(net):
    copy = Copied(app_id=net.app.pk, recipient=NEAR, origin_domain="domain-03", origin_message_id=41,
                  state="pending", message={"sender": "ANZ-3000001", "content": "copied"})
    mailbox_merge([copy])  # (here the holder of NEAR's mailbox until just now, say)
    deliveries_route(list(Delivery.objects.filter(recipient=NEAR).values_list("id", flat=True)))
    net.pump()
    assert [m["path"] for c in net.calls for m in c.payload.get("messages", [])] == [["domain-03", "domain-01"]]
    assert net.mailbox("domain-02", NEAR) == [41]
