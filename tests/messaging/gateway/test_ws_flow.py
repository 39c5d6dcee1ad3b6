"""Reliable messaging end to end over /ws, in-process (tests/inprocess.py): the project's ASGI
application and consumers on an event loop of their own, served by the same consumer loop as under
daphne, a worker running the routing tasks, real Postgres and Redis. (What depends on daphne itself,
such as frames on the wire and a node's drain, is tested against real processes in tests/system/.)"""

from __future__ import annotations

import pytest

from messaging.models import Delivery, DeliveryState, Message
from tests.wsclient import wait_for

# Every test of the module reads the database (pytest-django runs them together, with the node's module).
pytestmark = pytest.mark.django_db


def test_online_recipient_gets_the_message_and_the_sender_its_confirmation(node):
    with node.client() as alice, node.client() as bob:
        reply = alice.auth("ANZ-1001")["data"]
        assert reply == {"appId": "app-id-343", "userId": "ANZ-1001", "isAuthenticated": True,
                         "sessionId": reply["sessionId"]}  # (an extension: a server-issued session id)
        bob.auth("ANZ-1002")
        alice.message("ANZ-1002", "hello bob", reference="ref-1")
        got = bob.recv_type("MESSAGE")
        assert got["data"]["from"] == "ANZ-1001" and got["data"]["content"] == "hello bob"
        assert got["reference"] == "ref-1"
        assert got["data"]["seq"] == 1 and got["data"]["id"].isdigit()
        confirmation = alice.recv_type("MESSAGE_CONFIRMATION")
        assert confirmation["data"]["reference"] == "ref-1"


def test_a_client_at_the_domains_bare_url_is_served_as_at_ws(node):
    # The linker seed lists domains as ws://host:port, without a path: that URL works as is.
    with node.client(path="/") as alice, node.client() as bob:
        assert alice.auth("ANZ-1003")["data"]["isAuthenticated"] is True
        bob.auth("ANZ-1004")
        alice.message("ANZ-1004", "from the bare url")
        assert bob.recv_type("MESSAGE")["data"]["content"] == "from the bare url"


def test_no_confirmation_without_a_reference_or_when_the_sender_declines_it(node):
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-1011")
        bob.auth("ANZ-1012")
        alice.message("ANZ-1012", "no reference")
        alice.message("ANZ-1012", "declined", reference="r", confirmationEnabled=False)
        assert sorted(f["data"]["content"] for f in (bob.recv_type("MESSAGE"), bob.recv_type("MESSAGE"))) == [
            "declined", "no reference"]
        assert [f for f in alice.recv_all(quiet=1.5) if f["type"] == "MESSAGE_CONFIRMATION"] == []


def _parked(**lookups) -> int:
    return Delivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__isnull=True, **lookups).count()


def test_offline_recipient_fetches_in_batches_with_the_right_left_missing_count(node):
    with node.client() as alice:
        alice.auth("ANZ-2001")
        for i in range(25):
            alice.message("ANZ-2002", f"missed {i}", reference=f"m{i}")
    # RELIABLE sends carry no per-frame receipt in the linker protocol: wait until all are stored
    # and routed (parked for an offline recipient), so none is still on its way to be pushed live.
    wait_for(lambda: _parked(recipient="ANZ-2002") == 25)
    with node.client() as bob:
        bob.auth("ANZ-2002")
        first, left = bob.fetch(10)
        assert [m["data"]["content"] for m in first] == [f"missed {i}" for i in range(10)]
        assert left == 15
        second, left = bob.fetch(10)
        assert [m["data"]["seq"] for m in second] == list(range(11, 21))
        assert left == 5
        third, left = bob.fetch(10)
        assert len(third) == 5 and left == 0
        assert bob.fetch(10) == ([], 0)
    wait_for(lambda: _parked(recipient="ANZ-2001", message__kind="confirmation") == 25)
    with node.client() as alice:
        alice.auth("ANZ-2001")
        confirmations, _ = alice.fetch(100)  # the sender was offline: its confirmations waited
        assert sorted(c["data"]["reference"] for c in confirmations) == sorted(f"m{i}" for i in range(25))


def test_fast_messages_are_delivered_but_never_stored(node):
    before = Message.objects.count()
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-3001")
        bob.auth("ANZ-3002")
        alice.message("ANZ-3002", "quick", feature="FAST")
        got = bob.recv_type("MESSAGE")
        assert got["data"] == {"from": "ANZ-3001", "content": "quick"}
        alice.message("ANZ-3999", "to nobody online", feature="FAST")
    assert Message.objects.count() == before
    with node.client() as nobody:
        nobody.auth("ANZ-3999")
        assert nobody.fetch(10) == ([], 0)  # FAST to an offline user is gone, by design


