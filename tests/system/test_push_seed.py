"""The push seed's clients, unchanged, against a real web node whose operator marked one app push
open (docs/protocol.md, "Channel streams"): the seed README's own requests, byte for byte as its
`curl` sends them (no key, no app), and its WebSocket URL as `websocat` opens it."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from apps_registry.models import ClientApp, UserDistribution

pytestmark = pytest.mark.system
CURL = {"User-Agent": "curl/8.5.0", "Accept": "*/*"}  # what curl sends with every request


@pytest.fixture(scope="module")
def node(module_processes, demo_network, django_db_blocker):
    """App PUSH (committed) with push open mode, every channel public; a web node and a worker."""
    with django_db_blocker.unblock():
        app = ClientApp.objects.create(app_name="PUSH", app_id="app-id-push", master_user_id="PUSH-1",
                                       push_open=True, public_channel_patterns=["*"])
        UserDistribution.objects.create(app=app, domain=demo_network["anz"].distributions.first().domain,
                                        range_from=0, range_to=None)
    web = module_processes.web("web")
    module_processes.worker("worker")
    return web


def seed_publish(node, channel: str, message: str) -> httpx.Response:
    """`curl -H 'Content-Type: application/json' --request POST --data '{"channel":…,"message":…}' …/messages`"""
    body = f'{{"channel":"{channel}","message":"{message}"}}'.encode()
    return httpx.post(f"{node.url}/messages", content=body, headers={**CURL, "Content-Type": "application/json"},
                      timeout=10)


def sse_events(lines, count: int) -> list[dict]:
    events, fields = [], {}
    for line in lines:
        if not line:
            if fields:
                events.append(fields)
                fields = {}
            if len(events) == count:
                return events
            continue
        name, _, value = line.partition(":")
        fields[name] = value
    return events


@pytest.mark.django_db
def test_the_seeds_curl_publish_sse_and_websocket_requests_work_unchanged(node):
    # `curl 'http://localhost:8080/sse/messages?channels=xyz,qwerty'`
    with httpx.stream("GET", f"{node.url}/sse/messages?channels=xyz,qwerty", headers=CURL, timeout=15) as sse, \
            connect(f"ws://127.0.0.1:{node.port}/ws/messages?channels=qwerty,xyz", open_timeout=10) as ws:
        assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
        lines = sse.iter_lines()
        assert sse_events(lines, 1) == [{"event": "heartbeat", "data": "{}"}]
        assert json.loads(ws.recv(timeout=10)) == {"event": "ping", "data": {}}

        published = seed_publish(node, "qwerty", "a message to channel qwerty")
        assert (published.status_code, published.json()) == (202, {"subscribers": 2})

        [event] = sse_events(lines, 1)
        assert event["event"] == "message"
        assert json.loads(event["data"]) == {"channel": "qwerty", "message": "a message to channel qwerty"}
        message = json.loads(ws.recv(timeout=10))
        assert message["event"] == "message"
        assert (message["data"]["channel"], message["data"]["message"]) == ("qwerty", "a message to channel qwerty")


@pytest.mark.django_db
def test_a_publish_with_no_subscriber_answers_as_the_seeds_readme_shows(node):
    published = seed_publish(node, "nobody-reads", "hello")
    assert published.status_code == 202 and published.text == '{"subscribers":0}'
