"""The Pusher protocol door over the in-process node (tests/inprocess.py): frames as the protocol
(version 7) has them, against real Postgres and Redis."""

from __future__ import annotations

import json
import re
import time

import pytest

from foundation.asyncdb import run_db
from messaging.channels.services import channel_publish_and_fanout
from tests.inprocess import Closed
from tests.pusher import ANZ_APP_ID, ANZ_KEY, BNZ_KEY, BNZ_SECRET, PATH, channel_auth, signed_query, user_auth

pytestmark = pytest.mark.django_db


class Pusher:
    """A Pusher client at the frame level, on an in-process client."""

    def __init__(self, node, key: str = ANZ_KEY, path: str = PATH):
        self.node = node
        self.ws = node.client(path=path.format(key=key))
        established = self.ws.recv()
        assert established["event"] == "pusher:connection_established", established
        self.socket_id = json.loads(established["data"])["socket_id"]

    def send(self, event: str, data=None, channel: str | None = None) -> None:
        frame = {"event": event, "data": {} if data is None else data}
        if channel:
            frame["channel"] = channel
        self.ws.send_raw(json.dumps(frame))

    def recv(self, event: str | None = None, timeout: float = 10) -> dict:
        while True:
            frame = self.ws.recv(timeout=timeout)
            if event is None or frame["event"] == event:
                return frame

    def subscribe(self, channel: str, **auth) -> dict:
        self.send("pusher:subscribe", {"channel": channel, **auth})
        return self.recv()

    def quiet(self, seconds: float = 0.5) -> list[dict]:
        frames = []
        try:
            while True:
                frames.append(self.ws.recv(timeout=seconds))
        except TimeoutError:
            return frames


def publish(node, channel: str, content: str) -> None:
    """What a server's publish does (the REST API's or the Pusher HTTP API's), committed on the node's threads."""
    from apps_registry.selectors import app_snapshot

    async def go():
        app = await run_db(app_snapshot, "ANZ")
        await run_db(channel_publish_and_fanout, app_id=app.pk, channel=channel, content=content)

    node.loop.run(go())


def test_a_client_is_told_its_socket_id_and_activity_timeout_as_a_json_string(node):
    ws = node.client(path=PATH.format(key=ANZ_KEY))
    frame = ws.recv()
    assert frame["event"] == "pusher:connection_established" and isinstance(frame["data"], str)
    data = json.loads(frame["data"])
    assert re.fullmatch(r"\d+\.\d+", data["socket_id"]) and data["activity_timeout"] == 120


@pytest.mark.parametrize(("path", "code"), [
    ("/app/no-such-key?protocol=7", 4001),
    (f"/app/{ANZ_KEY}?protocol=6&client=js", 4007),
    (f"/app/{ANZ_KEY}?client=js", 4008),
])
def test_an_unknown_key_or_another_protocol_version_is_refused_with_its_code(node, path, code):
    ws = node.client(path=path)
    frame = ws.recv()
    assert frame["event"] == "pusher:error" and frame["data"]["code"] == code
    assert ws.wait_closed() == code


def test_ping_is_answered_with_pong(node):
    client = Pusher(node)
    client.send("pusher:ping")
    assert client.recv() == {"event": "pusher:pong", "data": "{}"}


def test_a_public_channel_gets_server_publishes_as_events_and_native_ones_as_message(node):
    client = Pusher(node)
    assert client.subscribe("orders") == {"event": "pusher_internal:subscription_succeeded", "channel": "orders",
                                          "data": "{}"}
    publish(node, "pusher.orders", json.dumps({"event": "OrderShipped", "data": '{"id":7}'}))
    publish(node, "pusher.orders", "plain native content")
    assert client.recv() == {"event": "OrderShipped", "channel": "orders", "data": '{"id":7}'}
    assert client.recv() == {"event": "message", "channel": "orders", "data": "plain native content"}


