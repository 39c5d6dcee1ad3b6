"""Socket.IO clients at /socket.io/ on a real web node, with the real python-socketio client and raw
Engine.IO requests: the protocol as its documents write it, and Switchboard's guarantees behind it."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import socketio
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from messaging.models import Delivery, DeliveryState
from presence.models import Session
from tests.sioclients import SioUser
from tests.wsclient import APP_ID, WsClient, wait_for

pytestmark = pytest.mark.system


HEARTBEAT = {"SOCKETIO_PING_INTERVAL": "1.5", "SOCKETIO_PING_TIMEOUT": "1", "SOCKETIO_MAX_PAYLOAD": "100000"}


@pytest.fixture(scope="module")
def node(module_processes):
    """One web node and one worker, with a short Engine.IO heartbeat and a smaller payload limit."""
    web = module_processes.web("web", **HEARTBEAT)
    module_processes.worker("worker")
    return web


class Polling:
    """An Engine.IO session on HTTP long-polling, by hand."""

    def __init__(self, node):
        self.url = f"{node.url}/socket.io/"
        opened = httpx.get(self.url, params={"EIO": "4", "transport": "polling"}, timeout=10)
        assert opened.status_code == 200 and opened.text[0] == "0", opened.text
        self.open = json.loads(opened.text[1:])
        self.sid = self.open["sid"]
        assert opened.headers["x-socketio-sid"] == self.sid  # what a load balancer keeps the session by

    def params(self) -> dict:
        return {"EIO": "4", "transport": "polling", "sid": self.sid}

    def get(self, timeout: float = 10) -> httpx.Response:
        return httpx.get(self.url, params=self.params(), timeout=timeout)

    def post(self, *packets: str) -> httpx.Response:
        return httpx.post(self.url, params=self.params(), content="\x1e".join(packets).encode(), timeout=10)

    def packets(self) -> list[str]:
        answer = self.get()
        assert answer.status_code == 200, answer.text
        return answer.text.split("\x1e")


@pytest.mark.django_db
def test_the_polling_handshake_gives_the_session_its_id_upgrades_and_the_configured_heartbeat(node):
    session = Polling(node)
    assert set(session.open) == {"sid", "upgrades", "pingInterval", "pingTimeout", "maxPayload"}
    assert session.open["upgrades"] == ["websocket"]
    assert (session.open["pingInterval"], session.open["pingTimeout"], session.open["maxPayload"]) == (1500, 1000,
                                                                                                       100_000)


@pytest.mark.django_db
def test_the_server_pings_a_pong_keeps_the_session_and_silence_ends_it(node):
    session = Polling(node)
    assert session.packets() == ["2"]  # the server's PING, after the interval
    assert session.post("3").text == "ok"
    assert session.packets() == ["2"]  # still open: pinged again
    time.sleep(1.5)  # no PONG within the timeout
    late = session.get()
    assert late.status_code == 400 and late.json() == {"code": 1, "message": "Session ID unknown"}


@pytest.mark.django_db
def test_a_connect_over_polling_is_answered_with_the_sid_and_pid_and_another_namespace_is_refused(node):
    session = Polling(node)
    session.post('40/admin,{"appId":"app-id-343","userId":"ANZ-41091"}')
    assert session.packets() == ['44/admin,{"message":"Invalid namespace"}']
    session.post('40{"appId":"app-id-343","userId":"ANZ-41091","token":"t"}')
    packet = session.packets()[0]
    assert packet.startswith("40{")
    connected = json.loads(packet[2:])
    assert set(connected) == {"sid", "pid"}
    assert Session.objects.filter(user_id="ANZ-41091", connection_id=connected["sid"]).exists()  # its clientId


@pytest.mark.django_db
def test_a_message_waiting_for_a_poll_that_never_comes_is_given_back_not_lost(node):
    session = Polling(node)
    session.post('40{"appId":"app-id-343","userId":"ANZ-41121","token":"t"}')
    assert session.packets()[0].startswith("40{")
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-41122")
        alice.message("ANZ-41121", "for a client that stopped polling")
        # no poll, no pong: the session ends after its heartbeat, the message still in its outbox
        wait_for(lambda: not Session.objects.filter(user_id="ANZ-41121", disconnected_at__isnull=True).exists())
    assert not Delivery.objects.filter(recipient="ANZ-41121", state=DeliveryState.DELIVERED).exists()
    with SioUser(node.url, "ANZ-41121") as again:
        answer = again.call("fetch_missing", {"count": 10})
        assert [m["content"] for m in answer["messages"]] == ["for a client that stopped polling"]


@pytest.mark.django_db
def test_two_polls_at_once_end_the_session(node):
    session = Polling(node)
    waiting = threading.Thread(target=session.get, kwargs={"timeout": 5})
    waiting.start()
    time.sleep(0.3)
    second = session.get()
    assert second.status_code == 400 and second.json()["code"] == 3
    waiting.join()
    assert session.get().json()["code"] == 1  # the session is gone


@pytest.mark.django_db
def test_a_post_over_the_payload_limit_is_refused_and_ends_the_session(node):
    session = Polling(node)
    answer = session.post("4" + "x" * 100_001)
    assert answer.status_code == 413 and answer.json()["message"] == "Payload too large"
    assert session.get().json()["code"] == 1


@pytest.mark.django_db
def test_a_close_packet_from_the_client_ends_the_session(node):
    session = Polling(node)
    assert session.post("1").text == "ok"
    assert session.get().json() == {"code": 1, "message": "Session ID unknown"}


@pytest.mark.django_db
def test_the_probe_and_upgrade_move_a_polling_session_to_a_websocket(node):
    session = Polling(node)
    session.post('40{"appId":"app-id-343","userId":"ANZ-41101","token":"t"}')
    assert session.packets()[0].startswith("40{")
    pending: list[httpx.Response] = []
    poll = threading.Thread(target=lambda: pending.append(session.get()))
    poll.start()
    time.sleep(0.2)
    url = f"ws://127.0.0.1:{node.port}/socket.io/?EIO=4&transport=websocket&sid={session.sid}"
    with connect(url) as ws:
        ws.send("2probe")
        assert ws.recv(timeout=5) == "3probe"
        poll.join(5)
        assert pending[0].text == "6"  # the waiting poll let go with a NOOP
        ws.send("5")  # UPGRADE: from now on the session is on this socket
        ws.send('421["message",{"to":"ANZ-41102","content":"over the upgraded socket"}]')
        answer = ws.recv(timeout=5)
        while answer == "2":  # a PING may come first
            ws.send("3")
            answer = ws.recv(timeout=5)
        assert answer.startswith("431[") and json.loads(answer[3:])[0]["id"].isdigit()  # ACK 1: stored
        assert session.get().status_code == 400  # no more polls on an upgraded session


@pytest.mark.django_db
@pytest.mark.parametrize("transports", [["websocket"], None], ids=["websocket", "upgraded"])
def test_a_large_message_goes_over_a_websocket_once_logged_in(node, transports):
    content = "y" * 50_000  # far over the 4 KB a socket may carry before its login
    with SioUser(node.url, "ANZ-41131", transports=transports) as alice, SioUser(node.url, "ANZ-41132") as bob:
        time.sleep(0.5)  # (the default client's upgrade)
        assert alice.call("message", {"to": "ANZ-41132", "content": content})["id"].isdigit()
        assert bob.next("message")["content"] == content


def _ws_session(node):
    """A Socket.IO session straight on a WebSocket, by hand: the socket, after the OPEN packet."""
    ws = connect(f"ws://127.0.0.1:{node.port}/socket.io/?EIO=4&transport=websocket")
    assert ws.recv(timeout=5).startswith("0{")
    return ws


def _next_packet(ws) -> str:
    while (packet := ws.recv(timeout=5)) == "2":  # a PING: answered
        ws.send("3")
    return packet


@pytest.mark.django_db
def test_bad_packets_are_answered_clearly_and_the_connection_keeps_working(node):
    with _ws_session(node) as ws:
        ws.send('421["message",{"to":"ANZ-1"}]')  # an event before CONNECT
        assert json.loads(_next_packet(ws)[3:])[0]["error"] == "INVALID_MESSAGE"
        ws.send('40{"appId":"app-id-343","userId":"ANZ-41151","token":"t"}')
        assert _next_packet(ws).startswith("40{")
        for bad in ('42["message",{oops', '42["message",NaN]', "4", "49", '42{"not":"a list"}'):
            ws.send(bad)
        seen = [_next_packet(ws) for _ in range(2)]  # the two malformed ones are refused by name
        assert all(p.startswith('42["invalid_message"') and "malformed" in p for p in seen)
        ws.send('422["message",{"to":"ANZ-41152","content":"still here"}]')
        answer = _next_packet(ws)
        while not answer.startswith("432"):
            answer = _next_packet(ws)
        assert json.loads(answer[3:])[0]["id"].isdigit()


@pytest.mark.django_db
def test_a_connect_over_the_pre_login_frame_limit_is_refused_and_closed(node):
    with _ws_session(node) as ws:
        ws.send('40{"appId":"app-id-343","userId":"ANZ-41161","token":"' + "t" * 5000 + '"}')
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                _next_packet(ws)
        assert closed.value.rcvd is None or closed.value.rcvd.code in (1000, 1009)


@pytest.mark.django_db
def test_a_binary_attachment_is_refused_at_once_with_the_reason_and_the_client_is_disconnected(node):
    with SioUser(node.url, "ANZ-41111") as alice:
        disconnected = threading.Event()
        alice.client.on("disconnect", lambda *args: disconnected.set())
        answer = alice.call("message", {"to": "ANZ-41112", "content": b"\x00\x01 binary"})
        assert answer["error"] == "INVALID_MESSAGE" and "binary" in answer["detail"]
        assert disconnected.wait(10)  # (told DISCONNECT: python-socketio would not come back either)
    assert not Delivery.objects.filter(recipient="ANZ-41112").exists()


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
def test_a_group_message_event_resent_with_its_client_message_id_reaches_each_recipient_once(node):
    group = {"to": ["ANZ-41032", "ANZ-41033"], "content": "once each", "clientMessageId": "sio-group-1"}
    with WsClient(node.ws_url) as bob, WsClient(node.ws_url) as carol:
        bob.auth("ANZ-41032")
        carol.auth("ANZ-41033")
        with SioUser(node.url, "ANZ-41031") as alice:
            first = alice.call("group_message", group)
        with SioUser(node.url, "ANZ-41031") as alice_again:  # a resend on a new connection, after a doubt
            again = alice_again.call("group_message", group)
        assert first == {"id": first["id"], "clientMessageId": "sio-group-1"}
        assert again == {**first, "duplicate": True}
        for recipient in (bob, carol):
            assert recipient.recv_type("MESSAGE")["data"]["id"] == first["id"]
            assert [f for f in recipient.recv_all(quiet=1) if f["type"] == "MESSAGE"] == []
    assert Delivery.objects.filter(message__sender="ANZ-41031").count() == 2


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
def test_a_client_message_id_of_the_queue_intakes_namespace_is_refused(node):
    with SioUser(node.url, "ANZ-41035") as alice:
        answer = alice.call("message", {"to": "ANZ-41036", "content": "x", "clientMessageId": "sbq:1764370000000-0"})
        assert answer["error"] == "INVALID_MESSAGE" and "reserved for the app's sends from its queue" in answer["detail"]


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
def test_in_ack_mode_the_handlers_return_is_the_ack_and_nothing_comes_again_after_a_reconnect(node):
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-41051")
        with SioUser(node.url, "ANZ-41052", acks=True) as bob:
            alice.message("ANZ-41052", "ack me")
            assert bob.next("message")["content"] == "ack me"
            wait_for(lambda: Delivery.objects.filter(recipient="ANZ-41052", state=DeliveryState.DELIVERED).count() == 1)
        with SioUser(node.url, "ANZ-41052", acks=True) as bob:
            assert bob.call("fetch_missing", {"count": 10}) == {"messages": [], "leftMissingCount": 0}
            with pytest.raises(TimeoutError):
                bob.next("message", timeout=1)


@pytest.mark.django_db
def test_the_master_user_hears_a_socketio_user_connect_and_leave(node):
    with SioUser(node.url, "ANZ-123223") as master:
        online = master.next("online_users")
        assert "count" in online
        with SioUser(node.url, "ANZ-41061", transports=["polling"]):
            assert master.next("user_connected") == {"userId": "ANZ-41061"}
        assert master.next("user_disconnected") == {"userId": "ANZ-41061"}


@pytest.mark.django_db
def test_one_user_online_by_both_kinds_of_connection_is_online_until_the_last_one_goes(node):
    with SioUser(node.url, "ANZ-123223") as master:
        master.next("online_users")
        with WsClient(node.ws_url) as native:
            native.auth("ANZ-41141")
            assert master.next("user_connected") == {"userId": "ANZ-41141"}
            with SioUser(node.url, "ANZ-41141", transports=["websocket"]) as sio, WsClient(node.ws_url) as alice:
                alice.auth("ANZ-41142")
                alice.message("ANZ-41141", "to both kinds")
                got: list[str] = []
                deadline = time.monotonic() + 10
                while not got and time.monotonic() < deadline:  # pushed to one of its connections
                    try:
                        got.append(native.recv_type("MESSAGE", timeout=0.2)["data"]["content"])
                    except TimeoutError:
                        if not sio.events.empty():
                            got.append(sio.events.get()[1]["content"])
                assert got == ["to both kinds"]
            time.sleep(1)  # the Socket.IO connection went: the user is still online by the other
            assert ("user_disconnected", {"userId": "ANZ-41141"}) not in list(master.events.queue)
        while master.next("user_disconnected") != {"userId": "ANZ-41141"}:  # (ANZ-41142's comes first)
            pass


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


@pytest.mark.django_db
def test_a_raw_sender_asking_for_confirmation_without_a_callback_gets_the_confirmation_event(node):
    with _ws_session(node) as ws, WsClient(node.ws_url) as bob:
        bob.auth("ANZ-41172")
        ws.send('40{"appId":"app-id-343","userId":"ANZ-41171","token":"t"}')
        assert _next_packet(ws).startswith("40{")
        ws.send('42["message",{"to":"ANZ-41172","content":"confirm me","reference":"ref-1",'
                '"confirmationEnabled":true}]')
        assert bob.recv_type("MESSAGE")["data"]["content"] == "confirm me"
        packet = _next_packet(ws)
        while not packet.startswith('42["confirmation"'):
            packet = _next_packet(ws)
        assert json.loads(packet[2:])[1]["reference"] == "ref-1"