def test_group_message_reaches_every_recipient_once(node):
    with node.client() as a, node.client() as b, node.client() as c:
        a.auth("ANZ-4001")
        b.auth("ANZ-4002")
        c.auth("ANZ-4003")
        a.send("GROUP_MESSAGE", {"to": ["ANZ-4002", "ANZ-4003", "ANZ-4002", "ANZ-4004"], "content": "all"},
               reference="g1")
        assert b.recv_type("MESSAGE")["data"]["content"] == "all"
        assert c.recv_type("MESSAGE")["data"]["content"] == "all"
        assert [f for f in b.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
        assert [f for f in a.recv_all(quiet=0.5) if f["type"] == "MESSAGE_CONFIRMATION"] == []
    assert Delivery.objects.filter(message__sender="ANZ-4001").count() == 3  # 4004 waits offline


def test_duplicate_client_message_id_is_stored_and_delivered_once(node):
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-5001")
        bob.auth("ANZ-5002")
        for _ in range(3):
            alice.message("ANZ-5002", "pay 10 EUR", clientMessageId="payment-77")
        alice.message("ANZ-5002", "after")
        got = sorted([bob.recv_type("MESSAGE")["data"]["content"], bob.recv_type("MESSAGE")["data"]["content"]])
        assert got == ["after", "pay 10 EUR"]
        assert [f for f in bob.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    assert Message.objects.filter(sender="ANZ-5001", client_message_id="payment-77").count() == 1


def test_a_resent_group_message_is_stored_once_and_reaches_each_recipient_once(node):
    with node.client() as alice, node.client() as bob, node.client() as carol:
        alice.auth("ANZ-5101", acks=True)
        bob.auth("ANZ-5102")
        carol.auth("ANZ-5103")
        group = {"to": ["ANZ-5102", "ANZ-5103"], "content": "dinner at 8", "clientMessageId": "invite-1"}
        alice.send("GROUP_MESSAGE", group, reference="g-1")
        first = alice.recv_type("MESSAGE_ACCEPTED")
        alice.send("GROUP_MESSAGE", group, reference="g-1")
        again = alice.recv_type("MESSAGE_ACCEPTED")
        assert first["data"] == {"id": first["data"]["id"], "clientMessageId": "invite-1", "recipients": 2}
        assert again == {**first, "data": {**first["data"], "duplicate": True}}  # the same answer, marked
        for recipient in (bob, carol):
            assert recipient.recv_type("MESSAGE")["data"]["id"] == first["data"]["id"]
            assert [f for f in recipient.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    assert Message.objects.filter(sender="ANZ-5101", client_message_id="invite-1").count() == 1
    assert Delivery.objects.filter(message__sender="ANZ-5101").count() == 2


def test_a_group_message_resent_on_a_new_connection_after_the_socket_died_is_not_delivered_again(node):
    group = {"to": ["ANZ-5112", "ANZ-5113"], "content": "meeting moved", "clientMessageId": "move-1"}
    with node.client() as bob, node.client() as carol:
        bob.auth("ANZ-5112")
        carol.auth("ANZ-5113")
        with node.client() as alice:
            alice.auth("ANZ-5111", acks=True)
            alice.send("GROUP_MESSAGE", group)
            # The socket dies before the sender reads its MESSAGE_ACCEPTED: it cannot know whether it was stored.
        stored = bob.recv_type("MESSAGE")["data"]["id"]
        with node.client() as alice_again:
            alice_again.auth("ANZ-5111", acks=True)
            alice_again.send("GROUP_MESSAGE", group)
            answer = alice_again.recv_type("MESSAGE_ACCEPTED")["data"]
            assert (answer["id"], answer.get("duplicate")) == (stored, True)
        assert carol.recv_type("MESSAGE")["data"]["id"] == stored
        for recipient in (bob, carol):
            assert [f for f in recipient.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    assert Delivery.objects.filter(message__sender="ANZ-5111").count() == 2


def test_one_client_message_id_names_one_message_whether_sent_alone_or_to_a_group(node):
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-5121", acks=True)
        bob.auth("ANZ-5122")
        alice.message("ANZ-5122", "just you", clientMessageId="same-id")
        first = alice.recv_type("MESSAGE_ACCEPTED")["data"]
        alice.send("GROUP_MESSAGE", {"to": ["ANZ-5122", "ANZ-5123"], "content": "everyone", "clientMessageId": "same-id"})
        again = alice.recv_type("MESSAGE_ACCEPTED")["data"]
        assert (again["id"], again.get("duplicate")) == (first["id"], True)
        assert bob.recv_type("MESSAGE")["data"]["content"] == "just you"
        assert [f for f in bob.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    assert Delivery.objects.filter(message__sender="ANZ-5121").count() == 1


def test_a_group_message_with_a_malformed_client_message_id_is_refused(node):
    with node.client() as alice:
        alice.auth("ANZ-5131")
        alice.send("GROUP_MESSAGE", {"to": ["ANZ-5132"], "content": "x", "clientMessageId": ""})
        assert "clientMessageId" in alice.recv_type("INVALID_MESSAGE")["data"]["reason"]
    assert not Message.objects.filter(sender="ANZ-5131").exists()


def test_a_client_message_id_of_the_queue_intakes_namespace_is_refused(node):
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-5141")
        bob.auth("ANZ-5142")
        # A queued send of the app's backend will be stored as `sbq:<its entry id>`: taken first, it would be
        # answered "duplicate" and never sent.
        alice.message("ANZ-5142", "claimed first", clientMessageId="sbq:1764370000000-0")
        refused = alice.recv_type("INVALID_MESSAGE")["data"]
        assert refused["reason"] == ("clientMessageId must not start with 'sbq:': reserved for the app's sends "
                                     "from its queue")
        alice.message("ANZ-5142", "mine", clientMessageId="my-sbq:1")  # the prefix only
        assert bob.recv_type("MESSAGE")["data"]["content"] == "mine"
    assert not Message.objects.filter(content="claimed first").exists()


def test_ack_mode_redelivers_unacked_messages_after_reconnect_with_the_same_id(node):
    with node.client() as alice:
        alice.auth("ANZ-6001")
        with node.client() as bob:
            bob.auth("ANZ-6002", acks=True)
            alice.message("ANZ-6002", "first")
            alice.message("ANZ-6002", "second")
            # Live pushes of two quick messages may arrive in either order (two workers route
            # them); the mailbox seq gives the order.
            got = {f["data"]["content"]: f for f in (bob.recv_type("MESSAGE"), bob.recv_type("MESSAGE"))}
            first, second = got["first"], got["second"]
            assert (first["data"]["seq"], second["data"]["seq"]) == (1, 2)
            bob.send("ACK", {"ids": [first["data"]["id"]]})
            bob.send("PING")
            bob.recv_type("PONG")
        with node.client() as bob_again:
            bob_again.auth("ANZ-6002", acks=True)
            again = bob_again.recv_type("MESSAGE")
            assert again["data"]["id"] == second["data"]["id"] and again["data"]["content"] == "second"
            bob_again.send("ACK", {"ids": [again["data"]["id"]]})
            assert [f for f in bob_again.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    states = dict(Delivery.objects.filter(recipient="ANZ-6002").values_list("message__content", "state"))
    assert states == {"first": "delivered", "second": "delivered"}


def test_a_user_with_two_connections_gets_the_message_on_both(node):
    with node.client() as alice, node.client() as phone, node.client() as laptop:
        alice.auth("ANZ-7001")
        phone.auth("ANZ-7002")
        laptop.auth("ANZ-7002")
        alice.message("ANZ-7002", "both")
        assert phone.recv_type("MESSAGE")["data"]["content"] == "both"
        assert laptop.recv_type("MESSAGE")["data"]["content"] == "both"


def test_master_user_sees_first_and_last_connections_and_can_close_a_user(node):
    with node.client() as master:
        master.auth("ANZ-123223")
        first = node.client()
        first.auth("ANZ-8001")
        assert master.recv_type("USER_CONNECTED")["data"] == {"userId": "ANZ-8001"}
        second = node.client()
        second.auth("ANZ-8001")  # not the first connection: no second announcement
        first.close()
        master.send("PING")
        assert [f["type"] for f in master.recv_all(quiet=1)] == ["PONG"]
        master.send("CLOSE_CONNECTION", {"userId": "ANZ-8001"})
        assert second.wait_closed() == 1000
        assert master.recv_type("USER_DISCONNECTED")["data"] == {"userId": "ANZ-8001"}


def test_only_the_master_may_close_connections_and_only_in_its_own_app(node):
    with node.client() as user, node.client() as master:
        user.auth("ANZ-8101")
        user.send("CLOSE_CONNECTION", {"userId": "ANZ-8102"})
        assert "master" in user.recv_type("INVALID_MESSAGE")["data"]["reason"]
        master.auth("ANZ-123223")
        master.send("CLOSE_CONNECTION", {"userId": "BNZ-5"})
        assert "not a user of this app" in master.recv_type("INVALID_MESSAGE")["data"]["reason"]


def test_the_node_exposes_prometheus_metrics_for_its_traffic(node, client):
    with node.client() as alice, node.client() as bob:
        alice.auth("ANZ-9001")
        bob.auth("ANZ-9002")
        alice.message("ANZ-9002", "counted")
        bob.recv_type("MESSAGE")
        alice.send_raw("{oops")
        alice.recv_type("INVALID_MESSAGE")
        text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples["switchboard_ws_connections"] >= 2
    assert samples['switchboard_ws_frames_received_total{type="MESSAGE"}'] >= 1
    assert samples['switchboard_ws_frames_refused_total{answer="INVALID_MESSAGE"}'] >= 1
    assert samples["switchboard_deliveries_written_total"] >= 1
    assert samples["switchboard_delivery_latency_seconds_count"] >= 1
    assert "switchboard_dead_letters" in samples