def test_a_private_channel_needs_the_apps_signature_of_this_socket(node):
    client = Pusher(node)
    refused = client.subscribe("private-orders.1", auth="anz-pusher-key:" + "0" * 64)
    assert refused["event"] == "pusher:subscription_error" and refused["data"]["type"] == "AuthError"
    assert refused["data"]["status"] == 4009
    other_socket = channel_auth("1.1", "private-orders.1")
    assert client.subscribe("private-orders.1", **other_socket)["event"] == "pusher:subscription_error"
    ok = client.subscribe("private-orders.1", **channel_auth(client.socket_id, "private-orders.1"))
    assert ok["event"] == "pusher_internal:subscription_succeeded"


def test_presence_members_are_told_who_is_there_who_comes_and_who_goes(node):
    alice, bob = Pusher(node), Pusher(node)
    ch = "presence-room.1"
    joined = alice.subscribe(ch, **channel_auth(alice.socket_id, ch, {"user_id": "1", "user_info": {"name": "A"}}))
    assert json.loads(joined["data"]) == {"presence": {"ids": ["1"], "hash": {"1": {"name": "A"}}, "count": 1}}
    joined = bob.subscribe(ch, **channel_auth(bob.socket_id, ch, {"user_id": 2}))
    assert json.loads(joined["data"])["presence"]["count"] == 2
    added = alice.recv("pusher_internal:member_added")
    assert (added["channel"], json.loads(added["data"])) == (ch, {"user_id": "2"})
    bob.send("pusher:unsubscribe", {"channel": ch})
    removed = alice.recv("pusher_internal:member_removed")
    assert json.loads(removed["data"]) == {"user_id": "2"}


def test_a_users_second_connection_is_no_new_member_and_its_first_leaving_removes_nobody(node):
    watcher, first, second = Pusher(node), Pusher(node), Pusher(node)
    ch = "presence-room.2"
    watcher.subscribe(ch, **channel_auth(watcher.socket_id, ch, {"user_id": "w"}))
    first.subscribe(ch, **channel_auth(first.socket_id, ch, {"user_id": "u"}))
    assert json.loads(watcher.recv("pusher_internal:member_added")["data"])["user_id"] == "u"
    second.subscribe(ch, **channel_auth(second.socket_id, ch, {"user_id": "u"}))
    first.ws.close()
    assert [f for f in watcher.quiet(1.0) if f["event"].startswith("pusher_internal:member")] == []
    second.ws.close()
    assert json.loads(watcher.recv("pusher_internal:member_removed")["data"]) == {"user_id": "u"}


def test_client_events_reach_the_other_subscribers_never_the_sender(node):
    alice, bob = Pusher(node), Pusher(node)
    ch = "presence-chat.1"
    alice.subscribe(ch, **channel_auth(alice.socket_id, ch, {"user_id": "a"}))
    bob.subscribe(ch, **channel_auth(bob.socket_id, ch, {"user_id": "b"}))
    alice.send("client-typing", {"typing": True}, channel=ch)
    got = bob.recv("client-typing")
    assert (got["channel"], json.loads(got["data"]), got["user_id"]) == (ch, {"typing": True}, "a")
    assert [f for f in alice.quiet() if f["event"] == "client-typing"] == []


def test_client_events_are_refused_where_the_protocol_or_the_app_does_not_allow_them(node):
    client = Pusher(node)
    client.subscribe("news")
    client.send("client-x", {}, channel="news")
    assert client.recv("pusher:error")["data"]["code"] == 4009  # public channel
    client.send("client-x", {}, channel="private-not-subscribed")
    assert client.recv("pusher:error")["data"]["code"] == 4009
    bnz = Pusher(node, key=BNZ_KEY)
    bnz.subscribe("private-a", **channel_auth(bnz.socket_id, "private-a", key=BNZ_KEY, secret=BNZ_SECRET))
    bnz.send("client-x", {}, channel="private-a")
    assert "not enabled" in bnz.recv("pusher:error")["data"]["message"]


