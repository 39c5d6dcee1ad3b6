"""Socket.IO clients at /socket.io/ on a real web node, with the real python-socketio client and raw
Engine.IO requests: the protocol as its documents write it, and Switchboard's guarantees behind it."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import socketio

from messaging.models import Delivery, DeliveryState
from tests.sioclients import SioUser
from tests.wsclient import APP_ID, WsClient, wait_for

pytestmark = pytest.mark.system


def _engine(node, **params: str) -> httpx.Response:
    return httpx.get(f"{node.url}/socket.io/", params=params, timeout=10)


@pytest.mark.django_db
def test_the_polling_handshake_gives_the_session_its_id_upgrades_and_heartbeat(node):
    answer = _engine(node, EIO="4", transport="polling")
    assert answer.status_code == 200
    assert answer.text[0] == "0"  # the OPEN packet
    opened = json.loads(answer.text[1:])
    assert set(opened) == {"sid", "upgrades", "pingInterval", "pingTimeout", "maxPayload"}
    assert opened["upgrades"] == ["websocket"]
    assert opened["pingInterval"] == 25000 and opened["pingTimeout"] == 20000 and opened["maxPayload"] == 1_000_000


@pytest.mark.django_db
@pytest.mark.parametrize(("params", "method", "code"), [
    ({"EIO": "3", "transport": "polling"}, "GET", 5),  # an older protocol
    ({"EIO": "4", "transport": "carrier-pigeon"}, "GET", 0),
    ({"EIO": "4", "transport": "polling", "sid": "no-such-session"}, "GET", 1),
    ({"EIO": "4", "transport": "polling"}, "POST", 2),  # a handshake is a GET
])
def test_a_bad_engine_io_request_gets_400_with_the_protocols_error_code(node, params, method, code):
    answer = httpx.request(method, f"{node.url}/socket.io/", params=params, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["code"] == code


@pytest.mark.django_db
@pytest.mark.parametrize("transports", [None, ["polling"], ["websocket"]], ids=["default", "polling", "websocket"])
def test_a_socketio_user_sends_with_an_acknowledgement_and_a_ws_user_receives_it(node, transports):
    url = node.url
    with WsClient(node.ws_url) as bob, SioUser(url, "ANZ-41001", transports=transports) as alice:
        bob.auth("ANZ-41002")
        answer = alice.call("message", {"to": "ANZ-41002", "content": "hello from socket.io", "reference": "r-1"})
        assert set(answer) == {"id"} and answer["id"].isdigit()
        frame = bob.recv_type("MESSAGE")
        assert frame["data"]["content"] == "hello from socket.io" and frame["data"]["from"] == "ANZ-41001"
        assert frame["data"]["id"] == answer["id"]
        if transports is None:  # the default client moved from polling to the WebSocket
            assert alice.client.transport() == "websocket"


@pytest.mark.django_db
def test_a_ws_user_sends_and_a_socketio_user_receives_a_message_event(node):
    with SioUser(node.url, "ANZ-41011", transports=["polling"]) as bob, WsClient(node.ws_url) as alice:
        alice.auth("ANZ-41012")
        alice.message("ANZ-41011", "to a polling client", reference="ref-9")
        message = bob.next("message")
        assert message["content"] == "to a polling client" and message["from"] == "ANZ-41012"
        assert message["feature"] == "RELIABLE" and message["reference"] == "ref-9" and isinstance(message["seq"], int)
        wait_for(lambda: Delivery.objects.filter(recipient="ANZ-41011", state=DeliveryState.DELIVERED).count() == 1)


@pytest.mark.django_db
def test_a_refused_login_is_a_connect_error_with_the_reason_and_code(node):
    user = SioUser(node.url, "ANZ-41021", app_id="no-such-app")
    with pytest.raises(socketio.exceptions.ConnectionError):
        user.__enter__()
    error = user.next("connect_error")
    assert "no-such-app" in error["message"] or "unknown" in error["message"].lower()
    assert error["data"]["code"] == 1008
    user.client.disconnect()


@pytest.mark.django_db
def test_a_send_refused_by_the_platform_answers_the_callback_with_the_error(node):
    with SioUser(node.url, "ANZ-41031") as alice:
        answer = alice.call("message", {"to": "BNZ-5", "content": "to another app"})
        assert answer["error"] == "INVALID_MESSAGE" and "another app" in answer["detail"]
        answer = alice.call("no_such_event", {})
        assert answer["error"] == "INVALID_MESSAGE" and "unknown event" in answer["detail"]
        # and the connection keeps working
        assert alice.call("message", {"to": "ANZ-41032", "content": "fine"})["id"].isdigit()


@pytest.mark.django_db
def test_fetch_missing_answers_the_stored_messages_and_what_is_left(node):
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-41041")
        for i in range(5):
            alice.message("ANZ-41042", f"stored-{i}")
        wait_for(lambda: Delivery.objects.filter(recipient="ANZ-41042").count() == 5)
        wait_for(lambda: not Delivery.objects.filter(recipient="ANZ-41042", state=DeliveryState.PENDING,
                                                     next_attempt_at__isnull=False).exists())
    with SioUser(node.url, "ANZ-41042", transports=["websocket"]) as bob:
        seen: list[str] = []
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:
            answer = bob.call("fetch_missing", {"count": 2})
            seen += [m["content"] for m in answer["messages"]]
            while not bob.events.empty():  # pushed on connecting, rather than fetched
                name, data = bob.events.get()
                if name == "message":
                    seen.append(data["content"])
        assert sorted(seen) == [f"stored-{i}" for i in range(5)]
        assert bob.call("fetch_missing", {"count": 2}) == {"messages": [], "leftMissingCount": 0}


@pytest.mark.django_db
def test_in_ack_mode_a_message_not_acknowledged_comes_again_with_the_same_id_after_a_reconnect(node):
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-41051")
        with SioUser(node.url, "ANZ-41052", acks=True, ack_messages=False) as bob:
            alice.message("ANZ-41052", "keep me")
            first = bob.next("message")
        with SioUser(node.url, "ANZ-41052", acks=True) as bob:  # acknowledges this time
            again = bob.next("message")
            assert again["id"] == first["id"] and again["content"] == "keep me"
            wait_for(lambda: Delivery.objects.filter(recipient="ANZ-41052", state=DeliveryState.DELIVERED).count() == 1)
        with SioUser(node.url, "ANZ-41052", acks=True) as bob:
            assert bob.call("fetch_missing", {"count": 10}) == {"messages": [], "leftMissingCount": 0}


@pytest.mark.django_db
def test_the_master_user_hears_a_socketio_user_connect_and_leave(node):
    with SioUser(node.url, "ANZ-123223") as master:
        online = master.next("online_users")
        assert "count" in online
        with SioUser(node.url, "ANZ-41061", transports=["polling"]):
            assert master.next("user_connected") == {"userId": "ANZ-41061"}
        assert master.next("user_disconnected") == {"userId": "ANZ-41061"}


@pytest.mark.django_db
def test_a_connect_to_another_namespace_is_refused_as_invalid(node):
    client = socketio.Client(reconnection=False)
    with pytest.raises(socketio.exceptions.ConnectionError):
        client.connect(node.url, namespaces=["/admin"], auth={"appId": APP_ID, "userId": "ANZ-41071"},
                       wait_timeout=5)
    client.disconnect()


@pytest.mark.django_db
def test_many_sends_from_threads_are_each_answered_once(node):
    with SioUser(node.url, "ANZ-41081") as alice, SioUser(node.url, "ANZ-41082") as bob:
        answers: list[dict] = []
        lock = threading.Lock()

        def send(i: int) -> None:
            answer = alice.call("message", {"to": "ANZ-41082", "content": f"n-{i}"})
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({a["id"] for a in answers}) == 30
        got = {bob.next("message")["content"] for _ in range(30)}
        assert got == {f"n-{i}" for i in range(30)}
