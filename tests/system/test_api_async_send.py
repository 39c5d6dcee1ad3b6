"""POST /api/v1/messages on a real daphne web node is answered on the event loop, through the node's
intake (messaging.api.send_endpoint), and every answer is the one Django's DRF view gives for the
same request: status, body and headers. The DRF view answers here in-process (WSGI), against the
same database and Redis."""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from django.core.handlers.wsgi import WSGIHandler

from apps_registry.models import ClientApp
from apps_registry.services import api_key_create
from messaging.models import IdempotencyKey, Message
from tests.wsclient import WsClient

pytestmark = pytest.mark.system
VARYING = {"date", "server", "content-length", "retry-after"}  # differ between any two answers


@pytest.fixture(scope="module")
def keys(demo_network, django_db_blocker):
    with django_db_blocker.unblock():
        ClientApp.objects.filter(app_name="ANZ").update(api_rate_limit_per_second=1000, api_rate_limit_burst=1000)
        ClientApp.objects.filter(app_name="LIM").update(api_rate_limit_per_second=0.01, api_rate_limit_burst=2)
        return {name: api_key_create(app=demo_network[name], name=f"{name} async")[1] for name in ("anz", "lim")}


@pytest.fixture(scope="module")
def node(module_processes, keys):
    web = module_processes.web("web")
    module_processes.worker("worker")
    return web


@pytest.fixture
def both(node, django_db_blocker):
    """(the node over HTTP, Django's DRF view in-process): two clients of the same API."""
    with django_db_blocker.unblock(), httpx.Client(base_url=node.url, timeout=30) as loop_path, \
            httpx.Client(transport=httpx.WSGITransport(app=WSGIHandler()), base_url="http://testserver") as django:
        yield loop_path, django


def _answer(response: httpx.Response) -> tuple[int, dict, dict]:
    headers = {k.lower(): v for k, v in response.headers.items() if k.lower() not in VARYING}
    body = response.json()
    if "id" in body and body["id"] is not None:
        assert re.fullmatch(r"[1-9][0-9]*", body["id"])
        body = {**body, "id": "<id>"}
    return response.status_code, body, headers


def _path_counts(node) -> dict[str, float]:
    text = httpx.get(f"{node.url}/metrics").text
    return {path: float(value) for path, value in
            re.findall(r'switchboard_api_send_path_total\{path="(\w+)"\} ([0-9.e+]+)', text)}


CASES = [
    pytest.param({"to": "ANZ-4101", "content": "hello", "reference": "r-1"}, {}, id="reliable"),
    pytest.param({"to": ["ANZ-4101", "ANZ-4102", "ANZ-4101"], "content": "hi all"}, {}, id="group"),
    pytest.param({"to": "ANZ-4101", "content": "now", "feature": "FAST"}, {}, id="fast"),
    pytest.param({"to": "ANZ-4101"}, {}, id="no content"),
    pytest.param({"to": "ANZ-4101", "content": "x", "feature": "SLOW"}, {}, id="bad feature"),
    pytest.param({"to": "BNZ-1", "content": "x"}, {}, id="another app's user"),
    pytest.param({"to": "ANZ-4101", "content": "x" * 70_000}, {}, id="content over the app's limit"),
    pytest.param({"to": "ANZ-4101", "content": "x", "from": "ANZ-nobody"}, {}, id="unknown sender"),
    pytest.param([1, 2], {}, id="not an object"),
    pytest.param(b'{"to": "ANZ-4101", "content": ', {}, id="malformed JSON"),
    pytest.param(b'{"to": "ANZ-4101", "content": NaN}', {}, id="NaN"),
    pytest.param({"to": "ANZ-4101", "content": "x"}, {"content-type": "text/plain"}, id="not JSON"),
    pytest.param({"to": "ANZ-4101", "content": "x"}, {"authorization": "Bearer sb_wrong.key"}, id="wrong key"),
    pytest.param({"to": "ANZ-4101", "content": "x"}, {"authorization": "Basic abc"}, id="another scheme"),
    pytest.param({"to": "ANZ-4101", "content": "x"}, {"idempotency-key": "spaced key"}, id="bad idempotency key"),
]