def test_a_client_event_flood_is_refused_with_4301(node):
    client = Pusher(node)
    client.subscribe("private-flood", **channel_auth(client.socket_id, "private-flood"))
    for _ in range(40):
        client.send("client-spam", "x", channel="private-flood")
    assert client.recv("pusher:error")["data"]["code"] == 4301


def test_a_cache_channel_tells_a_miss_then_keeps_the_last_event(node):
    first = Pusher(node)
    first.subscribe("cache-scores")
    assert first.recv() == {"event": "pusher:cache_miss", "channel": "cache-scores"}
    publish(node, "pusher.cache-scores", json.dumps({"event": "score", "data": "1-0"}))
    publish(node, "pusher.cache-scores", json.dumps({"event": "score", "data": "2-0"}))
    late = Pusher(node)
    late.subscribe("cache-scores")
    assert late.recv() == {"event": "score", "channel": "cache-scores", "data": "2-0"}


def test_a_cache_channels_last_event_is_kept_for_the_cache_ttl_then_it_is_a_miss(node, settings):
    settings.PUSHER_CACHE_TTL_SECONDS = 1  # (Pusher's 30 minutes by default)
    publish(node, "pusher.cache-ttl", json.dumps({"event": "score", "data": "1-0"}))
    soon = Pusher(node)
    soon.subscribe("cache-ttl")
    assert soon.recv() == {"event": "score", "channel": "cache-ttl", "data": "1-0"}
    time.sleep(1.5)
    late = Pusher(node)
    late.subscribe("cache-ttl")
    assert late.recv() == {"event": "pusher:cache_miss", "channel": "cache-ttl"}


@pytest.mark.parametrize(("frame", "code"), [
    ("not json", 4300),
    ('["an", "array"]', 4300),
    ('{"event": "pusher:nonsense", "data": {}}', 4300),
    ('{"event": "not-a-client-event", "data": {}}', 4300),
])
def test_bad_input_is_answered_with_pusher_error_and_the_connection_stays(node, frame, code):
    client = Pusher(node)
    client.ws.send_raw(frame)
    assert client.recv()["data"]["code"] == code
    client.send("pusher:ping")
    assert client.recv()["event"] == "pusher:pong"


@pytest.mark.parametrize(("channel", "data"), [
    ("x" * 201, {}),
    ("bad name!", {}),
    ("presence-r", {"channel_data": "not json"}),
    ("presence-r", {"channel_data": '{"user_info": {}}'}),
])
def test_a_bad_subscription_is_answered_with_subscription_error(node, channel, data):
    client = Pusher(node)
    if "channel_data" in data:
        data = channel_auth(client.socket_id, channel) | {"channel_data": data["channel_data"]}
        data["auth"] = channel_auth(client.socket_id, channel)["auth"]  # signed without the data: refused anyway
    frame = client.subscribe(channel, **data)
    assert frame["event"] == "pusher:subscription_error" and frame["data"]["status"] in (4009, 4300)


def test_a_large_frame_before_any_subscription_closes_with_1009(node):
    client = Pusher(node)
    client.ws.send_raw(json.dumps({"event": "pusher:ping", "data": "x" * 5000}))
    with pytest.raises(Closed) as closed:
        client.recv()
    assert closed.value.code == 1009


def test_resume_replays_what_came_after_an_offset(node):
    client = Pusher(node, path=PATH + "&offsets=1")
    client.subscribe("feed")
    for i in range(3):
        publish(node, "pusher.feed", json.dumps({"event": "e", "data": str(i)}))
    offsets = [client.recv("e")["offset"] for _ in range(3)]
    client.send("pusher:resume", {"channel": "feed", "since": offsets[0]})
    assert [client.recv("e")["data"] for _ in range(2)] == ["1", "2"]
    assert json.loads(client.recv("pusher:resumed")["data"]) == {"offset": offsets[2]}


