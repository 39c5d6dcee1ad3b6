"""The internal endpoints a neighbour calls (POST /internal/v1/publishes and /ping), through Django's
test client as domain-01 of the ring (tests/network.py): only a genuine, fresh, first-time call from
a neighbour over an enabled link is heard."""

from __future__ import annotations

import json
import time

import pytest

from foundation import signed_calls
from messaging.channels.models import ChannelMessage
from messaging.network.transport import PING_PATH, PUBLISH_PATH

pytestmark = pytest.mark.django_db


def publish_item(content: str = "hello", *, offset: int = 1, path=("domain-02",)) -> dict:
    return {"app": "ANZ", "channel": "news", "content": content, "publisher": "ANZ-1", "origin_domain": path[0],
            "origin_offset": offset, "path": list(path)}


def call(client, path: str, payload: dict, *, sender: str = "domain-02", secret: str = "secret-domain-01-domain-02",
         headers: dict | None = None, **signing):
    body = json.dumps(payload).encode()
    headers = headers or signed_calls.signed_headers(secret=secret, sender=sender, method="POST", path=path,
                                                     body=body, **signing)
    answer = client.post(path, data=body, content_type="application/json", headers=headers)
    return answer.status_code, answer.json()


def test_a_neighbours_ping_is_answered_with_this_domains_name(client, net_ring):
    assert call(client, PING_PATH, {}) == (200, {"domain": "domain-01"})


def test_a_neighbours_publishes_are_stored_and_counted(client, net_ring):
    status, answer = call(client, PUBLISH_PATH, {"publishes": [publish_item("one"), publish_item("two", offset=2)]})
    assert (status, answer) == (200, {"stored": 2, "duplicates": 0, "refused": []})
    assert list(ChannelMessage.objects.order_by("offset").values_list("content", flat=True)) == ["one", "two"]


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_forged_signature_is_refused(client, net_ring, path):
    assert call(client, path, {"publishes": [publish_item()]}, secret="guessed") == (403, {"error": "bad signature"})
    assert not ChannelMessage.objects.exists()


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_stale_call_is_refused(client, net_ring, path):
    status, answer = call(client, path, {"publishes": [publish_item()]}, timestamp=int(time.time()) - 3600)
    assert status == 403 and "timestamp outside" in answer["error"]


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_replayed_call_is_refused(client, net_ring, path):
    payload = {"publishes": [publish_item()]}
    body = json.dumps(payload).encode()
    headers = signed_calls.signed_headers(secret="secret-domain-01-domain-02", sender="domain-02", method="POST",
                                          path=path, body=body)
    assert call(client, path, payload, headers=headers)[0] == 200
    assert call(client, path, payload, headers=headers) == (409, {"error": "replayed call (nonce already used)"})


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_call_from_a_domain_that_is_not_a_neighbour_is_refused(client, net_ring, path):
    # domain-03 is in the network but not linked to domain-01; its link secret to 02 proves nothing here.
    status, answer = call(client, path, {}, sender="domain-03", secret="secret-domain-02-domain-03")
    assert (status, answer) == (403, {"error": "domain-03 is not linked to domain-01"})


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_call_over_a_disabled_link_is_refused(client, net_ring, path):
    net_ring.disable("domain-01", "domain-02")
    assert call(client, path, {}) == (403, {"error": "the link domain-01 - domain-02 is disabled"})


def test_a_publish_over_the_hop_limit_is_refused(client, net_ring, settings):
    settings.FORWARD_HOP_LIMIT = 3
    path = ("domain-05", "domain-06", "domain-07", "domain-02")
    status, answer = call(client, PUBLISH_PATH, {"publishes": [publish_item(path=path)]})
    assert status == 422 and "over the hop limit" in answer["error"]
    assert not ChannelMessage.objects.exists()


def test_a_malformed_call_is_refused_with_its_reason(client, net_ring):
    assert call(client, PUBLISH_PATH, {"publishes": "all of them"}) == (400, {
        "error": "publishes must be a non-empty list"})
