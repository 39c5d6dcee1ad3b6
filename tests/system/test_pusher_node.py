"""The real pusher-js and Laravel Echo (Node, pinned in tests/node) and the official `pusher` server
library against a real web node (daphne) and worker: public, private, presence and cache channels,
client events (whisper), the HTTP API, and native publishes reaching Pusher clients."""

from __future__ import annotations

import httpx
import pytest

from apps_registry.services import api_key_create
from tests.pusher import PusherJs

pytestmark = [pytest.mark.system, pytest.mark.django_db]
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def api_key(demo_network, django_db_blocker) -> str:
    """An API key of ANZ (committed: the web node must see it) for the native REST API."""
    with django_db_blocker.unblock():
        return api_key_create(app=demo_network["anz"], name="pusher-test")[1]


@pytest.fixture(scope="module")
def web(module_processes):
    node = module_processes.web("web")
    module_processes.worker("worker")
    return node


def test_pusher_js_gets_what_the_official_server_library_triggers_on_a_public_channel(web):
    with PusherJs(HOST, web.port) as client:
        socket_id = client.connected()
        assert socket_id.count(".") == 1
        assert client.subscribe("orders")["event"] == "subscribed"
        answer = client.api("trigger", "orders", "OrderShipped", {"id": 7})
        assert answer["status"] == 200 and answer["body"] == {}
        got = client.next("event", channel="orders")
        assert (got["name"], got["data"]) == ("OrderShipped", {"id": 7})


def test_a_native_publish_reaches_pusher_clients_as_the_message_event(web, api_key):
    key = api_key
    with PusherJs(HOST, web.port) as client:
        client.connected()
        client.subscribe("native.feed")
        response = httpx.post(f"{web.url}/api/v1/channels/pusher.native.feed/messages",
                              headers={"Authorization": f"Bearer {key}"}, json={"content": "from the REST API"})
        assert response.status_code in (200, 201, 202), response.text
        got = client.next("event", channel="native.feed")
        assert (got["name"], got["data"]) == ("message", "from the REST API")


def test_presence_members_and_client_events_between_two_pusher_js_clients(web):
    with PusherJs(HOST, web.port, user={"user_id": "1", "user_info": {"name": "Ann"}}) as ann, \
            PusherJs(HOST, web.port, user={"user_id": "2", "user_info": {"name": "Bob"}}) as bob:
        ann.connected(), bob.connected()
        assert ann.subscribe("presence-room.1")["members"] == ["1"]
        assert bob.subscribe("presence-room.1")["members"] == ["1", "2"]
        added = ann.next("member_added")
        assert (added["id"], added["info"]) == ("2", {"name": "Bob"})
        ann.command(op="bind", channel="presence-room.1", event="client-typing")
        bob.command(op="trigger", channel="presence-room.1", event="client-typing", data={"typing": True})
        got = ann.next("bound", name="client-typing")
        assert got["data"] == {"typing": True} and got["user_id"] == "2"
        assert [e for e in bob.quiet(1.0) if e.get("name") == "client-typing"] == []  # never echoed
        users = ann.api("get", {"path": "/channels/presence-room.1/users"})
        assert users["body"] == {"users": [{"id": "1"}, {"id": "2"}]}
        bob.command(op="unsubscribe", channel="presence-room.1")
        assert ann.next("member_removed")["id"] == "2"


def test_a_private_channel_with_a_signature_from_the_server_library_and_a_cache_channel(web):
    with PusherJs(HOST, web.port) as client:
        client.connected()
        assert client.subscribe("private-orders.9")["event"] == "subscribed"
        client.api("trigger", "private-orders.9", "Paid", "ok")
        assert client.next("event", channel="private-orders.9")["data"] == "ok"
        client.subscribe("cache-scores")
        client.next("cache_miss", channel="cache-scores")
        client.api("trigger", "cache-scores", "score", "2-1")
        client.next("event", channel="cache-scores")
    with PusherJs(HOST, web.port) as late:
        late.connected()
        late.subscribe("cache-scores")
        assert late.next("event", channel="cache-scores")["data"] == "2-1"