def test_the_http_api_lists_occupied_channels_and_presence_members(node, client):

    def get(path, params=None):
        return client.get(f"{path}?{signed_query('GET', path, params)}").json()

    alice, bob = Pusher(node), Pusher(node)
    ch = "presence-api.1"
    alice.subscribe(ch, **channel_auth(alice.socket_id, ch, {"user_id": "a"}))
    bob.subscribe(ch, **channel_auth(bob.socket_id, ch, {"user_id": "b"}))
    listed = get(f"/apps/{ANZ_APP_ID}/channels", {"filter_by_prefix": "presence-api", "info": "user_count"})
    assert listed == {"channels": {ch: {"user_count": 2}}}
    assert get(f"/apps/{ANZ_APP_ID}/channels/{ch}", {"info": "subscription_count,user_count"}) == {
        "occupied": True, "subscription_count": 2, "user_count": 2}
    assert get(f"/apps/{ANZ_APP_ID}/channels/{ch}/users") == {"users": [{"id": "a"}, {"id": "b"}]}


def test_any_name_the_protocol_allows_up_to_200_characters_is_a_channel_the_api_publishes_on_and_lists(node, client):
    names = ["presence-a=1,b;2@c" + "x" * 182, "cache-room;1"]
    assert len(names[0]) == 200
    subscribers = []
    for name in names:
        sub = Pusher(node)
        auth = channel_auth(sub.socket_id, name, {"user_id": "u"}) if name.startswith("presence-") else {}
        assert sub.subscribe(name, **auth)["event"] == "pusher_internal:subscription_succeeded"
        subscribers.append(sub)
    assert subscribers[1].recv() == {"event": "pusher:cache_miss", "channel": names[1]}
    path = f"/apps/{ANZ_APP_ID}/events"
    body = json.dumps({"name": "e", "data": "d", "channel": names[0]}).encode()
    response = client.post(f"{path}?{signed_query('POST', path, body=body)}", data=body, content_type="application/json")
    assert response.status_code == 200, response.content
    assert subscribers[0].recv("e") == {"event": "e", "channel": names[0], "data": "d"}
    path = f"/apps/{ANZ_APP_ID}/channels"
    listed = client.get(f"{path}?{signed_query('GET', path, {'filter_by_prefix': 'presence-a='})}").json()
    assert listed == {"channels": {names[0]: {}}}
    # Natively, `cache-room;1` is `pusher.cache-room@s1` (`@` escapes what native names lack)
    publish(node, "pusher.cache-room@s1", json.dumps({"event": "native", "data": "n"}))
    assert subscribers[1].recv() == {"event": "native", "channel": names[1], "data": "n"}
    late = Pusher(node)
    late.subscribe(names[1])
    assert late.recv() == {"event": "native", "channel": names[1], "data": "n"}  # the cache channel's last event


def test_a_signed_in_user_gets_its_server_to_user_events_until_the_app_terminates_it(node, client):

    ann = Pusher(node)
    ann.send("pusher:signin", user_auth(ann.socket_id, {"id": "ann-1", "name": "Ann"}))
    success = ann.recv("pusher:signin_success")
    assert json.loads(json.loads(success["data"])["user_data"]) == {"id": "ann-1", "name": "Ann"}
    # (pusher-js subscribes to its user's channel once signed in; another user's is refused)
    assert ann.subscribe("#server-to-user-ann-1")["event"] == "pusher_internal:subscription_succeeded"
    assert ann.subscribe("#server-to-user-bob-2")["event"] == "pusher:subscription_error"
    path = f"/apps/{ANZ_APP_ID}/events"
    body = json.dumps({"name": "notice", "data": "for ann", "channel": "#server-to-user-ann-1"}).encode()
    response = client.post(f"{path}?{signed_query('POST', path, body=body)}", data=body, content_type="application/json")
    assert response.status_code == 200, response.content
    assert ann.recv("notice") == {"event": "notice", "channel": "#server-to-user-ann-1", "data": "for ann"}
    path = f"/apps/{ANZ_APP_ID}/users/ann-1/terminate_connections"
    response = client.post(f"{path}?{signed_query('POST', path, body=b'{}')}", data=b"{}", content_type="application/json")
    assert response.status_code == 200
    assert ann.recv("pusher:error")["data"]["code"] == 4009
    with pytest.raises(Closed) as closed:
        ann.recv()
    assert closed.value.code == 4009


