"""The internal endpoints a neighbour calls (POST /internal/v1/publishes and /ping), through Django's
test client as domain-01 of the ring (tests/network.py): only a genuine, fresh, first-time call from
a neighbour over an enabled link is heard."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from foundation import signed_calls
from messaging.channels.models import ChannelMessage
from messaging.federation import flood
from messaging.federation.wire import transport
from messaging.federation.wire.transport import PING_PATH, PUBLISH_PATH

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
    assert (status, answer) == (403, {"error": "not a signed call from a neighbour over an enabled link"})


@pytest.mark.parametrize("path", [PUBLISH_PATH, PING_PATH])
def test_a_call_over_a_disabled_link_is_refused(client, net_ring, path):
    net_ring.disable("domain-01", "domain-02")
    assert call(client, path, {}) == (403, {"error": "the link domain-01 - domain-02 is disabled"})
    # Unsigned, the same call learns nothing of this domain or its links.
    assert call(client, path, {}, secret="guessed") == (403, {"error": "bad signature"})


def test_a_caller_that_is_no_neighbour_hears_no_domain_name(client, net_ring):
    status, answer = call(client, PING_PATH, {}, sender="domain-77", secret="guessed")
    assert status == 403 and "domain-01" not in answer["error"] and "domain-77" not in answer["error"]


def test_a_publish_over_the_hop_limit_is_refused(client, net_ring, settings):
    settings.FORWARD_HOP_LIMIT = 3
    path = ("domain-05", "domain-06", "domain-07", "domain-02")
    status, answer = call(client, PUBLISH_PATH, {"publishes": [publish_item(path=path)]})
    assert status == 422 and "over the hop limit" in answer["error"]
    assert not ChannelMessage.objects.exists()


def test_a_malformed_call_is_refused_with_its_reason(client, net_ring):
    assert call(client, PUBLISH_PATH, {"publishes": "all of them"}) == (400, {
        "error": "publishes must be a non-empty list"})


def test_a_call_larger_than_the_public_apis_body_limit_is_taken_whole(client, net_ring, settings):
    # The public API refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE; a neighbour's call is allowed
    # what the internal endpoints advertise (a backlog after an outage comes in big calls).
    big = "x" * 60_000
    payload = {"publishes": [publish_item(f"{n}{big}", offset=n) for n in range(1, 51)]}
    assert len(json.dumps(payload)) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert call(client, PUBLISH_PATH, payload) == (200, {"stored": 50, "duplicates": 0, "refused": []})
    assert ChannelMessage.objects.count() == 50


def test_a_call_over_the_internal_limit_is_refused_as_json_before_its_body_is_read(client, net_ring, monkeypatch):
    monkeypatch.setattr(transport, "MAX_BODY_BYTES", 1000)
    assert call(client, PUBLISH_PATH, {"publishes": [publish_item("x" * 2000)]}) == (413, {
        "error": "body over 1000 bytes"})
    assert not ChannelMessage.objects.exists()


def test_a_failure_while_storing_a_call_is_answered_as_json_naming_this_domain(client, net_ring, monkeypatch):
    def broken(**_):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(flood, "publishes_accept", broken)
    assert call(client, PUBLISH_PATH, {"publishes": [publish_item()]}) == (500, {
        "error": "domain-01 failed to take the call: RuntimeError"})


def test_a_rotated_link_secret_fails_no_call_while_the_two_ends_switch_apart(client, net_ring, settings):
    link = net_ring.link_of("domain-01", "domain-02")
    old = link.shared_secret
    link.shared_secret = "n" * 43  # domain-01 switches first (an admin edit, or its pull)
    link.save()
    # domain-02 has not pulled yet: it signs with the old secret alone, and domain-01 still hears it.
    assert call(client, PING_PATH, {}, secret=old) == (200, {"domain": "domain-01"})
    assert call(client, PING_PATH, {}, secret="n" * 43) == (200, {"domain": "domain-01"})
    # What domain-01 sends carries both signatures, so domain-02 hears it whichever secret it holds.
    prepared = transport.peer_call_prepare(peer="domain-02", path=PING_PATH, payload={})
    for known in (old, "n" * 43):
        reason, _ = signed_calls.signature_refusal(secret=known, header=prepared.headers[signed_calls.SIGNATURE_HEADER],
                                                   method="POST", path=PING_PATH, body=prepared.body, max_skew=60)
        assert reason is None
    # Once the overlap is over, the old secret is no longer heard nor signed with.
    type(link).objects.filter(pk=link.pk).update(previous_secret_until=timezone.now() - timedelta(seconds=1))
    transport.link_cache_clear()  # either end re-reads its link every LINK_CACHE_SECONDS
    assert call(client, PING_PATH, {}, secret=old) == (403, {"error": "bad signature"})
    prepared = transport.peer_call_prepare(peer="domain-02", path=PING_PATH, payload={})
    assert prepared.headers[signed_calls.SIGNATURE_HEADER].count("v1=") == 1


def test_calls_claiming_thousands_of_made_up_domains_leave_the_link_cache_as_it_was(client, net_ring):
    assert call(client, PING_PATH, {}) == (200, {"domain": "domain-01"})  # a neighbour's call: its links cached
    cached = transport.link_cache_size()
    assert cached == 2  # domain-01's links: to domain-02 and domain-04
    for n in range(3000):  # the Switchboard-Domain header is not signed: anyone may write any name
        made_up = RequestFactory().post(PING_PATH, data=b"{}", content_type="application/json", headers={
            signed_calls.DOMAIN_HEADER: f"made-up-{n}", signed_calls.SIGNATURE_HEADER: "t=1,n=abcdefgh,v1=0"})
        with pytest.raises(transport.PeerRefused):
            transport.peer_request_check(made_up)
    assert transport.link_cache_size() == cached
    assert call(client, PING_PATH, {}) == (200, {"domain": "domain-01"})
