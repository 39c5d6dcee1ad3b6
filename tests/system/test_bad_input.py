"""Bad input gets a clear answer, and the connection keeps working for valid frames."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed

from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system


def _still_works(client: WsClient) -> None:
    client.send("PING")
    assert client.recv_type("PONG")["data"] == {}


@pytest.fixture
def alice(node):
    with WsClient(node.ws_url) as client:
        client.auth("ANZ-11001")
        yield client


def test_frames_before_authentication_get_auth_required(node):
    with WsClient(node.ws_url) as client:
        client.message("ANZ-2", "hi")
        assert client.recv()["type"] == "AUTH_REQUIRED"
        assert client.auth("ANZ-11002")["data"]["isAuthenticated"] is True


@pytest.mark.parametrize("text, reason", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"data": {}}), "missing 'type'"),
    (json.dumps({"type": "TELEPORT", "data": {}}), "unknown type 'TELEPORT'"),
    (json.dumps({"type": "MESSAGE", "data": "x"}), "'data' must be an object"),
    (json.dumps({"type": "MESSAGE", "data": {"content": "x"}}), "missing or invalid recipient in 'to'"),
    (json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-11009"}}), "missing or invalid 'content'"),
    (json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-11009", "content": "x"}, "feature": "TURBO"}),
     "feature must be RELIABLE or FAST"),
    (json.dumps({"type": "MESSAGE", "data": {"to": "BNZ-5", "content": "x"}}), "belongs to another app"),
    (json.dumps({"type": "MESSAGE", "data": {"to": "ZZZ-5", "content": "x"}}), "belongs to another app"),
    (json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-12x", "content": "x"}}), "is not a user id"),
    (json.dumps({"type": "GROUP_MESSAGE", "data": {"to": [], "content": "x"}}), "non-empty list"),
    (json.dumps({"type": "GROUP_MESSAGE", "data": {"to": [f"ANZ-{i}" for i in range(6)], "content": "x"}}),
     "at most 5 recipients"),
    (json.dumps({"type": "FETCH_MISSING_MESSAGES_REQUEST", "data": {"count": "ten"}}), "positive integer"),
    (json.dumps({"type": "ACK", "data": {"ids": "1"}}), "'ids' must be a list"),
    (json.dumps({"type": "AUTH_CLIENT", "data": {"appId": "app-id-343", "userId": "ANZ-3", "token": ""}}),
     "already authenticated"),
])
def test_each_kind_of_bad_frame_gets_invalid_message_and_the_connection_keeps_working(alice, text, reason):
    alice.send_raw(text)
    answer = alice.recv_type("INVALID_MESSAGE")
    assert reason in answer["data"]["reason"]
    _still_works(alice)


def test_a_recipient_no_user_distribution_covers_is_unknown(node):
    with WsClient(node.ws_url) as bnz:
        bnz.auth("BNZ-7", app_id="app-id-bnz")  # BNZ users 0-999999 live here; nobody is assigned beyond that
        bnz.message("BNZ-5000000", "x")
        assert "unknown recipient 'BNZ-5000000'" in bnz.recv_type("INVALID_MESSAGE")["data"]["reason"]
        _still_works(bnz)


def test_oversized_content_is_refused_but_the_frame_is_answered(alice):
    alice.message("ANZ-11009", "x" * (64 * 1024 + 1))
    answer = alice.recv_type("INVALID_MESSAGE")
    assert answer["data"]["reason"] == "content exceeds 65536 bytes" and answer["data"]["limit"] == 65536
    assert "data" not in answer["data"]  # (64 KB are not sent back)
    _still_works(alice)


def test_a_frame_over_the_size_limit_closes_with_1009(alice):
    alice.send_raw(json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-2", "content": "x" * (1024 * 1024 + 10)}}))
    assert alice.wait_closed() == 1009


def test_binary_frames_are_refused_politely(alice):
    alice.ws.send(b"\x00\x01")
    assert "binary frames" in alice.recv_type("INVALID_MESSAGE")["data"]["reason"]
    _still_works(alice)


def test_rate_limit_refuses_the_excess_and_persistent_abuse_closes_with_1008(node):
    with WsClient(node.ws_url) as flood:
        flood.auth("RTL-11050", app_id="app-id-rtl")
        for _ in range(25):  # the app allows 2 a second, burst 10; 20 refusals in 10 s would close
            flood.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 1})
        frames = flood.recv_all(quiet=1)
        refused = [f for f in frames if f["type"] == "INVALID_MESSAGE"]
        assert refused and all(f["data"]["reason"] == "rate limit exceeded" for f in refused)
        _still_works(flood)
        for _ in range(200):
            flood.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 1})
        assert flood.wait_closed() == 1008


def test_wrong_app_id_is_refused_and_closed(node):
    with WsClient(node.ws_url) as client:
        reply = client.auth("ANZ-11060", app_id="not-the-app-id")
        assert reply["data"] == {"appId": "not-the-app-id", "userId": "ANZ-11060", "isAuthenticated": False}
        assert client.wait_closed() == 1008


def test_a_user_homed_in_another_domain_is_refused(node):
    with WsClient(node.ws_url) as client:
        assert client.auth("ANZ-9000001")["data"]["isAuthenticated"] is False
        assert client.wait_closed() == 1008


def test_a_malformed_user_id_is_refused(node):
    with WsClient(node.ws_url) as client:
        assert client.auth("ANZ_5")["data"]["isAuthenticated"] is False


def test_an_unauthenticated_socket_is_closed_after_the_auth_timeout(module_processes):
    # The opening handshake's own limit defaults to the auth timeout: held apart here, so a node slow
    # to accept its first socket on a busy machine does not stand in for the auth timeout.
    web = module_processes.web("web-short-auth", WS_AUTH_TIMEOUT="1", WS_HANDSHAKE_TIMEOUT="10")
    with WsClient(web.ws_url) as client:
        assert client.wait_closed(timeout=5) == 4001


@pytest.mark.parametrize("text, reason", [
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009","content":"\\udc00"}}', "lone surrogate"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-1100\\udc009","content":"x"}}', "lone surrogate"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009","content":"a\\u0000"}}', "NUL"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009","content":"x"},"reference":"\\u0000"}', "NUL"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009","content":"x","clientMessageId":"\\u0000"}}', "NUL"),
    ('{"type":"ACK","data":{"ids":[Infinity]}}', "malformed JSON"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009","content":NaN}}', "malformed JSON"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-011009","content":"x"}}', "is not a user id"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-\\u0661\\u0662","content":"x"}}', "is not a user id"),
    ('{"type":"MESSAGE","data":{"to":"ANZ-11009\\n","content":"x"}}', "is not a user id"),
])
def test_text_no_socket_or_database_can_carry_is_refused_cleanly_and_the_connection_keeps_working(alice, text,
                                                                                                     reason):
    alice.send_raw(text)
    answer = alice.recv_type("INVALID_MESSAGE")
    assert reason in answer["data"]["reason"]
    assert "NaN" not in json.dumps(answer) and "Infinity" not in json.dumps(answer)
    _still_works(alice)


def test_a_connection_that_sent_a_lone_surrogate_still_leaves_cleanly(node):
    with WsClient(node.ws_url) as master:
        master.auth("ANZ-123223")
        victim = WsClient(node.ws_url)
        victim.auth("ANZ-11070")
        master.recv_until(lambda f: f["type"] == "USER_CONNECTED" and f["data"]["userId"] == "ANZ-11070")
        victim.send_raw('{"type":"MESSAGE","data":{"to":"\\udc00","content":"\\udc00"}}')
        victim.recv_type("INVALID_MESSAGE")
        victim.close()
        master.recv_until(lambda f: f["type"] == "USER_DISCONNECTED" and f["data"]["userId"] == "ANZ-11070")
        with WsClient(node.ws_url) as back:
            back.auth("ANZ-11070")
            master.recv_until(lambda f: f["type"] == "USER_CONNECTED" and f["data"]["userId"] == "ANZ-11070")


def test_a_frame_far_over_the_size_limit_closes_with_1009_before_it_is_read(alice):
    alice.send_raw("x" * (5 * 1024 * 1024))
    assert alice.wait_closed() == 1009


def test_frames_before_authentication_are_answered_only_within_a_small_budget(node):
    with WsClient(node.ws_url) as client:
        try:
            for _ in range(300):
                client.send("PING")
        except ConnectionClosed:
            pass
        assert client.wait_closed(timeout=10) in (1008, 4003)
        assert 0 < sum(f["type"] == "AUTH_REQUIRED" for f in client.frames) <= 25


def test_cheap_frames_are_rate_limited_too(alice):
    try:
        for _ in range(1500):
            alice.send("PING")
    except ConnectionClosed:
        pass  # closed while we were still sending
    # refused beyond its budget (1008), or cut off earlier for sending faster than it is read (4003)
    assert alice.wait_closed(timeout=15) in (1008, 4003)
    assert sum(f["type"] == "PONG" for f in alice.frames) < 1000


def test_an_ack_names_at_most_a_bounded_number_of_ids(alice):
    alice.send("ACK", {"ids": [str(i) for i in range(1, 2002)]})
    assert "1 to 2000" in alice.recv_type("INVALID_MESSAGE")["data"]["reason"]
    _still_works(alice)


def test_a_browser_from_an_origin_the_app_does_not_list_is_refused(node):
    with WsClient(node.ws_url, origin="https://evil.example") as client:
        reply = client.auth("LIM-5", app_id="app-id-lim")
        assert reply["data"] == {"appId": "app-id-lim", "userId": "LIM-5", "isAuthenticated": False}
        assert client.wait_closed() == 1008
        assert "origin" in client.ws.close_reason
    with WsClient(node.ws_url, origin="https://good.example") as client:
        assert client.auth("LIM-5", app_id="app-id-lim")["data"]["isAuthenticated"] is True


def test_one_user_may_hold_only_the_apps_number_of_connections(node):
    clients = [WsClient(node.ws_url) for _ in range(3)]
    try:
        for client in clients:
            assert client.auth("LIM-6", app_id="app-id-lim")["data"]["isAuthenticated"] is True
        with WsClient(node.ws_url) as fourth:
            assert fourth.auth("LIM-6", app_id="app-id-lim")["data"]["isAuthenticated"] is False
            assert fourth.wait_closed() == 1008 and "too many connections" in fourth.ws.close_reason
        clients.pop().close()
        time.sleep(0.3)
        with WsClient(node.ws_url) as replacement:
            assert replacement.auth("LIM-6", app_id="app-id-lim")["data"]["isAuthenticated"] is True
    finally:
        for client in clients:
            client.close()


def test_work_is_limited_by_deliveries_not_frames(node):
    with WsClient(node.ws_url) as flood:
        flood.auth("LIM-7", app_id="app-id-lim")  # 20 deliveries per second, burst 20
        recipients = [f"LIM-{100 + i}" for i in range(20)]
        flood.send("GROUP_MESSAGE", {"to": recipients, "content": "first"})
        flood.send("GROUP_MESSAGE", {"to": recipients, "content": "second"})
        refused = flood.recv_type("INVALID_MESSAGE")
        assert refused["data"]["reason"] == "delivery rate limit exceeded"
        assert refused["data"]["limit"] == 20 and refused["data"]["retryAfterMs"] > 0
        _still_works(flood)


@pytest.mark.django_db
def test_a_forwarded_for_header_from_an_untrusted_peer_is_ignored(node):
    from presence.models import Session

    with WsClient(node.ws_url, additional_headers={"X-Forwarded-For": "198.51.100.7"}) as client:
        client.auth("ANZ-11080")
        wait_for(lambda: Session.objects.filter(user_id="ANZ-11080").exists())
        assert Session.objects.get(user_id="ANZ-11080").remote_addr == "127.0.0.1"


@pytest.mark.django_db
def test_whatever_breaks_inside_a_connection_its_cleanup_still_runs(node):
    from foundation.transport import sockets
    from presence.models import Session

    with WsClient(node.ws_url) as master:
        master.auth("ANZ-123223")
        victim = WsClient(node.ws_url)
        victim.auth("ANZ-11090")
        master.recv_until(lambda f: f["type"] == "USER_CONNECTED" and f["data"]["userId"] == "ANZ-11090")
        wait_for(lambda: Session.objects.filter(user_id="ANZ-11090", disconnected_at__isnull=True).exists())
        channel = Session.objects.get(user_id="ANZ-11090", disconnected_at__isnull=True).channel_name
        # An event the consumer cannot handle: it fails outside any frame handler, and dies.
        sockets.send_many_sync([(channel, {"type": "message.deliver", "items": [{"not": "an item"}]})])
        assert victim.wait_closed() == 1011
        master.recv_until(lambda f: f["type"] == "USER_DISCONNECTED" and f["data"]["userId"] == "ANZ-11090")
        wait_for(lambda: not Session.objects.filter(user_id="ANZ-11090", disconnected_at__isnull=True).exists())