def test_a_signin_the_app_did_not_sign_closes_with_4009(node):
    client = Pusher(node)
    client.send("pusher:signin", user_auth("1.1", {"id": "x"}))
    assert client.recv("pusher:error")["data"]["code"] == 4009
    with pytest.raises(Closed):
        client.recv()


def test_pusher_connections_subscriptions_and_events_are_counted_per_app(node):
    from foundation.metrics import REGISTRY

    def sample(name: str, **labels) -> float:
        return REGISTRY.get_sample_value(name, {"app": "ANZ", **labels}) or 0.0

    before = sample("switchboard_pusher_events_written_total")
    client = Pusher(node)
    client.subscribe("counted")
    assert sample("switchboard_pusher_connections") >= 1 and sample("switchboard_pusher_subscriptions") >= 1
    publish(node, "pusher.counted", json.dumps({"event": "e", "data": "d"}))
    client.recv("e")
    assert sample("switchboard_pusher_events_written_total") == before + 1


def test_pusher_webhooks_come_in_pusher_format_signed_with_the_apps_pusher_secret(node):
    import hashlib
    import hmac

    from apps_registry.selectors import app_snapshot
    from messaging.webhooks.models import PUSHER_WEBHOOK_EVENTS
    from messaging.webhooks.services import webhook_endpoint_create, webhook_endpoint_delete
    from tests.pusher import ANZ_SECRET
    from tests.webhook_receiver import WebhookReceiver

    with WebhookReceiver() as receiver:
        async def register():
            app = await run_db(app_snapshot, "ANZ")
            endpoint, _ = await run_db(webhook_endpoint_create, app_id=app.pk, url=receiver.url,
                                       events=list(PUSHER_WEBHOOK_EVENTS))
            return app.pk, endpoint.pk

        app_pk, endpoint_pk = node.loop.run(register())
        try:
            alice, bob = Pusher(node), Pusher(node)
            ch = "presence-hooked.1"
            alice.subscribe(ch, **channel_auth(alice.socket_id, ch, {"user_id": "a"}))
            bob.subscribe(ch, **channel_auth(bob.socket_id, ch, {"user_id": "b"}))
            bob.send("client-hi", {"x": 1}, channel=ch)
            alice.recv("client-hi")
            bob.ws.close()
            calls = receiver.wait_for(lambda call: True, count=5)
        finally:
            node.loop.run(run_db(webhook_endpoint_delete, app_id=app_pk, endpoint_id=endpoint_pk))
    for call in calls:
        expected = hmac.new(ANZ_SECRET.encode(), call.body, hashlib.sha256).hexdigest()
        assert call.headers["x-pusher-key"] == ANZ_KEY and call.headers["x-pusher-signature"] == expected
        assert isinstance(call.json["time_ms"], int) and len(call.json["events"]) == 1
    events = [call.json["events"][0] for call in calls]
    assert {"name": "channel_occupied", "channel": ch} in events
    assert {"name": "member_added", "channel": ch, "user_id": "a"} in events
    assert {"name": "member_added", "channel": ch, "user_id": "b"} in events
    assert {"name": "client_event", "channel": ch, "event": "client-hi", "data": '{"x":1}', "socket_id": bob.socket_id,
            "user_id": "b"} in events
    assert {"name": "member_removed", "channel": ch, "user_id": "b"} in events


def test_a_silent_client_is_pinged_and_closed_with_4201_when_no_pong_comes(node, settings):
    settings.PUSHER_ACTIVITY_TIMEOUT_SECONDS = 1
    settings.PUSHER_PONG_TIMEOUT_SECONDS = 0.5
    client = Pusher(node)
    assert client.recv(timeout=5) == {"event": "pusher:ping", "data": "{}"}
    assert client.recv(timeout=5)["data"]["code"] == 4201
    assert client.ws.wait_closed() == 4201