@pytest.mark.parametrize("body,headers", CASES)
def test_each_answer_is_the_one_the_drf_view_gives(both, keys, body, headers):
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
    sent = {"authorization": f"Bearer {keys['anz']}", "content-type": "application/json", **headers}
    answers = [_answer(client.post("/api/v1/messages", content=content, headers=sent)) for client in both]
    assert answers[0] == answers[1]


def test_an_idempotent_send_replays_and_a_reused_key_conflicts_the_same_way(both, keys):
    for n, client in enumerate(both):
        headers = {"authorization": f"Bearer {keys['anz']}", "idempotency-key": f"order-{n}"}
        first = client.post("/api/v1/messages", json={"to": "ANZ-4103", "content": "shipped"}, headers=headers)
        again = client.post("/api/v1/messages", json={"to": "ANZ-4103", "content": "shipped"}, headers=headers)
        other = client.post("/api/v1/messages", json={"to": "ANZ-4103", "content": "other"}, headers=headers)
        assert (first.status_code, again.status_code, other.status_code) == (201, 201, 409)
        assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
        assert other.json()["error"] == "idempotency_key_reused" and f"order-{n}" in other.json()["detail"]
        assert Message.objects.filter(pk=int(first.json()["id"])).count() == 1
        assert IdempotencyKey.objects.get(key=f"order-{n}").response == first.json()
    assert _answer(again)[1:] == _answer(both[0].post(
        "/api/v1/messages", json={"to": "ANZ-4103", "content": "shipped"},
        headers={"authorization": f"Bearer {keys['anz']}", "idempotency-key": "order-0"}))[1:]


def test_a_rate_limited_send_answers_429_with_retry_after_on_both_paths(both, keys):
    headers = {"authorization": f"Bearer {keys['lim']}"}
    answers = [client.post("/api/v1/messages", json={"to": "LIM-1", "content": "x"}, headers=headers)
               for client in (*both, *both)]
    limited = [a for a in answers if a.status_code == 429]
    assert len(limited) >= 2 and {a.json()["error"] for a in limited} == {"rate_limited"}
    assert all(int(a.headers["retry-after"]) >= 1 for a in limited)


def test_sends_are_answered_on_the_event_loop_and_reach_their_recipient(node, keys):
    before = _path_counts(node)
    with WsClient(node.ws_url) as client, httpx.Client(base_url=node.url, timeout=30,
                                                        headers={"authorization": f"Bearer {keys['anz']}"}) as api:
        client.auth("ANZ-4104")
        ids = [api.post("/api/v1/messages", json={"to": "ANZ-4104", "content": f"m{i}"}).json()["id"]
               for i in range(5)]
        # (pushed by two routing threads, in either order: the mailbox's seq is the order)
        got = sorted((client.recv_type("MESSAGE")["data"] for _ in range(5)), key=lambda m: m["seq"])
    assert [m["content"] for m in got] == [f"m{i}" for i in range(5)]
    assert [m["id"] for m in got] == ids
    after = _path_counts(node)
    assert after.get("event_loop", 0) - before.get("event_loop", 0) == 5
    assert after.get("django", 0) == before.get("django", 0)


def test_concurrent_sends_with_keys_are_each_stored_once(node, keys, django_db_blocker):
    """32 clients at once, every send with its own key and each sent twice: one message per key."""
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        with httpx.Client(base_url=node.url, timeout=30, headers={"authorization": f"Bearer {keys['anz']}"}) as api:
            for i in range(10):
                for _ in range(2):
                    r = api.post("/api/v1/messages", json={"to": f"ANZ-{4200 + n}", "content": f"c{n}-{i}"},
                                 headers={"idempotency-key": f"burst-{n}-{i}"})
                    with lock:
                        answers.append((r.status_code, r.json()))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 640 and {status for status, _ in answers} == {201}
    assert len({a["id"] for _, a in answers}) == 320
    with django_db_blocker.unblock():
        assert Message.objects.filter(content__regex=r"^c[0-9]+-[0-9]$").count() == 320
