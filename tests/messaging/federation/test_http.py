"""Forwarding over real HTTP: this test process plays domain-01, a real web node plays domain-02
(against the same test database: a copy is keyed by its origin, so it never collides with the
original). The receiving side refuses forged, stale, replayed and unlinked calls before it stores
anything, refuses an over-hop message alone, and stores a genuine call, however large a backlog
made it, before it answers."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from apps_registry.models import DomainLink
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import distribution_create
from foundation import signed_calls
from messaging.core.store import message_send
from messaging.federation import links
from messaging.federation.models import DomainHeard
from messaging.federation.senders.outbox import link_forward
from messaging.federation.wire.transport import FORWARD_PATH, LINK_MISS_REREAD_SECONDS, STANDBY_PATH
from messaging.models import Delivery, Message
from messaging.routing import router
from tests.factories import make_app, make_domain
from tests.processes import ModuleRequest, ProcessFactory

pytestmark = pytest.mark.django_db(transaction=True)

NEAR = "ANZ-1000005"  # homed in domain-02


@pytest.fixture(scope="module")
def domain_02_node(django_db_setup):
    """domain-02's web node, for the module (each test commits its own configuration; the node reads
    it afresh on every call)."""
    factory = ProcessFactory(ModuleRequest("network_http"))
    yield factory.web("domain-02", DOMAIN_NAME="domain-02")
    factory.stop_all()


@pytest.fixture
def domain_02(domain_02_node):
    node = domain_02_node
    links.graph_cache_clear()
    here = make_domain("domain-01")
    there = make_domain("domain-02", urls=[node.url])
    app = make_app(domain=here, range_to=999_999)
    distribution_create(app=app, domain=there, range_from=1_000_000, range_to=None)
    app_snapshots_clear()
    link = DomainLink.objects.create(n1=here, n2=there)
    # The node re-reads a link its cache lacks or holds disabled (an earlier test's) only once its
    # cache is LINK_MISS_REREAD_SECONDS old: this test's link is heard from then on.
    time.sleep(LINK_MISS_REREAD_SECONDS)
    yield {"node": node, "link": link, "app": app}
    app_snapshots_clear()
    links.graph_cache_clear()


def _post(node, payload: dict, *, secret: str, sender: str = "domain-01", timestamp: int | None = None,
          headers: dict | None = None) -> httpx.Response:
    body = json.dumps(payload).encode()
    signed = headers or signed_calls.signed_headers(secret=secret, sender=sender, method="POST", path=FORWARD_PATH,
                                                    body=body, timestamp=timestamp)
    return httpx.post(node.url + FORWARD_PATH, content=body, headers={**signed, "Content-Type": "application/json"},
                      timeout=10)


def _message(path: list[str] | None = None, origin_id: int = 77) -> dict:
    return {"messages": [{
        "app": "ANZ", "sender": "ANZ-17", "kind": "direct", "content": "over http", "reference": "",
        "confirmation_requested": False, "client_message_id": None, "origin_domain": (path or ["domain-01"])[0],
        "origin_message_id": origin_id, "path": path or ["domain-01"], "confirms": "", "recipients": [NEAR]}]}


def test_a_genuine_forwarding_call_is_stored_by_the_next_domain_before_it_answers(domain_02):
    sent = message_send(app_id=domain_02["app"].pk, sender="ANZ-17", recipients=[NEAR], content="hop")
    router.deliveries_route(list(sent.delivery_ids))
    assert Delivery.objects.get(pk=sent.delivery_ids[0]).state == "forwarding"
    assert link_forward(peer="domain-02")["sent"] == 1
    row = Delivery.objects.get(pk=sent.delivery_ids[0])
    copy = Message.objects.get(origin_domain="domain-01", origin_message_id=sent.message_id)
    assert (row.state, row.forward_to, copy.forward_path, copy.content) == ("forwarded", "domain-02", "domain-01", "hop")
    assert Delivery.objects.filter(message=copy, recipient=NEAR).count() == 1


def test_a_forged_or_stale_call_is_refused_and_stores_nothing(domain_02):
    forged = _post(domain_02["node"], _message(), secret="not-the-links-secret")
    assert (forged.status_code, forged.json()) == (403, {"error": "bad signature"})
    stale = _post(domain_02["node"], _message(), secret=domain_02["link"].shared_secret,
                  timestamp=int(time.time()) - 3600)
    assert stale.status_code == 403 and "timestamp outside" in stale.json()["error"]
    assert not Message.objects.filter(origin_message_id=77).exists()


def test_a_replayed_call_is_refused_and_stores_nothing_twice(domain_02):
    secret = domain_02["link"].shared_secret
    body = json.dumps(_message()).encode()
    headers = signed_calls.signed_headers(secret=secret, sender="domain-01", method="POST", path=FORWARD_PATH, body=body)
    first = _post(domain_02["node"], _message(), secret=secret, headers=headers)
    again = _post(domain_02["node"], _message(), secret=secret, headers=headers)
    assert first.json() == {"stored": 1, "duplicates": 0, "receipts": 0, "refused": []}
    assert (again.status_code, again.json()) == (409, {"error": "replayed call (nonce already used)"})
    assert Message.objects.filter(origin_domain="domain-01", origin_message_id=77).count() == 1


def test_a_call_from_an_unlinked_domain_or_over_a_disabled_link_is_refused(domain_02):
    secret = domain_02["link"].shared_secret
    unknown = _post(domain_02["node"], _message(), secret=secret, sender="domain-07")
    assert (unknown.status_code, unknown.json()) == (403, {"error": "not a signed call from a neighbour over an enabled link"})
    DomainLink.objects.update(enabled=False)
    links.graph_cache_clear()
    # Refused from its headers, before its body proves it genuine: it is told no more than a stranger.
    # (Within a second: the node reads its links every second. A call whose header check saw the
    # link still enabled, and whose body check came after the node's re-read, is refused after its
    # signature held, and may hear which link is off: the node is then told again.)
    deadline = time.monotonic() + 10
    while ((disabled := _post(domain_02["node"], _message(), secret=secret)).status_code == 200
           or disabled.json() == {"error": "the link domain-02 - domain-01 is disabled"}):
        assert time.monotonic() < deadline
    assert (disabled.status_code, disabled.json()) == (403, {"error": "not a signed call from a neighbour over an enabled link"})


def test_a_liveness_only_link_takes_the_networks_gossip_and_refuses_messages_and_copies(domain_02):
    node, secret = domain_02["node"], domain_02["link"].shared_secret
    DomainLink.objects.update(liveness_only=True)
    time.sleep(1.2)  # the node reads its links every second
    message = _post(node, _message(), secret=secret)
    assert (message.status_code, message.json()) == (403, {"error": (
        "the link domain-01 - domain-02 carries the network's liveness only: a forwarding call over it may "
        "bring network and presence, not messages")})
    assert not Message.objects.filter(origin_message_id=77).exists()
    # A standby copy is refused from its headers, before its body is read.
    body = b'{"copies": []}'
    headers = signed_calls.signed_headers(secret=secret, sender="domain-01", method="POST", path=STANDBY_PATH, body=body)
    copy = httpx.post(node.url + STANDBY_PATH, content=body, headers={**headers, "Content-Type": "application/json"},
                      timeout=10)
    assert (copy.status_code, copy.json()) == (403, {"error": (
        "the link domain-01 - domain-02 carries the network's liveness only, not /internal/v1/standby")})
    # The gossip round's call is taken: domain-02 has heard domain-01.
    clock = time.time_ns()
    gossip = _post(node, {"presence": [], "network": {"heard": {"domain-01": clock}, "takeovers": []}}, secret=secret)
    assert gossip.status_code == 200, gossip.text
    assert DomainHeard.objects.filter(domain="domain-01").values_list("version", flat=True).get() == clock


def test_an_over_hop_message_is_refused_alone_by_its_index(domain_02):
    path = [f"domain-{i:02d}" for i in range(10, 20)] + ["domain-01"]  # eleven hops to get here
    payload = {"messages": _message(origin_id=76)["messages"] + _message(path=path)["messages"]}
    answer = _post(domain_02["node"], payload, secret=domain_02["link"].shared_secret)
    assert (answer.status_code, answer.json()["refused"]) == (
        200, [{"index": 1, "reason": "hop limit (10) exceeded: 11 hops"}])
    assert not Message.objects.filter(origin_message_id=77).exists()
    assert Message.objects.filter(origin_domain="domain-01", origin_message_id=76).exists()


def test_a_call_larger_than_the_public_apis_body_limit_is_stored_whole(domain_02):
    # What a backlog after an outage sends: calls past Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB),
    # which a neighbour's call may be (the internal endpoints take up to 32 MiB).
    messages = [{**_message(origin_id=1000 + n)["messages"][0], "content": f"{n}:" + "x" * 60_000} for n in range(50)]
    answer = _post(domain_02["node"], {"messages": messages}, secret=domain_02["link"].shared_secret)
    assert (answer.status_code, answer.json()) == (200, {"stored": 50, "duplicates": 0, "receipts": 0, "refused": []})
    assert Message.objects.filter(origin_domain="domain-01", origin_message_id__gte=1000).count() == 50


def test_a_call_between_domains_skips_the_sites_browser_middleware_and_is_still_timed_in_metrics(domain_02):
    node = domain_02["node"]
    answer = _post(node, _message(origin_id=91), secret=domain_02["link"].shared_secret)
    assert answer.json()["stored"] == 1
    # No page headers or cookies (sessions, clickjacking, CSRF): the call is signed, not browsed.
    assert "x-frame-options" not in answer.headers and "set-cookie" not in answer.headers
    page = httpx.get(node.url + "/admin/login/", timeout=10)
    assert page.headers.get("x-frame-options") == "DENY"  # the site itself keeps its middleware
    metrics = httpx.get(node.url + "/metrics", timeout=10).text
    assert 'switchboard_http_request_duration_seconds_count{method="POST",route="network-forward",status="2xx"}' \
        in metrics
