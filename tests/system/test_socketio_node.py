"""The real socket.io-client (Node, from npm: tests/node) against a real web node: the default client
(polling, then the upgrade), a polling-only one, sends with acknowledgements, a refused login, ACK
mode, recovery after a dropped transport, channels and the master's presence."""

from __future__ import annotations

import httpx
import pytest

from apps_registry.models import ClientApp, UserDistribution
from apps_registry.services import api_key_create
from messaging.models import Delivery, DeliveryState
from tests.sioclients import NodeClient
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def pub(demo_network, django_db_blocker):
    """App SIO (committed): `news.*` public, client subscriptions allowed; its API key for publishing."""
    with django_db_blocker.unblock():
        app = ClientApp.objects.create(app_name="SIO", app_id="app-id-sio", master_user_id="SIO-1",
                                       client_subscriptions_allowed=True, public_channel_patterns=["news.*"],
                                       auth_mode="none")
        UserDistribution.objects.create(app=app, domain=demo_network["anz"].distributions.first().domain,
                                        range_from=0, range_to=None)
        return {"app": app, "key": api_key_create(app=app, name="publisher")[1]}


@pytest.fixture(scope="module")
def web(module_processes, pub):
    node = module_processes.web("web")
    module_processes.worker("worker")
    return node


@pytest.mark.django_db
def test_the_default_client_connects_by_polling_upgrades_and_exchanges_messages_with_a_ws_user(web):
    with NodeClient() as alice, WsClient(web.ws_url) as bob:
        bob.auth("ANZ-42002")
        connected = alice.connect(web.url, "ANZ-42001")
        assert connected["event"] == "connect"  # (on polling, or already upgraded: the login takes a moment)
        alice.wait(lambda e: e.get("event") == "upgrade" and e["transport"] == "websocket")
        answer = alice.call("message", {"to": "ANZ-42002", "content": "from node", "reference": "n-1"})
        assert answer["id"].isdigit()
        assert bob.recv_type("MESSAGE")["data"]["content"] == "from node"
        bob.message("ANZ-42001", "to node")
        got = alice.wait_event("message")
        assert got["args"][0]["content"] == "to node" and got["args"][0]["from"] == "ANZ-42002"
        assert got["args"][0]["feature"] == "RELIABLE" and not got["acked"]  # no ACK request outside ACK mode


@pytest.mark.django_db
def test_a_polling_only_client_sends_and_receives(web):
    with NodeClient() as alice, NodeClient() as bob:
        assert alice.connect(web.url, "ANZ-42011", opts={"transports": ["polling"]})["transport"] == "polling"
        assert bob.connect(web.url, "ANZ-42012", opts={"transports": ["polling"]})["event"] == "connect"
        assert alice.call("group_message", {"to": ["ANZ-42012"], "content": "polled"})["id"].isdigit()
        assert bob.wait_event("message")["args"][0]["content"] == "polled"


@pytest.mark.django_db
def test_a_refused_login_is_a_connect_error_with_a_reason_and_the_close_code(web):
    with NodeClient() as client:
        refused = client.connect(web.url, "ANZ-42021", app_id="no-such-app")
        assert refused["event"] == "connect_error"
        assert refused["message"] and refused["data"]["code"] == 1008


@pytest.mark.django_db
def test_a_fast_message_is_answered_and_pushed_without_an_id(web):
    with NodeClient() as alice, NodeClient() as bob:
        alice.connect(web.url, "ANZ-42031")
        bob.connect(web.url, "ANZ-42032")
        assert alice.call("message", {"to": "ANZ-42032", "content": "quick", "feature": "FAST"}) == {
            "id": None, "feature": "FAST"}
        message = bob.wait_event("message")["args"][0]
        assert message["content"] == "quick" and message["feature"] == "FAST" and message["id"] is None


@pytest.mark.django_db
def test_in_ack_mode_the_callback_is_the_ack_and_an_unacknowledged_message_comes_again(web):
    with WsClient(web.ws_url) as sender:
        sender.auth("ANZ-42041")
        with NodeClient() as bob:
            bob.connect(web.url, "ANZ-42042", acks=True, ack_messages=False)
            sender.message("ANZ-42042", "ack me")
            first = bob.wait_event("message")
        with NodeClient() as bob:
            bob.connect(web.url, "ANZ-42042", acks=True)
            again = bob.wait_event("message")
            assert again["args"][0]["id"] == first["args"][0]["id"] and again["acked"]
            wait_for(lambda: Delivery.objects.filter(recipient="ANZ-42042", state=DeliveryState.DELIVERED).count() == 1)


