"""Bad input gets a clear answer, and the connection keeps working for valid frames."""

from __future__ import annotations

import json

import pytest

from tests.wsclient import WsClient

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
        flood.auth("ANZ-11050")
        for _ in range(70):  # burst is 60 for this app
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
    web = module_processes.web("web-short-auth", WS_AUTH_TIMEOUT="1")
    with WsClient(web.ws_url) as client:
        assert client.wait_closed(timeout=5) == 4001