def test_a_client_that_answers_the_ping_stays(node, settings):
    settings.PUSHER_ACTIVITY_TIMEOUT_SECONDS = 1
    settings.PUSHER_PONG_TIMEOUT_SECONDS = 0.5
    client = Pusher(node)
    assert client.recv(timeout=5)["event"] == "pusher:ping"
    client.send("pusher:pong")
    assert client.recv(timeout=5)["event"] == "pusher:ping"  # the next silence: pinged again, not closed


def test_an_app_over_its_connection_quota_is_refused_with_4004_and_other_apps_are_not(node, settings):
    settings.PUSHER_MAX_PER_APP = _open_connections(node, "ANZ") + 1  # (earlier tests' clients are still open)
    first = Pusher(node)
    over = node.client(path=PATH.format(key=ANZ_KEY))
    error = over.recv()
    assert error["event"] == "pusher:error" and error["data"]["code"] == 4004
    assert "connection quota" in error["data"]["message"] and over.wait_closed() == 4004
    Pusher(node, key=BNZ_KEY)  # another app's quota is its own
    first.ws.close()
    Pusher(node)  # the place it left is taken again


def test_the_quota_counts_the_apps_connections_on_every_node_until_a_dead_nodes_are_reaped(node, settings):
    from apps_registry.selectors import app_snapshot
    from messaging.gateway.pusher import quota
    from presence.cache import node_forget

    anz = node.loop.run(run_db(app_snapshot, "ANZ")).pk
    settings.PUSHER_MAX_PER_APP = 1_000
    for _ in range(2):  # another web node holds two of ANZ's connections
        assert node.loop.run(quota.connection_count_in(app_id=anz, node_id="other-node", quota=1_000))
    here = _open_connections(node, "ANZ")
    assert node.loop.run(quota.app_connections(anz)) == here + 2
    settings.PUSHER_MAX_PER_APP = here + 2  # full: this node's and the other's
    over = node.client(path=PATH.format(key=ANZ_KEY))
    assert over.recv()["data"]["code"] == 4004 and over.wait_closed() == 4004
    node_forget(node_id="other-node")  # the reaper declares it dead: its places are free again
    assert node.loop.run(quota.app_connections(anz)) == here
    Pusher(node)
    Pusher(node)


def _open_connections(node, app_name: str) -> int:
    from apps_registry.selectors import app_snapshot
    from messaging.gateway.pusher.node import pusher_node

    return pusher_node().by_app[node.loop.run(run_db(app_snapshot, app_name)).pk]


def test_over_capacity_is_4100_and_disabled_credentials_are_4003(node, settings):
    from apps_registry.pusher_credentials import PusherCredentials
    from apps_registry.selectors import app_snapshots_clear

    settings.PUSHER_MAX_PER_ADDRESS = 0
    ws = node.client(path=PATH.format(key=ANZ_KEY))
    assert ws.recv()["data"]["code"] == 4100 and ws.wait_closed() == 4100
    settings.PUSHER_MAX_PER_ADDRESS = 2000

    def enabled(on: bool) -> None:
        node.loop.run(run_db(lambda: PusherCredentials.objects.filter(key=BNZ_KEY).update(enabled=on)))
        app_snapshots_clear()

    enabled(False)
    try:
        ws = node.client(path=PATH.format(key=BNZ_KEY))
        assert ws.recv()["data"]["code"] == 4003 and ws.wait_closed() == 4003
    finally:
        enabled(True)


def test_a_node_declared_dead_while_paused_closes_its_pusher_clients_with_4200(node):
    from messaging.gateway.runtime import runtime

    client = Pusher(node)
    client.subscribe("ghostly")
    node.loop.run(runtime().declared_dead())
    assert client.recv()["data"]["code"] == 4200
    assert client.ws.wait_closed() == 4200
