"""Channels over real daphne nodes: the push seed's SSE and WebSocket streams (docs/protocol.md, "Channel streams")
and /ws SUBSCRIBE, with heartbeats, pong grace, reconnect notices, resume with Last-Event-ID or
`since`, and fan-out across two nodes. Publishes go through the push seed's `POST /messages`."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps_registry.models import ClientApp, UserDistribution
from apps_registry.services import api_key_create
from messaging.channels.names import channel_grant_sign
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system
SECRET = "pub-app-token-secret-of-32-bytes-at-least"
STREAM_ENV = {"PUSH_HEARTBEAT_SECONDS": "1", "PUSH_CLIENT_GRACE_SECONDS": "1",
              "PUSH_RECONNECT_DITHER_MIN_SECONDS": "4", "PUSH_RECONNECT_DITHER_MAX_SECONDS": "5",
              "PUSH_MAX_BUFFER_BYTES": "65536"}


@pytest.fixture(scope="module")
def pub(demo_network, django_db_blocker):
    """App PUB (committed): `news.*` public, client subscriptions allowed, a token secret; its API key."""
    with django_db_blocker.unblock():
        app = ClientApp.objects.create(app_name="PUB", app_id="app-id-pub", master_user_id="PUB-1",
                                       client_subscriptions_allowed=True, public_channel_patterns=["news.*"],
                                       auth_mode="none", token_secret=SECRET)
        UserDistribution.objects.create(app=app, domain=demo_network["anz"].distributions.first().domain,
                                        range_from=0, range_to=None)
        return {"app": app, "key": api_key_create(app=app, name="publisher")[1]}


@pytest.fixture(scope="module")
def nodes(module_processes, pub):
    first = module_processes.web("web-a", **STREAM_ENV)
    second = module_processes.web("web-b", **STREAM_ENV)
    module_processes.worker("worker")
    return first, second


def publish(node, pub, channel: str, message) -> dict:
    response = httpx.post(f"{node.url}/messages", json={"channel": channel, "message": message},
                          headers={"Authorization": f"Bearer {pub['key']}"}, timeout=10)
    assert response.status_code == 202, response.text
    return response.json()


class SseClient:
    """A plain HTTP client reading an SSE stream event by event."""

    def __init__(self, url: str, last_event_id: str | None = None):
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self.response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15)

    def event(self) -> dict:
        fields: dict = {}
        while True:
            line = self.response.readline().decode()
            if line == "":
                raise EOFError("stream ended")
            line = line.rstrip("\n")
            if not line:
                return fields
            name, _, value = line.partition(":")
            fields[name] = value

    def events_until(self, predicate, limit: int = 200) -> list[dict]:
        got = []
        for _ in range(limit):
            got.append(self.event())
            if predicate(got[-1]):
                return got
        raise AssertionError(f"not found in {got}")

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> SseClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def test_an_sse_reader_gets_a_heartbeat_at_once_then_each_message_with_its_offset(nodes, pub):
    stream = SseClient(f"{nodes[0].url}/sse/messages?channels=news.sse,news.other&app=app-id-pub")
    assert stream.response.headers["Content-Type"].startswith("text/event-stream")
    assert stream.event() == {"event": "heartbeat", "data": "{}"}
    assert publish(nodes[1], pub, "news.sse", "a message to channel qwerty") == {"subscribers": 1}
    assert publish(nodes[1], pub, "news.sse", {"score": [2, 1]}) == {"subscribers": 1}
    messages = [e for e in stream.events_until(lambda e: "score" in e.get("data", "")) if e["event"] == "message"]
    assert [json.loads(m["data"]) for m in messages] == [
        {"channel": "news.sse", "message": "a message to channel qwerty"},
        {"channel": "news.sse", "message": '{"score":[2,1]}'},  # a non-string message is its JSON text
    ]
    assert messages[-1]["id"] == "news.other:0,news.sse:2"
    stream.close()


def test_the_channels_parameter_is_required_on_both_streams(nodes):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{nodes[0].url}/sse/messages", timeout=5)
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {"error": "'channels' query parameter required"}
    with connect(f"ws://127.0.0.1:{nodes[0].port}/ws/messages") as ws:
        assert json.loads(ws.recv(timeout=5)) == {"error": "'channels' query parameter required"}
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
        assert ws.close_code == 1008


def test_a_stream_reads_only_public_or_granted_channels(nodes, pub):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{nodes[0].url}/sse/messages?channels=secret.plans&app=app-id-pub", timeout=5)
    assert refused.value.code == 403
    token = channel_grant_sign(secret=SECRET, channels=["secret.*"], app_id="app-id-pub", ttl_seconds=600)
    stream = SseClient(f"{nodes[0].url}/sse/messages?channels=secret.plans&token={token}")
    assert stream.event()["event"] == "heartbeat"
    publish(nodes[0], pub, "secret.plans", "granted")
    assert json.loads(stream.events_until(lambda e: e.get("event") == "message")[-1]["data"])["message"] == "granted"
    stream.close()


def test_an_sse_reader_that_reconnects_with_last_event_id_gets_exactly_what_it_missed(nodes, pub):
    stream = SseClient(f"{nodes[0].url}/sse/messages?channels=news.resume&app=app-id-pub")
    stream.event()
    publish(nodes[0], pub, "news.resume", "m-1")
    last = stream.events_until(lambda e: e.get("event") == "message")[-1]["id"]
    stream.close()
    for i in range(2, 6):  # while it is away
        publish(nodes[1], pub, "news.resume", f"m-{i}")
    again = SseClient(f"{nodes[1].url}/sse/messages?channels=news.resume&app=app-id-pub", last_event_id=last)
    assert again.event()["event"] == "heartbeat"
    publish(nodes[0], pub, "news.resume", "m-6")  # live, after the replay
    events = again.events_until(lambda e: "m-6" in e.get("data", ""))
    got = [json.loads(e["data"])["message"] for e in events if e["event"] == "message"]
    assert got == ["m-2", "m-3", "m-4", "m-5", "m-6"]
    again.close()


def test_an_sse_stream_announces_reconnect_one_grace_period_before_its_lifetime_ends(nodes, pub):
    started = time.monotonic()
    stream = SseClient(f"{nodes[0].url}/sse/messages?channels=news.life&app=app-id-pub")
    events = stream.events_until(lambda e: e.get("event") == "reconnect", limit=20)
    told = time.monotonic() - started
    assert sum(e["event"] == "heartbeat" for e in events) >= 2  # one at once, then every second
    assert 2.5 <= told <= 4.5  # lifetime 4-5 s, grace 1 s
    with pytest.raises(EOFError):  # and then the stream ends (a last heartbeat may come first)
        for _ in range(5):
            assert stream.event()["event"] == "heartbeat"
    assert time.monotonic() - started <= 6.5


def test_a_stream_socket_that_answers_pings_stays_and_one_that_stops_is_closed_after_the_grace(nodes, pub):
    url = f"ws://127.0.0.1:{nodes[0].port}/ws/messages?channels=news.ws&app=app-id-pub"
    with connect(url) as lazy:  # never answers a ping
        assert json.loads(lazy.recv(timeout=5)) == {"event": "ping", "data": {}}
        started = time.monotonic()
        with pytest.raises(ConnectionClosed):
            while True:
                lazy.recv(timeout=5)
        assert lazy.close_code == 4004 and time.monotonic() - started < 3.5  # ping at 1 s + 1 s grace
    with connect(url) as good:
        started = time.monotonic()
        frames = [json.loads(good.recv(timeout=5))]
        publish(nodes[1], pub, "news.ws", "hello")
        good.send('{"event":"ping"}')
        with pytest.raises(ConnectionClosed):
            while True:
                frames.append(json.loads(good.recv(timeout=5)))
                if frames[-1]["event"] == "ping":
                    good.send('{"event":"pong"}')
        lived = time.monotonic() - started
    events = [f["event"] for f in frames]
    assert events[0] == "ping" and events.count("ping") >= 3  # at once, then every second
    assert {"event": "message", "data": {"channel": "news.ws", "message": "hello", "offset": 1}} in frames
    assert {"event": "pong", "data": {}} in frames
    assert events[-1] == "reconnect" or events[-2:] == ["reconnect", "ping"]
    assert good.close_code == 1000 and 3.9 <= lived <= 6  # its whole (dithered) lifetime: answering kept it


def test_ws_subscribers_get_every_message_once_in_order_across_the_replay_seam_and_two_nodes(nodes, pub):
    total = 120
    published = threading.Event()

    def publisher() -> None:
        for i in range(1, total + 1):
            publish(nodes[i % 2], pub, "news.seam", f"m-{i}")
        published.set()

    with WsClient(nodes[0].ws_url) as early, WsClient(nodes[1].ws_url) as late:
        early.auth("PUB-10", app_id="app-id-pub")
        late.auth("PUB-11", app_id="app-id-pub")
        early.send("SUBSCRIBE", {"channel": "news.seam"})
        assert early.recv_type("SUBSCRIBED")["data"] == {"channel": "news.seam", "offset": 0}
        thread = threading.Thread(target=publisher)
        thread.start()
        early.recv_until(lambda f: f["type"] == "CHANNEL_MESSAGE" and f["data"]["offset"] >= 10, timeout=30)
        late.send("SUBSCRIBE", {"channel": "news.seam", "since": 0})  # mid-stream: replay, then live
        thread.join(60)

        def offsets(client: WsClient) -> list[int]:
            def written() -> list[int]:
                return [f["data"]["offset"] for f in client.frames if f["type"] == "CHANNEL_MESSAGE"]

            client.collect_frames(lambda got: len(written()) >= total, timeout=30)
            client.recv_all(quiet=1)  # a second copy would arrive here
            return written()

        assert offsets(early) == list(range(1, total + 1))
        assert offsets(late) == list(range(1, total + 1))


def test_an_sse_reader_that_stops_reading_is_cut_off_without_slowing_the_publisher(processes, nodes, pub):
    web = processes.web("web-slow", PUSH_MAX_BUFFER_BYTES="65536")  # the default (minutes-long) lifetime
    sock = socket.create_connection(("127.0.0.1", web.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"GET /sse/messages?channels=news.slow&app=app-id-pub HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.5)
    with SseClient(f"{web.url}/sse/messages?channels=news.slow&app=app-id-pub") as healthy:
        healthy.event()
        got: list[dict] = []
        reader = threading.Thread(target=lambda: got.extend(
            healthy.events_until(lambda e: e.get("id", "").endswith(":250"), limit=600)))
        reader.start()
        big = "x" * 60_000
        started = time.monotonic()
        for _ in range(250):  # 15 MB for a reader that never reads; the node keeps at most 64 KiB of it
            publish(web, pub, "news.slow", big)
        assert time.monotonic() - started < 120  # (60.3 s on a slowed, busy CI machine; blocked would be never)
        reader.join(60)
        # The reader that keeps up got everything, in order, while the other was cut off.
        offsets = [int(e["id"].rpartition(":")[2]) for e in got if e["event"] == "message"]
        assert offsets == list(range(1, 251))

    def cut_off() -> bool:
        with urllib.request.urlopen(f"{web.url}/metrics", timeout=10) as resp:
            return 'switchboard_stream_closed_total{reason="slow_reader",transport="sse"} 1.0' in resp.read().decode()

    wait_for(cut_off, timeout=15)
    sock.close()