def test_every_name_the_protocol_allows_works_up_to_200_characters_and_longer_is_refused(web):
    name = "private-a=1,b;c@d." + "x" * 182
    with PusherJs(HOST, web.port) as client:
        client.connected()
        assert client.subscribe(name)["event"] == "subscribed"
        client.api("trigger", name, "Named", "ok")
        assert client.next("event", channel=name)["data"] == "ok"
        listed = client.api("get", {"path": "/channels", "params": {"filter_by_prefix": "private-a="}})
        assert listed["body"] == {"channels": {name: {}}}
        too_long = "y" * 201  # (a public one: the server library would not sign a name over 200)
        assert client.subscribe(too_long)["event"] == "subscription_error"


def test_laravel_echo_listens_joins_and_whispers(web):
    with PusherJs(HOST, web.port, echo=True, user={"user_id": "11", "user_info": {"name": "Eve"}}) as eve, \
            PusherJs(HOST, web.port, echo=True, user={"user_id": "12", "user_info": {"name": "Fay"}}) as fay:
        eve.connected(), fay.connected()
        eve.command(op="echo", how="listen", channel="news", event=".Published")
        eve.command(op="echo", how="private", channel="orders.1", event="OrderShipped")
        eve.command(op="echo", how="join", channel="chat.1", event="typing")
        assert [u["name"] for u in eve.next("echo", name="here")["data"]] == ["Eve"]
        fay.command(op="echo", how="join", channel="chat.1", event="typing")
        fay.next("echo", name="here")
        assert eve.next("echo", name="joining")["data"]["name"] == "Fay"
        fay.command(op="echo", how="whisper", channel="chat.1", event="typing", data={"who": "Fay"})
        assert eve.next("echo", name="whisper")["data"] == {"who": "Fay"}
        eve.api("trigger", "news", "Published", {"title": "t"})
        assert eve.next("echo", name=".Published")["data"] == {"title": "t"}
        eve.api("trigger", "private-orders.1", "App\\Events\\OrderShipped", {"id": 3})
        assert eve.next("echo", name="OrderShipped")["data"] == {"id": 3}
        fay.command(op="echo", how="leave", channel="chat.1")
        assert eve.next("echo", name="leaving")["data"]["name"] == "Fay"


def test_the_api_lists_occupied_channels_and_refuses_a_wrong_secret(web):
    with PusherJs(HOST, web.port) as client:
        client.connected()
        client.subscribe("listed.1")
        listed = client.api("get", {"path": "/channels", "params": {"info": "subscription_count"}})
        assert listed["status"] == 200 and listed["body"]["channels"]["listed.1"] == {"subscription_count": 1}
    with PusherJs(HOST, web.port, secret="wrong-secret") as forger:
        assert forger.api("trigger", "listed.1", "e", "d")["status"] == 401


def test_a_signed_in_user_gets_server_to_user_events_and_the_app_terminates_its_connections(web):
    with PusherJs(HOST, web.port, signin_as={"id": "u-42", "name": "Uma"}) as uma:
        uma.connected()
        uma.command(op="signin")
        uma.next("signed_in")
        assert uma.api("sendToUser", "u-42", "notice", {"text": "hi"})["status"] == 200
        got = uma.next("user_event")
        assert (got["name"], got["data"]) == ("notice", {"text": "hi"})
        assert uma.api("terminateUserConnections", "u-42")["status"] == 200
        assert uma.next("connection_error")["data"]["code"] == 4009


def test_pusher_js_over_the_apps_connection_quota_is_told_4004_and_does_not_reconnect(module_processes):
    quota = module_processes.web("quota", PUSHER_MAX_PER_APP="1")
    with PusherJs(HOST, quota.port) as first, PusherJs(HOST, quota.port) as over:
        first.connected()
        error = over.next("connection_error")
        assert error["data"]["code"] == 4004 and "connection quota" in error["data"]["message"]
        states = [e["current"] for e in over.quiet(3.0) if e.get("event") == "state"]
        assert states == ["disconnected"]  # refused (4000-4099): no attempt again, unlike 4100's backoff