@pytest.mark.django_db
def test_a_dropped_transport_reconnects_recovered_and_gets_what_was_sent_meanwhile_once(web):
    with NodeClient() as bob, WsClient(web.ws_url) as alice:
        alice.auth("ANZ-42051")
        first = bob.connect(web.url, "ANZ-42052", opts={"transports": ["websocket"]})
        assert first["recovered"] is False
        bob.command(op="dropTransport")
        bob.wait(lambda e: e.get("event") == "disconnect")
        for i in range(3):
            alice.message("ANZ-42052", f"meanwhile-{i}")
        again = bob.wait_event("connect")
        assert again["recovered"] is True and again["id"] != first["id"]
        got = [bob.wait_event("message")["args"][0]["content"] for _ in range(3)]
        assert sorted(got) == ["meanwhile-0", "meanwhile-1", "meanwhile-2"]
        with pytest.raises(TimeoutError):
            bob.wait_event("message", timeout=1.5)


@pytest.mark.django_db
def test_a_subscriber_gets_channel_messages_with_their_offsets(web, pub):
    with NodeClient() as reader:
        reader.connect(web.url, "SIO-42061", app_id="app-id-sio")
        assert reader.call("subscribe", {"channel": "news.sport"}) == {"channel": "news.sport", "offset": 0}
        response = httpx.post(f"{web.url}/messages", json={"channel": "news.sport", "message": "goal"},
                              headers={"Authorization": f"Bearer {pub['key']}"}, timeout=10)
        assert response.status_code == 202, response.text
        event = reader.wait_event("channel_message")["args"][0]
        assert event == {"channel": "news.sport", "offset": 1, "message": "goal"}
        assert reader.call("unsubscribe", {"channel": "news.sport"}) == {}


@pytest.mark.django_db
def test_the_master_user_is_told_of_a_socketio_user_connecting(web):
    with NodeClient() as master, NodeClient() as user:
        master.connect(web.url, "ANZ-123223")
        assert "users" in master.wait_event("online_users")["args"][0]
        user.connect(web.url, "ANZ-42071")
        assert master.wait_event("user_connected")["args"][0] == {"userId": "ANZ-42071"}
        user.command(op="disconnect")
        assert master.wait_event("user_disconnected")["args"][0] == {"userId": "ANZ-42071"}


@pytest.mark.django_db
@pytest.mark.parametrize("transports", [["polling"], ["websocket"]], ids=["polling", "websocket"])
def test_a_user_closed_by_the_master_is_told_disconnect_and_does_not_come_back(web, transports):
    with NodeClient() as master, NodeClient() as user:
        master.connect(web.url, "ANZ-123223")
        first = user.connect(web.url, "ANZ-42081", opts={"transports": transports})
        assert first["event"] == "connect"
        assert master.call("close_connection", {"userId": "ANZ-42081"}) == {}
        # socket.io-client's reason for a server's DISCONNECT packet; on a bare transport close it
        # would be "transport close" and the client would reconnect by itself
        assert user.wait_event("disconnect")["reason"] == "io server disconnect"
        with pytest.raises(TimeoutError):
            user.wait_event("connect", timeout=2)  # (its reconnection delay is 100-500 ms)


@pytest.mark.django_db
def test_a_user_disconnected_through_the_api_is_told_disconnect(web, pub):
    with NodeClient() as user:
        assert user.connect(web.url, "SIO-42091", app_id="app-id-sio")["event"] == "connect"
        answer = httpx.post(f"{web.url}/api/v1/users/SIO-42091/disconnect",
                            headers={"Authorization": f"Bearer {pub['key']}"}, timeout=10)
        assert answer.status_code < 300, answer.text
        assert user.wait_event("disconnect")["reason"] == "io server disconnect"
        with pytest.raises(TimeoutError):
            user.wait_event("connect", timeout=2)


@pytest.mark.django_db
@pytest.mark.parametrize("transports", [["polling"], ["websocket"]], ids=["polling", "websocket"])
def test_a_sender_that_asks_for_confirmation_gets_it_when_the_message_is_delivered(web, transports):
    with NodeClient() as alice, WsClient(web.ws_url) as bob:
        bob.auth("ANZ-42102")
        alice.connect(web.url, "ANZ-42101", opts={"transports": transports})
        answer = alice.call("message", {"to": "ANZ-42102", "content": "confirm me", "reference": "ref-1",
                                        "confirmationEnabled": True})
        assert bob.recv_type("MESSAGE")["data"]["content"] == "confirm me"
        confirmation = alice.wait_event("confirmation")["args"][0]
        assert confirmation["reference"] == "ref-1" and confirmation["id"]
        assert answer["id"].isdigit()
